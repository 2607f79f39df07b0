"""max.nn.lora.lora_delta_add (the LoRA projections' per-token update) vs float64 numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from max.dtype import DType
from max.nn.lora import lora_delta_add
from support import run1, tt

F32 = DType.float32


def _types(t, din, dout, w):
    return [tt(F32, [t, dout]), tt(F32, [t, din]), tt(F32, [t, w]), tt(F32, [din, w]), tt(F32, [w, dout])]


@settings(max_examples=15, deadline=None)
@given(t=st.integers(1, 6), din=st.integers(1, 9), dout=st.integers(1, 9), slots=st.integers(1, 3),
       rank=st.integers(1, 4), seed=st.integers(0, 2**31 - 1), any_adapter=st.booleans())
def test_matches_float64_and_skips_adapter_free_steps(t, din, dout, slots, rank, seed, any_adapter):
    rng = np.random.default_rng(seed)
    w = slots * rank
    y, x = rng.standard_normal((t, dout)), rng.standard_normal((t, din))
    a, b = rng.standard_normal((din, w)), rng.standard_normal((w, dout))
    mask = np.zeros((t, w))
    if any_adapter:  # each token uses one slot or none (at least one token uses one)
        for i, s in enumerate(rng.integers(-1, slots, t)):
            if s >= 0 or i == 0:
                s = max(s, 0)
                mask[i, s * rank:(s + 1) * rank] = 1.0
    arrs = [v.astype(np.float32) for v in (y, x, mask, a, b)]
    got = run1(lambda *v: lora_delta_add(*v), _types(t, din, dout, w), *arrs)
    want = arrs[0].astype(np.float64) + ((arrs[1].astype(np.float64) @ arrs[3]) * mask) @ arrs[4]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if not any_adapter:
        np.testing.assert_array_equal(got, arrs[0])


def test_bad_shapes_fail_at_build_time():
    from max.graph import Graph

    with pytest.raises(ValueError, match="lora_delta_add.*shapes do not fit"):
        Graph("bad", lambda *v: lora_delta_add(*v), input_types=[tt(F32, [2, 5]), tt(F32, [2, 4]), tt(F32, [2, 3]),
                                                                 tt(F32, [4, 3]), tt(F32, [3, 6])])
    with pytest.raises(TypeError, match="lora_delta_add.*share one dtype"):
        Graph("bad", lambda *v: lora_delta_add(*v), input_types=[tt(F32, [2, 5]), tt(F32, [2, 4]),
                                                                 tt(DType.float64, [2, 3]), tt(F32, [4, 3]),
                                                                 tt(F32, [3, 5])])
