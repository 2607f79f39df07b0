"""max.experimental.functional: every function, eagerly on Tensors against
numpy/torch references, inside a Graph (same op as graph.ops), lazily, and
with errors raised at the call."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.experimental import functional as F
from max.experimental import tensor as T
from max.experimental.tensor import Tensor
from max.graph import DeviceRef, Dim, Graph, TensorType, ops

CPU_ = CPU()


def c(a, dt=None):
    a = np.asarray(a)
    if dt is None:
        dt = DType.from_numpy(a.dtype) if a.dtype != np.float64 else DType.float32
    return Tensor.constant(a, dtype=dt, device=CPU_)


def npy(t):
    return np.asarray(t)


rng = np.random.default_rng(0)
A = rng.standard_normal((3, 4)).astype(np.float32)
B = rng.standard_normal((3, 4)).astype(np.float32)
P = (np.abs(A) + 0.5).astype(np.float32)
U = (rng.uniform(-0.9, 0.9, (3, 4))).astype(np.float32)
I = np.array([[3, -1, 4], [1, 5, -9]], np.int64)
M = np.array([[True, False, True], [False, False, True]])
N = np.array([[False, True, True], [False, True, False]])


def _erf(a):
    return np.vectorize(math.erf)(a.astype(np.float64))


def _gelu(a):
    return 0.5 * a * (1 + _erf(a / math.sqrt(2)))


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# name -> (call on Tensors, numpy reference on arrays)
CASES = {
    "abs": (lambda: F.abs(c(A)), lambda: np.abs(A)),
    "add": (lambda: F.add(c(A), c(B)), lambda: A + B),
    "argmax": (lambda: F.argmax(c(A)), lambda: A.argmax(-1)[:, None]),
    "argmin": (lambda: F.argmin(c(A), axis=0), lambda: A.argmin(0)[None, :]),
    "argsort": (lambda: F.argsort(c(A[0])), lambda: np.argsort(A[0], kind="stable")),
    "as_interleaved_complex": (lambda: F.as_interleaved_complex(c(A)), lambda: A.reshape(3, 2, 2)),
    "atanh": (lambda: F.atanh(c(U)), lambda: np.arctanh(U)),
    "avg_pool2d": (lambda: F.avg_pool2d(c(A.reshape(1, 3, 4, 1)), (2, 2)),
                   lambda: torch.nn.functional.avg_pool2d(torch.from_numpy(A).reshape(1, 1, 3, 4), 2, 1)
                   .permute(0, 2, 3, 1).numpy()),
    "band_part": (lambda: F.band_part(c(A), 1, 0), lambda: np.tril(np.triu(A, -1), 0)),
    "broadcast_to": (lambda: F.broadcast_to(c(A[0]), [2, 4]), lambda: np.broadcast_to(A[0], (2, 4))),
    "cast": (lambda: F.cast(c(A), DType.int32), lambda: A.astype(np.int32)),
    "chunk": (lambda: F.chunk(c(A), 2, axis=1), lambda: np.split(A, 2, axis=1)),
    "concat": (lambda: F.concat([c(A), c(B)], axis=0), lambda: np.concatenate([A, B])),
    "constant": (lambda: F.constant(A, DType.float32, CPU_), lambda: A),
    "conv2d": (lambda: F.conv2d(c(A.reshape(1, 3, 4, 1)), c(B[:2, :2].reshape(2, 2, 1, 1))),
               lambda: torch.nn.functional.conv2d(torch.from_numpy(A).reshape(1, 1, 3, 4),
                                                  torch.from_numpy(B[:2, :2].copy()).reshape(1, 1, 2, 2))
               .permute(0, 2, 3, 1).numpy()),
    "conv2d_transpose": (
        lambda: F.conv2d_transpose(c(A.reshape(1, 3, 4, 1)), c(B[:2, :2].reshape(2, 2, 1, 1))),
        lambda: torch.nn.functional.conv_transpose2d(torch.from_numpy(A).reshape(1, 1, 3, 4),
                                                     torch.from_numpy(B[:2, :2].copy()).reshape(1, 1, 2, 2))
        .permute(0, 2, 3, 1).numpy()),
    "conv3d": (lambda: F.conv3d(c(np.ones((1, 2, 3, 4, 1), np.float32)), c(np.ones((1, 2, 2, 1, 1), np.float32))),
               lambda: np.full((1, 2, 2, 3, 1), 4.0, np.float32)),
    "cos": (lambda: F.cos(c(A)), lambda: np.cos(A)),
    "cumsum": (lambda: F.cumsum(c(A)), lambda: np.cumsum(A, -1)),
    "div": (lambda: F.div(c(A), c(P)), lambda: A / P),
    "equal": (lambda: F.equal(c(I), c(np.abs(I))), lambda: I == np.abs(I)),
    "erf": (lambda: F.erf(c(A)), lambda: _erf(A)),
    "exp": (lambda: F.exp(c(A)), lambda: np.exp(A)),
    "flatten": (lambda: F.flatten(c(A)), lambda: A.reshape(-1)),
    "floor": (lambda: F.floor(c(A)), lambda: np.floor(A)),
    "fold": (lambda: F.fold(c(np.ones((1, 4, 9), np.float32)), (4, 4), (2, 2)),
             lambda: torch.nn.functional.fold(torch.ones(1, 4, 9), (4, 4), (2, 2)).numpy()),
    "gather": (lambda: F.gather(c(A), c(np.array([2, 0], np.int64)), axis=0), lambda: A[[2, 0]]),
    "gather_nd": (lambda: F.gather_nd(c(A), c(np.array([[0, 1], [2, 3]], np.int64))), lambda: A[[0, 2], [1, 3]]),
    "gelu": (lambda: F.gelu(c(A)), lambda: _gelu(A)),
    "greater": (lambda: F.greater(c(A), c(B)), lambda: A > B),
    "greater_equal": (lambda: F.greater_equal(c(I), 1), lambda: I >= 1),
    "hann_window": (lambda: F.hann_window(5, DeviceRef.CPU()),
                    lambda: torch.hann_window(5, periodic=True, dtype=torch.float64).numpy()),
    "irfft": (lambda: F.irfft(c(A), n=6), lambda: np.fft.irfft(A.astype(np.float64), n=6)),
    "is_inf": (lambda: F.is_inf(c(np.array([1.0, np.inf, -np.inf, np.nan], np.float32))),
               lambda: np.array([False, True, True, False])),
    "is_nan": (lambda: F.is_nan(c(np.array([1.0, np.inf, np.nan], np.float32))), lambda: np.array([False, False, True])),
    "layer_norm": (lambda: F.layer_norm(c(A), c(np.ones(4, np.float32)), c(np.zeros(4, np.float32)), 1e-5),
                   lambda: (A - A.mean(-1, keepdims=True)) / np.sqrt(A.var(-1, keepdims=True) + 1e-5)),
    "log": (lambda: F.log(c(P)), lambda: np.log(P)),
    "log1p": (lambda: F.log1p(c(P)), lambda: np.log1p(P)),
    "logical_and": (lambda: F.logical_and(c(M), c(N)), lambda: M & N),
    "logical_not": (lambda: F.logical_not(c(M)), lambda: ~M),
    "logical_or": (lambda: F.logical_or(c(M), c(N)), lambda: M | N),
    "logical_xor": (lambda: F.logical_xor(c(M), c(N)), lambda: M ^ N),
    "logsoftmax": (lambda: F.logsoftmax(c(A)), lambda: np.log(_softmax(A.astype(np.float64)))),
    "masked_scatter": (lambda: F.masked_scatter(c(np.zeros(4, np.float32)), c(np.array([1, 0, 1, 0], bool)),
                                                c(np.array([5.0, 6.0], np.float32)), 2),
                       lambda: np.array([5.0, 0, 6.0, 0])),
    "matmul": (lambda: F.matmul(c(A), c(B.T)), lambda: A @ B.T),
    "max": (lambda: F.max(c(A), c(B)), lambda: np.maximum(A, B)),
    "max_pool2d": (lambda: F.max_pool2d(c(A.reshape(1, 3, 4, 1)), (2, 2)),
                   lambda: torch.nn.functional.max_pool2d(torch.from_numpy(A).reshape(1, 1, 3, 4), 2, 1)
                   .permute(0, 2, 3, 1).numpy()),
    "mean": (lambda: F.mean(c(A)), lambda: A.mean(-1, keepdims=True)),
    "min": (lambda: F.min(c(A), axis=0), lambda: A.min(0, keepdims=True)),
    "mod": (lambda: F.mod(c(I), 4), lambda: np.mod(I, 4)),
    "mul": (lambda: F.mul(c(A), 3.0), lambda: A * 3),
    "negate": (lambda: F.negate(c(A)), lambda: -A),
    "nonzero": (lambda: F.nonzero(c(M), "nnz"), lambda: np.argwhere(M)),
    "not_equal": (lambda: F.not_equal(c(I), 1), lambda: I != 1),
    "outer": (lambda: F.outer(c(A[0]), c(B[0])), lambda: np.outer(A[0], B[0])),
    "pad": (lambda: F.pad(c(A), [1, 0, 0, 2]), lambda: np.pad(A, ((1, 0), (0, 2)))),
    "permute": (lambda: F.permute(c(A.reshape(3, 2, 2)), [2, 0, 1]), lambda: A.reshape(3, 2, 2).transpose(2, 0, 1)),
    "pow": (lambda: F.pow(c(P), 2.0), lambda: P**2),
    # MAX 26.7's length is (stop - start) // step (max-behaviours.md B11.2)
    "range": (lambda: F.range(0, 10, 3, dtype=DType.int64, device=CPU_), lambda: np.arange(0, 10, 3)[:10 // 3]),
    "relu": (lambda: F.relu(c(A)), lambda: np.maximum(A, 0)),
    "repeat_interleave": (lambda: F.repeat_interleave(c(A[0]), 2), lambda: np.repeat(A[0], 2)),
    "reshape": (lambda: F.reshape(c(A), [2, -1]), lambda: A.reshape(2, -1)),
    "round": (lambda: F.round(c(A * 3)), lambda: np.round(A * 3)),
    "rsqrt": (lambda: F.rsqrt(c(P)), lambda: 1 / np.sqrt(P)),
    "scatter": (lambda: F.scatter(c(np.zeros((3, 2), np.float32)), c(np.ones((1, 2), np.float32)),
                                  c(np.array([[2, 0]], np.int64)), axis=0),
                lambda: np.array([[0, 1], [0, 0], [1, 0]], np.float32)),
    "scatter_nd": (lambda: F.scatter_nd(c(np.zeros(4, np.float32)), c(np.array([7.0], np.float32)),
                                        c(np.array([[2]], np.int64))),
                   lambda: np.array([0, 0, 7.0, 0])),
    "sigmoid": (lambda: F.sigmoid(c(A)), lambda: 1 / (1 + np.exp(-A))),
    "silu": (lambda: F.silu(c(A)), lambda: A / (1 + np.exp(-A))),
    "sin": (lambda: F.sin(c(A)), lambda: np.sin(A)),
    "slice_tensor": (lambda: F.slice_tensor(c(A), (slice(None, None, -1), 1)), lambda: A[::-1, 1]),
    "softmax": (lambda: F.softmax(c(A)), lambda: _softmax(A.astype(np.float64))),
    "split": (lambda: F.split(c(A), [1, 3], axis=1), lambda: np.split(A, [1], axis=1)),
    "sqrt": (lambda: F.sqrt(c(P)), lambda: np.sqrt(P)),
    "squeeze": (lambda: F.squeeze(c(A[:, :1]), 1), lambda: A[:, 0]),
    "stack": (lambda: F.stack([c(A), c(B)], axis=1), lambda: np.stack([A, B], 1)),
    "sub": (lambda: F.sub(1, c(A)), lambda: 1 - A),
    "sum": (lambda: F.sum(c(A), axis=0), lambda: A.sum(0, keepdims=True)),
    "tanh": (lambda: F.tanh(c(A)), lambda: np.tanh(A)),
    "tile": (lambda: F.tile(c(A), [2, 1]), lambda: np.tile(A, (2, 1))),
    "top_k": (lambda: F.top_k(c(A), 2), lambda: (-np.sort(-A, -1)[:, :2], np.argsort(-A, -1, kind="stable")[:, :2])),
    "transfer_to": (lambda: F.transfer_to(c(A), CPU_), lambda: A),
    "transpose": (lambda: F.transpose(c(A), 0, 1), lambda: A.T),
    "trunc": (lambda: F.trunc(c(A * 3)), lambda: np.trunc(A * 3)),
    "unsqueeze": (lambda: F.unsqueeze(c(A), -1), lambda: A[..., None]),
    "where": (lambda: F.where(c(M), c(I), 0), lambda: np.where(M, I, 0)),
}

_IDX = np.array([[0, 2, 1, 0], [2, 0, 0, 1], [1, 1, 2, 2]], np.int64)
_ND = np.array([[0, 1], [2, 3], [0, 1]], np.int64)
CASES.update({
    "acos": (lambda: F.acos(c(U)), lambda: np.arccos(U)),
    "ceil": (lambda: F.ceil(c(A * 3)), lambda: np.ceil(A * 3)),
    "floor_div": (lambda: F.floor_div(c(I), c(np.array([2, -3, 4], np.int64))),
                  lambda: I // np.array([2, -3, 4])),
    "prod": (lambda: F.prod(c(A), 1), lambda: A.prod(1, keepdims=True)),
    "bottom_k": (lambda: F.bottom_k(c(A), 2), lambda: (np.sort(A, -1)[:, :2], np.argsort(A, -1, kind="stable")[:, :2])),
    "scatter_add": (lambda: F.scatter_add(c(A), c(B), c(_IDX), axis=0),
                    lambda: _scatter_ref(A, B, _IDX, np.add)),
    "scatter_max": (lambda: F.scatter_max(c(A), c(B), c(_IDX), axis=0),
                    lambda: _scatter_ref(A, B, _IDX, np.maximum)),
    "scatter_min": (lambda: F.scatter_min(c(A), c(B), c(_IDX), axis=0),
                    lambda: _scatter_ref(A, B, _IDX, np.minimum)),
    "scatter_mul": (lambda: F.scatter_mul(c(A), c(B), c(_IDX), axis=0),
                    lambda: _scatter_ref(A, B, _IDX, np.multiply)),
    "scatter_nd_add": (lambda: F.scatter_nd_add(c(A), c(np.ones(3, np.float32)), c(_ND)),
                       lambda: _scatter_nd_ref(A, np.ones(3), _ND, np.add)),
    "scatter_nd_max": (lambda: F.scatter_nd_max(c(A), c(np.ones(3, np.float32)), c(_ND)),
                       lambda: _scatter_nd_ref(A, np.ones(3), _ND, np.maximum)),
    "scatter_nd_min": (lambda: F.scatter_nd_min(c(A), c(np.ones(3, np.float32)), c(_ND)),
                       lambda: _scatter_nd_ref(A, np.ones(3), _ND, np.minimum)),
    "scatter_nd_mul": (lambda: F.scatter_nd_mul(c(A), c(np.full(3, 2, np.float32)), c(_ND)),
                       lambda: _scatter_nd_ref(A, np.full(3, 2.0), _ND, np.multiply)),
    "rms_norm": (lambda: F.rms_norm(c(A), c(P[0]), 1e-6),
                 lambda: A / np.sqrt((A.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * P[0]),
    "group_norm": (lambda: F.group_norm(c(A.reshape(1, 3, 4)), c(P[:, 0]), c(U[:, 0]), 3, 1e-5),
                   lambda: torch.nn.functional.group_norm(torch.from_numpy(A.reshape(1, 3, 4)).double(), 3,
                                                          torch.from_numpy(P[:, 0]).double(),
                                                          torch.from_numpy(U[:, 0]).double(), 1e-5).numpy()),
    "resize_linear": (lambda: F.resize_linear(c(A.reshape(1, 1, 3, 4)), (1, 1, 5, 2)),
                      lambda: torch.nn.functional.interpolate(torch.from_numpy(A.reshape(1, 1, 3, 4)).double(),
                                                              size=(5, 2), mode="bilinear").numpy()),
    "resize_nearest": (lambda: F.resize_nearest(c(A), (6, 2), "asymmetric", "floor"),
                       lambda: A[np.arange(6) // 2][:, np.arange(2) * 2]),
    "resize_bicubic": (lambda: F.resize_bicubic(c(A.reshape(1, 1, 3, 4)), (1, 1, 5, 7)),
                       lambda: torch.nn.functional.interpolate(torch.from_numpy(A.reshape(1, 1, 3, 4)).double(),
                                                               size=(5, 7), mode="bicubic").numpy()),
    "resize": (lambda: F.resize(c(A.reshape(1, 1, 3, 4)), (1, 1, 5, 7), ops.InterpolationMode.BICUBIC),
               lambda: torch.nn.functional.interpolate(torch.from_numpy(A.reshape(1, 1, 3, 4)).double(),
                                                       size=(5, 7), mode="bicubic").numpy()),
    "roi_align": (lambda: F.roi_align(c(A.reshape(1, 3, 4, 1)), c(np.array([[0, 0, 0, 4, 3]], np.float32)), 1, 1,
                                      sampling_ratio=2),
                  lambda: np.array(_bilinear_mean(A)).reshape(1, 1, 1, 1)),
    "non_maximum_suppression": (
        lambda: F.non_maximum_suppression(c(np.array([[[0, 0, 2, 2], [0, 0, 2, 2.1], [5, 5, 6, 6]]], np.float32)),
                                          c(np.array([[[0.9, 0.8, 0.7]]], np.float32)), 5, 0.5),
        lambda: np.array([[0, 0, 0], [0, 0, 2]])),
    "full": (lambda: F.full([2, 3], 1.5, dtype=DType.float32, device=CPU_), lambda: np.full((2, 3), 1.5)),
    "zeros": (lambda: F.zeros([2], dtype=DType.int32, device=CPU_), lambda: np.zeros(2, np.int32)),
    "ones": (lambda: F.ones([3], device=CPU_), lambda: np.ones(3, np.float32)),
    "full_like": (lambda: F.full_like(c(I), 7), lambda: np.full_like(I, 7)),
    "zeros_like": (lambda: F.zeros_like(c(A)), lambda: np.zeros_like(A)),
    "ones_like": (lambda: F.ones_like(TensorType(DType.int64, [2, 2], DeviceRef.CPU())),
                  lambda: np.ones((2, 2), np.int64)),
    "arange": (lambda: F.arange(5, dtype=DType.int64, device=CPU_), lambda: np.arange(5)),
    "from_dim": (lambda: F.from_dim(Dim(6) * 2, dtype=DType.int32), lambda: np.array(12, np.int32)),
    "clamp": (lambda: F.clamp(c(A), -0.5, 0.5), lambda: np.clip(A, -0.5, 0.5)),
    "clip": (lambda: F.clip(c(I), max=2), lambda: np.minimum(I, 2)),
    "cond": (lambda: F.cond(c(np.array(True)), [c(A).type], lambda: c(A) + 1, lambda: c(A) - 1),
             lambda: [A + 1]),  # a list, as in MAX (max-behaviours.md B13.3)
    "while_loop": (lambda: F.while_loop([c(np.array(0, np.int64))], lambda i: i < 5, lambda i: i + 2),
                   lambda: [np.array(6)]),
})


def _scatter_ref(a, u, idx, uf):
    out = a.astype(np.float64).copy()
    for i, j in np.ndindex(*idx.shape):
        out[idx[i, j], j] = uf(out[idx[i, j], j], u[i, j])
    return out


def _scatter_nd_ref(a, u, idx, uf):
    out = a.astype(np.float64).copy()
    for k, (i, j) in enumerate(idx):
        out[i, j] = uf(out[i, j], u[k])
    return out


def _bilinear_mean(a):
    # one 1x1 bin over the whole 3x4 image, 2x2 samples at (0.75|2.25, 1|3)
    vals = []
    for y in (0.75, 2.25):
        for x in (1.0, 3.0):
            y0, x0 = int(y), int(x)
            y1, x1 = min(y0 + 1, 2), min(x0 + 1, 3)
            ly, lx = y - y0, x - x0
            vals.append((1 - ly) * (1 - lx) * a[y0, x0] + (1 - ly) * lx * a[y0, x1]
                        + ly * (1 - lx) * a[y1, x0] + ly * lx * a[y1, x1])
    return np.mean(vals)


# functions whose eager use is covered elsewhere (custom kernels, external weights, multi-device
# collectives, quantized blocks, buffers) or that return nothing (print)
OTHER = {"custom", "constant_external", "functional", "inplace_custom", "allgather", "allreduce_sum",
         "buffer_store", "buffer_store_slice", "qmatmul", "print",
         # MAX 26.7 names, covered in tests/experimental/test_experimental_max267_names.py
         "complex_mul", "dequantize", "distributed_broadcast", "elementwise_max", "elementwise_min", "gaussian",
         "gaussian_like", "normal", "normal_like", "rebind", "reduce_scatter", "shape_to_tensor", "uniform",
         "uniform_like"}


def test_every_function_has_a_case():
    names = {n for n in F.__all__} - OTHER
    assert names <= set(CASES), sorted(names - set(CASES))


def _check(got, want):
    if isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want)
        for g, w in zip(got, want):
            _check(g, w)
        return
    assert isinstance(got, Tensor) and got.real
    g = npy(got)
    w = np.asarray(want)
    assert g.shape == w.shape, (g.shape, w.shape)
    if w.dtype == bool or g.dtype.kind in "iub":
        np.testing.assert_array_equal(g, w)
    else:
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_eager_against_reference(name):
    call, ref = CASES[name]
    _check(call(), ref())
    _check(call(), ref())  # second call: memoised replay gives the same answer


@pytest.mark.parametrize("name", sorted(CASES))
def test_lazy_matches_eager(name):
    call, ref = CASES[name]
    with T.lazy():
        out = call()
    flat = out if isinstance(out, (list, tuple)) else [out]
    assert all(isinstance(t, Tensor) for t in flat)
    _check([t.realize for t in flat] if isinstance(out, (list, tuple)) else out.realize, ref())


def test_functional_inside_graph_is_the_graph_op():
    with Graph("g", input_types=[TensorType(DType.float32, [3, 4], DeviceRef.CPU())]) as g:
        x = g.inputs[0].tensor
        y = F.relu(F.add(x, 1.0))
        assert type(y).__name__ == "TensorValue" and y._graph is g
        assert [n.op for n in g._nodes[-3:]] == ["constant", "add", "relu"]
        # an eager tensor used inside a graph becomes a constant of that graph
        z = F.mul(y, c(B))
        g.output(z)
    out = InferenceSession().load(g).execute(Buffer.from_numpy(A))[0].to_numpy()
    np.testing.assert_allclose(out, np.maximum(A + 1, 0) * B, rtol=1e-6)


def test_wrappers_call_graph_ops():
    for n in F._OPS:
        assert getattr(F, n).__wrapped_op__ is getattr(ops, n)
    for n in F._COMPOSITES:
        assert callable(getattr(F, n))


def test_errors_raise_at_the_call_with_the_op_name():
    x = c(A)
    with pytest.raises(ValueError, match="(?s)Failed to create op 'AddOp'.*are neither equivalent nor broadcastable"):
        F.add(x, c(np.ones(5, np.float32)))
    with pytest.raises(ValueError, match="reshape"):
        x.reshape([5, 5])
    with pytest.raises(IndexError, match=r"^Axis axis_2 out of range"):  # MAX's text (max-behaviours.md B4.2)
        x.transpose(0, 7)
    with pytest.raises(ValueError, match="matmul"):
        x @ x
    with T.lazy():  # lazily too: the type rule runs at the call, not at realization
        with pytest.raises(ValueError, match="matmul"):
            x @ x
    # errors are not memoised: the same bad call raises again
    with pytest.raises(ValueError, match="add"):
        F.add(x, c(np.ones(5, np.float32)))


def test_memo_respects_aliasing_scalars_and_signed_zero():
    x, y = c(np.array([1.0, -2.0], np.float32)), c(np.array([10.0, 20.0], np.float32))
    np.testing.assert_array_equal(npy(x + x), [2, -4])
    np.testing.assert_array_equal(npy(x + y), [11, 18])
    np.testing.assert_array_equal(npy(x * 2), [2, -4])
    np.testing.assert_array_equal(npy(x * 3), [3, -6])
    i = c(np.array([1, 2], np.int32))
    assert (i + 1).dtype == DType.int32 and (i + True).dtype == DType.int32
    with pytest.raises(ValueError, match=r"^Unsafe cast: Can't promote python float to dtype\(DType\.int32\)\. \(add: rhs=1\.5\)"):
        i + 1.5  # MAX's weak-scalar rule: a fraction does not fit an int tensor
    z = c(np.array([-0.0], np.float32))
    assert np.signbit(npy(z + -0.0))[0] and not np.signbit(npy(z + 0.0))[0]


def test_no_recompile_in_eager_loop():
    from max.engine.compiler import lower

    x, y = c(np.zeros(4, np.float32)), c(np.ones(4, np.float32))
    before = dict(lower.cache_stats)
    for _ in range(1000):
        x = x + y
    assert lower.cache_stats == before  # eager ops never go through the compiler
    np.testing.assert_array_equal(npy(x), np.full(4, 1000.0))
    assert len(T.GRAPH.graph._nodes) == len(T.GRAPH.graph._base_nodes)


# -- hypothesis: a representative set against numpy ---------------------------------
shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3)


@given(shape=shapes, data=st.data())
def test_binary_broadcast_hypothesis(shape, data):
    a = data.draw(st.lists(st.floats(-10, 10, width=32), min_size=math.prod(shape), max_size=math.prod(shape)))
    a = np.array(a, np.float32).reshape(shape)
    b = np.array(data.draw(st.floats(-10, 10, width=32)), np.float32)
    bs = shape[-1:]
    bv = np.full(bs, b, np.float32)
    for f, r in ((F.add, np.add), (F.sub, np.subtract), (F.mul, np.multiply), (F.max, np.maximum)):
        np.testing.assert_allclose(npy(f(c(a), c(bv))), r(a, bv), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(npy(c(a) * float(b)), a * b, rtol=1e-6, atol=1e-6)


@given(shape=shapes, axis=st.integers(-1, 0), seed=st.integers(0, 1000))
def test_reductions_hypothesis(shape, axis, seed):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    x = c(a)
    np.testing.assert_allclose(npy(F.sum(x, axis)), a.sum(axis, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(npy(F.mean(x, axis)), a.mean(axis, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(npy(x.max(axis)), a.max(axis, keepdims=True))
    np.testing.assert_array_equal(npy(x.argmax(axis)), a.argmax(axis)[..., None] if axis == -1 else
                                  np.expand_dims(a.argmax(axis), axis))


@given(shape=st.lists(st.integers(1, 4), min_size=2, max_size=3), seed=st.integers(0, 1000))
def test_shape_ops_hypothesis(shape, seed):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    x = c(a)
    np.testing.assert_array_equal(npy(x.T), np.swapaxes(a, -1, -2))
    np.testing.assert_array_equal(npy(x.reshape([-1])), a.reshape(-1))
    perm = list(range(len(shape)))[::-1]
    np.testing.assert_array_equal(npy(x.permute(perm)), a.transpose(perm))
    np.testing.assert_array_equal(npy(x[0]), a[0])
    np.testing.assert_array_equal(npy(x[..., ::-1]), a[..., ::-1])
