"""TextContext index semantics and lifecycle."""

import numpy as np
import pytest

from max.interfaces import GenerationStatus, InputContext, LogProbabilities, SamplingParams
from max.nn.kv_cache import KVCacheAwareContext
from max.pipelines import TextContext
from max.pipelines.core import TextAndVisionContext


def ctx(n=5, max_length=20, **kw):
    return TextContext(max_length=max_length, tokens=np.arange(1, n + 1), **kw)


def test_initial_indices():
    c = ctx()
    assert (c.start_idx, c.active_idx, c.end_idx) == (0, 5, 5)
    np.testing.assert_array_equal(c.next_tokens, [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(c.prompt_tokens, [1, 2, 3, 4, 5])
    assert c.active_length == 5 and c.current_length == 5
    assert c.needs_ce and c.is_initial_prompt and not c.is_done
    assert len(c.generated_tokens) == 0 and len(c.tokens) >= 128
    assert isinstance(c, KVCacheAwareContext)
    with pytest.raises(ValueError, match="no tokens have been generated"):
        c.last_generated_token


def test_update_moves_window():
    c = ctx()
    c.update(42)
    # (before any token, ``last_generated_token`` raises, which Python 3.11's
    # runtime-checkable isinstance does not tolerate; after one it holds)
    assert isinstance(c, InputContext)
    assert (c.start_idx, c.active_idx, c.end_idx) == (5, 6, 6)
    np.testing.assert_array_equal(c.next_tokens, [42])
    assert c.active_length == 1 and not c.needs_ce and not c.is_initial_prompt
    assert c.last_generated_token == 42
    c.update(43)
    np.testing.assert_array_equal(c.generated_tokens, [42, 43])
    np.testing.assert_array_equal(c.all_tokens, [1, 2, 3, 4, 5, 42, 43])


def test_chunked_prefill_indices():
    c = ctx(n=10)
    c.set_token_indices(active_idx=4)  # first chunk of 4
    np.testing.assert_array_equal(c.next_tokens, [1, 2, 3, 4])
    assert c.end_idx == 10 and c.needs_ce
    c.bump_token_indices(start_idx=4, active_idx=4)
    np.testing.assert_array_equal(c.next_tokens, [5, 6, 7, 8])
    c.bump_token_indices(start_idx=4, active_idx=2)
    np.testing.assert_array_equal(c.next_tokens, [9, 10])
    with pytest.raises(ValueError, match="invalid token indices"):
        c.bump_token_indices(active_idx=5)  # past end_idx
    with pytest.raises(ValueError, match="invalid token indices"):
        c.set_token_indices(start_idx=11)


def test_eos_and_max_length_status():
    c = ctx(eos_token_ids={99})
    c.update(7)
    assert c.status is GenerationStatus.ACTIVE
    c.update(99)
    assert c.status is GenerationStatus.END_OF_SEQUENCE and c.is_done
    c = ctx(eos_token_ids={99}, ignore_eos=True, max_length=7)
    c.update(99)
    assert c.status is GenerationStatus.ACTIVE
    c.update(99)
    assert c.status is GenerationStatus.MAXIMUM_LENGTH
    c = ctx(eos_sequences=[[8, 9]])
    c.update(8)
    assert not c.is_done
    c.update(9)
    assert c.status is GenerationStatus.END_OF_SEQUENCE


def test_growth_past_chunk():
    c = TextContext(max_length=1000, tokens=np.arange(127) + 1)
    for t in range(300):
        c.update(t)
    assert c.end_idx == 427 and len(c.tokens) >= 427
    np.testing.assert_array_equal(c.generated_tokens[-3:], [297, 298, 299])


def test_jump_ahead_and_reset():
    c = ctx()
    c.update(10)
    c.jump_ahead(11)
    assert (c.start_idx, c.active_idx, c.end_idx) == (5, 7, 7)
    np.testing.assert_array_equal(c.next_tokens, [10, 11])
    out = c.to_generation_output()
    assert out.tokens == [10, 11]
    assert c.to_generation_output().tokens == []
    c.reset()
    assert (c.start_idx, c.active_idx, c.end_idx) == (0, 7, 7)
    assert c.active_length == 7 and c.is_initial_prompt
    assert c.to_generation_output().tokens == []  # already returned tokens are not repeated


def test_num_available_steps():
    c = ctx(n=10)
    assert c.compute_num_available_steps(20) == 20
    c.update(1)
    assert c.compute_num_available_steps(20) == 10


def test_min_token_mask():
    c = ctx(eos_token_ids={2, 7}, sampling_params=SamplingParams(min_new_tokens=2))
    assert c.min_tokens == 2
    masks = c.get_min_token_logit_mask(3)
    assert [m.tolist() for m in masks] == [[[0, 2], [0, 7]], [[0, 2], [0, 7]], []]
    assert masks[2].shape == (0, 2) and masks[0].dtype == np.int32
    c.update(5)
    c.update(6)
    assert c.get_min_token_logit_mask(1)[0].shape == (0, 2)


def test_log_probabilities_storage():
    c = ctx(log_probabilities=2)
    lp = LogProbabilities([-0.1], [{3: -0.1, 4: -2.0}])
    c.update(3, lp)
    c.update(4)
    out = c.to_generation_output()
    assert out.tokens == [3, 4] and out.log_probabilities == [lp]
    assert out.final_status is GenerationStatus.ACTIVE


def test_validation():
    with pytest.raises(ValueError, match="at least one token"):
        TextContext(max_length=5, tokens=np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match="longer than max_length"):
        ctx(n=5, max_length=3)
    with pytest.raises(ValueError, match="min_new_tokens"):
        ctx(n=5, max_length=6, sampling_params=SamplingParams(min_new_tokens=3))
    a, b = ctx(), ctx()
    assert a.request_id != b.request_id


def test_text_and_vision_context():
    c = TextAndVisionContext(max_length=10, tokens=np.array([1, 2]), pixel_values=(np.zeros((3, 2, 2)),))
    assert c.needs_vision_encoding
    c.update(3)
    assert not c.needs_vision_encoding
    c.reset()
    assert c.needs_vision_encoding
