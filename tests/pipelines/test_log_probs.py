"""compute_log_probabilities_ragged."""

import numpy as np
import pytest
import torch

from max.pipelines.lib.log_probabilities import compute_log_probabilities_ragged, log_probabilities_ragged_graph


def test_ragged_with_and_without_echo():
    torch.manual_seed(0)
    V = 10
    offsets = np.array([0, 3, 5])
    tokens = np.array([1, 4, 2, 7, 8])
    logits = torch.randn(5, V)
    next_logits = torch.stack([logits[2], logits[4]])
    sampled = np.array([6, 3])
    out = compute_log_probabilities_ragged(None, None, input_row_offsets=offsets, logits=logits,
                                           next_token_logits=next_logits, tokens=tokens, sampled_tokens=sampled,
                                           batch_top_n=[2, 3], batch_echo=[True, False])
    lp = torch.log_softmax(logits.double(), -1)
    a, b = out
    # echo: rows 0,1 score tokens 4,2; row 2 scores the sampled 6
    np.testing.assert_allclose(a.token_log_probabilities, [lp[0, 4], lp[1, 2], lp[2, 6]], rtol=1e-5)
    assert len(a.top_log_probabilities) == 3
    top = torch.topk(lp[0], 2).indices.tolist()
    assert set(top) <= set(a.top_log_probabilities[0]) and 4 in a.top_log_probabilities[0]
    np.testing.assert_allclose(b.token_log_probabilities, [lp[4, 3]], rtol=1e-5)
    assert len(b.top_log_probabilities[0]) in (3, 4)


def test_top_n_zero_and_errors():
    nl = torch.zeros(2, 4)
    out = compute_log_probabilities_ragged(None, None, input_row_offsets=np.array([0, 1, 2]), logits=None,
                                           next_token_logits=nl, tokens=np.array([0, 1]),
                                           sampled_tokens=np.array([1, 2]), batch_top_n=[0, 1],
                                           batch_echo=[False, False])
    assert out[0] is None and abs(out[1].token_log_probabilities[0] - np.log(0.25)) < 1e-6
    with pytest.raises(ValueError, match="logits are required"):
        compute_log_probabilities_ragged(None, None, input_row_offsets=np.array([0, 1]), logits=None,
                                         next_token_logits=nl[:1], tokens=np.array([0]),
                                         sampled_tokens=np.array([1]), batch_top_n=[1], batch_echo=[True])
    with pytest.raises(ValueError, match="batch items"):
        compute_log_probabilities_ragged(None, None, input_row_offsets=np.array([0, 1]), logits=None,
                                         next_token_logits=nl[:1], tokens=np.array([0]),
                                         sampled_tokens=np.array([1]), batch_top_n=[1, 2], batch_echo=[False])


def test_graph_runs():
    from max import engine
    from max.driver import CPU, Tensor

    g = log_probabilities_ragged_graph(None, levels=3)
    m = engine.InferenceSession(devices=[CPU()]).load(g)
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    (y,) = m.execute(Tensor.from_numpy(x))
    np.testing.assert_allclose(y.to_numpy(), torch.log_softmax(torch.from_numpy(x), -1).numpy(), atol=1e-5)
