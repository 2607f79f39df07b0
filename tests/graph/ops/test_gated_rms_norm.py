"""gated_rms_norm against a float64 numpy reference (gate before or after the norm, channel groups, no gate,
row-strided inputs), in the graph and in every native ISA variant; build-time errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, ops
from support import session, isa_params

CPU = DeviceRef.CPU()


def ref(x, z, w, eps, groups, before):
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    g = None if z is None else np.asarray(z, np.float64) / (1 + np.exp(-np.asarray(z, np.float64)))
    h = x * g if g is not None and not before else x
    hg = h.reshape(*h.shape[:-1], groups, -1)
    y = (hg / np.sqrt((hg * hg).mean(-1, keepdims=True) + eps)).reshape(x.shape) * w
    return y * g if g is not None and before else y


@settings(deadline=None, max_examples=30)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_gated_rms_norm_matches_reference(data, seed):
    rng = np.random.default_rng(seed)
    groups = data.draw(st.integers(1, 3))
    D = groups * data.draw(st.integers(1, 20))
    lead = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))
    has_gate, before = data.draw(st.booleans()), data.draw(st.booleans())
    eps = data.draw(st.sampled_from([1e-6, 1e-5, 0.1]))
    x = rng.standard_normal((*lead, D)).astype(np.float32)
    z = (rng.standard_normal((*lead, D)) * 4).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32)
    types = [TensorType(DType.float32, [*lead, D], CPU), TensorType(DType.float32, [D], CPU)]
    if has_gate:
        types.append(TensorType(DType.float32, [*lead, D], CPU))
    with Graph("gated_rms_norm", input_types=types) as g:
        xv, wv, *zv = (v.tensor for v in g.inputs)
        g.output(ops.gated_rms_norm(xv, zv[0] if zv else None, wv, eps, groups, before))
    arrays = [x, w] + ([z] if has_gate else [])
    (out,) = session().load(g).execute(*[Buffer.from_numpy(a) for a in arrays])
    np.testing.assert_allclose(out.to_numpy(), ref(x, z if has_gate else None, w, eps, groups, before),
                               rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("isa", isa_params())
@settings(deadline=None, max_examples=15)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_native_gated_rmsnorm_matches_reference(isa, data, seed):
    """lmx_gated_rmsnorm over row-strided x and z (column slices), widths around the vector sizes."""
    from max.engine import native

    so = native.lib(isa)
    rng = np.random.default_rng(seed)
    M, groups = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 3))
    D = groups * data.draw(st.integers(1, 24))
    pad, has_gate, before = data.draw(st.integers(0, 3)), data.draw(st.booleans()), data.draw(st.booleans())
    wide = rng.standard_normal((M, 2 * D + pad)).astype(np.float32)
    wide[:, D:2 * D] *= 30  # z: SiLU's saturation both ways
    w = rng.standard_normal(D).astype(np.float32)
    out = np.empty((M, D), np.float32)
    W, base = wide.shape[1], wide.ctypes.data
    so.lmx_gated_rmsnorm(base, M, D, W, base + 4 * D if has_gate else None, W, w.ctypes.data, groups, 1e-5,
                         int(before), out.ctypes.data)
    r = ref(wide[:, :D], wide[:, D:2 * D] if has_gate else None, w, 1e-5, groups, before)
    np.testing.assert_allclose(out, r, rtol=2e-5, atol=2e-5)


def test_build_time_errors():
    f32 = DType.float32

    def build(types, fn):
        with Graph("e", input_types=types) as g:
            fn(*(v.tensor for v in g.inputs))

    with pytest.raises(TypeError, match="input must be float32"):
        build([TensorType(DType.float64, [2, 4], CPU), TensorType(f32, [4], CPU)],
              lambda x, w: ops.gated_rms_norm(x, None, w, 1e-5))
    with pytest.raises(ValueError, match="divisible by num_groups=3"):
        build([TensorType(f32, [2, 4], CPU), TensorType(f32, [4], CPU)],
              lambda x, w: ops.gated_rms_norm(x, None, w, 1e-5, 3))
    with pytest.raises(ValueError, match="gate shape"):
        build([TensorType(f32, [2, 4], CPU), TensorType(f32, [4], CPU), TensorType(f32, [3, 4], CPU)],
              lambda x, w, z: ops.gated_rms_norm(x, z, w, 1e-5))
    with pytest.raises(ValueError, match="weight has shape"):
        build([TensorType(f32, [2, 4], CPU), TensorType(f32, [5], CPU)],
              lambda x, w: ops.gated_rms_norm(x, None, w, 1e-5))


def test_torch_path_matches_reference(monkeypatch):
    """Without the native library (or off the CPU) the kernel computes in torch: the same results."""
    import torch

    from max.engine import native
    from max.engine.kernels import norm

    monkeypatch.setattr(native, "lib", lambda *a: None)
    rng = np.random.default_rng(5)
    x, z = rng.standard_normal((3, 2, 12)).astype(np.float32), rng.standard_normal((3, 2, 12)).astype(np.float32)
    w = rng.standard_normal(12).astype(np.float32)
    for before in (False, True):
        for gate in ((torch.from_numpy(z),), ()):
            y = norm.gated_rms_norm(torch.from_numpy(x), torch.from_numpy(w), *gate, epsilon=1e-5, num_groups=2,
                                    norm_before_gate=before, has_gate=bool(gate))
            np.testing.assert_allclose(y.numpy(), ref(x, z if gate else None, w, 1e-5, 2, before), rtol=2e-5,
                                       atol=2e-5)
