"""Issue 25's remaining behaviour items (round 2): ``fold`` with symbolic kernel sizes, the op type rules
the MAX op pages state (reductions, bool arithmetic, ``where``, scatter/gather indices), ``Tensor.from_dim``,
and how ``Dim`` / ``Tensor`` / ``experimental.nn`` modules print.  Each docstring names the MAX page it
follows; where the page is silent the test pins libremax's current behaviour and says so."""

from __future__ import annotations

import numpy as np
import pytest

from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, Dim, Graph, StaticDim, TensorType, ops

C = DeviceRef.CPU()


def _col2im(x: np.ndarray, out_hw, k, stride=(1, 1), dilation=(1, 1), padding=(0, 0)) -> np.ndarray:
    """Independent float64 fold reference: every column of ``x`` adds its kh*kw patch into the output."""
    n, ckk, _ = x.shape
    kh, kw = k
    c = ckk // (kh * kw)
    hp, wp = out_hw[0] + 2 * padding[0], out_hw[1] + 2 * padding[1]
    out = np.zeros((n, c, hp, wp))
    bh = (hp - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    bw = (wp - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    cols = x.astype(np.float64).reshape(n, c, kh, kw, bh, bw)
    for i in range(kh):
        for j in range(kw):
            for bi in range(bh):
                for bj in range(bw):
                    out[:, :, bi * stride[0] + i * dilation[0], bj * stride[1] + j * dilation[1]] += cols[:, :, i, j, bi, bj]
    return out[:, :, padding[0]:padding[0] + out_hw[0], padding[1]:padding[1] + out_hw[1]]


def _run(g: Graph, *arrays: np.ndarray) -> list[np.ndarray]:
    from max.engine import InferenceSession

    model = InferenceSession().load(g)
    return [r.to_numpy() for r in model.execute(*(Buffer.from_numpy(a) for a in arrays))]


def test_fold_with_symbolic_kernel_sizes():
    """https://docs.modular.com/max/api/python/graph.ops/ (``fold``) -- ``kernel_size`` is a pair of
    ``int | str | Dim``, so it may be symbolic: the channel dim is then ``input.shape[1] // (kh * kw)``
    and the sizes are checked when the graph runs.  Values against a float64 numpy col2im."""
    in_types = [TensorType(DType.float32, [1, "ckk", "l"], C), TensorType(DType.float32, ["kh", "kw"], C)]
    with Graph("fold_sym", input_types=in_types) as g:
        x, kern = (v.tensor for v in g.inputs)
        y = ops.fold(x, (4, 5), (kern.shape[0], Dim("kw")), stride=(1, 2), padding=(1, 0))
        assert not isinstance(y.shape[1], StaticDim)  # ckk // (kh * kw)
        assert y.shape[1].evaluate({"ckk": 12, "kh": 2, "kw": 3}) == 2
        assert [int(d) for d in y.shape[2:]] == [4, 5]
        g.output(y)
    rng = np.random.default_rng(0)
    for kh, kw, c in ((2, 3, 2), (3, 1, 1)):
        bh, bw = (4 + 2 - (kh - 1) - 1) // 1 + 1, (5 - (kw - 1) - 1) // 2 + 1
        x = rng.standard_normal((1, c * kh * kw, bh * bw)).astype(np.float32)
        (out,) = _run(g, x, np.zeros((kh, kw), np.float32))
        assert out.shape == (1, c, 4, 5)
        np.testing.assert_allclose(out, _col2im(x, (4, 5), (kh, kw), (1, 2), (1, 1), (1, 0)), rtol=1e-5, atol=1e-5)
    # the run-time checks: L that does not match, a dim 1 that is no multiple of kh * kw
    with pytest.raises(Exception, match="blocks"):
        _run(g, np.zeros((1, 6, 7), np.float32), np.zeros((2, 3), np.float32))
    with pytest.raises(Exception, match="multiple of the kernel size product"):
        _run(g, np.zeros((1, 7, 15), np.float32), np.zeros((2, 3), np.float32))
