"""max.torch.graph_op: eager and torch.compile calls against pure-torch references,
torch.nn.Module integration, the compile cache, symbolic input types, errors, GPUs.

torch.compile is slow, so each compiled function is built once (module-scoped
fixtures) and the number of distinct compiles is kept small.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import max.torch
from max import nn
from max.dtype import DType
from max.graph import DeviceRef, TensorType, ops
from max.graph.kernel_library import MOJO_HELP

ROOT = Path(__file__).resolve().parents[2]
KERNELS = Path(__file__).resolve().parent / "torch_test_kernels.py"
CPU = DeviceRef.CPU()
GRAY_W = torch.tensor([0.21, 0.71, 0.07], dtype=torch.float64)


def gray_ref(img: torch.Tensor) -> torch.Tensor:
    return (img.to(torch.float64) * GRAY_W.to(img.device)).sum(-1).to(img.dtype)


def close_u8(a: torch.Tensor, b: torch.Tensor) -> bool:
    """uint8 results of float sums: allow 1 for rounding at .999 boundaries."""
    return a.shape == b.shape and a.dtype == b.dtype and int((a.int() - b.int()).abs().max()) <= 1


# ----------------------------------------------------------------------------- ops under test
def make_gray():
    @max.torch.graph_op
    def max_grayscale(pic):
        scaled = pic.cast(DType.float32) * np.array([0.21, 0.71, 0.07])
        grayscaled = ops.sum(scaled, axis=-1).cast(pic.dtype)
        return ops.squeeze(grayscaled, axis=-1)

    return max_grayscale


BATCH = "batch"


@max.torch.graph_op(
    input_types=[TensorType(DType.float32, [BATCH, 4], CPU), TensorType(DType.float32, [4], CPU)],
    output_types=[TensorType(DType.float32, [BATCH, 4], CPU), TensorType(DType.float32, [BATCH], CPU)],
)
def relu_rows(x, b):
    y = ops.relu(x + b)
    return y, ops.squeeze(ops.sum(y, axis=-1), -1)


def relu_rows_ref(x, b):
    y = torch.relu(x + b)
    return y, y.sum(-1)


LIN = nn.Linear(4, 3, DType.float32, CPU, has_bias=True)
LIN_W = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
LIN_B = torch.randn(3, generator=torch.Generator().manual_seed(1))
LIN.load_state_dict({"weight": LIN_W, "bias": LIN_B})


@max.torch.graph_op(name="gelu_linear")
def gelu_linear(x):
    """A max.nn module (with weights loaded from torch tensors) inside the graph."""
    return ops.gelu(LIN(x))


class TorchModel(torch.nn.Module):
    """A torch module whose forward mixes torch ops and a MAX graph op."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = torch.nn.Linear(5, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.pre(x))
        out = h.new_empty(h.shape[0], 3)
        gelu_linear(out, h)
        return out * 2 + 1


def torch_model_ref(m: TorchModel, x: torch.Tensor) -> torch.Tensor:
    h = torch.tanh(m.pre(x))
    return torch.nn.functional.gelu(h @ LIN_W.T + LIN_B) * 2 + 1


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def gray():
    return make_gray()


@pytest.fixture(scope="module")
def gray_compiled(gray):
    def grayscale(pic: torch.Tensor) -> torch.Tensor:
        out = pic.new_empty(pic.shape[:-1])
        gray(out, pic)
        return out

    return torch.compile(grayscale, fullgraph=True)


@pytest.fixture(scope="module")
def torch_model():
    torch.manual_seed(0)
    return TorchModel().eval()


@pytest.fixture(scope="module")
def torch_model_compiled(torch_model):
    return torch.compile(torch_model, fullgraph=True)


def img(*shape, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) * 255).to(torch.uint8).to(device)


# ----------------------------------------------------------------------------- eager
def test_schema_is_destination_passing(gray):
    s = str(gray._opoverload._schema)
    assert s.startswith("libremax::max_grayscale") and "(Tensor(a0!) out0, Tensor pic) -> ()" in s
    assert "Tensor(a0!) out0, Tensor(a1!) out1, Tensor x, Tensor b" in str(relu_rows._opoverload._schema)


def test_eager_matches_torch_and_caches_per_shape():
    op = make_gray()
    x = img(16, 8, 3)
    out = torch.empty(16, 8, dtype=torch.uint8)
    assert op(out, x) is None
    assert close_u8(out, gray_ref(x))
    assert op.cache_info().misses == 1
    for seed in (1, 2):  # same shape: no new compile
        x = img(16, 8, 3, seed=seed)
        op(out, x)
        assert close_u8(out, gray_ref(x))
    info = op.cache_info()
    assert (info.misses, info.hits, info.currsize) == (1, 2, 1)
    x = img(5, 7, 3)  # a new shape compiles a new specialised graph
    out = torch.empty(5, 7, dtype=torch.uint8)
    op(out, x)
    assert close_u8(out, gray_ref(x))
    assert op.cache_info().misses == 2
    op(out, x)
    assert op.cache_info().misses == 2
    op.cache_clear()
    assert op.cache_info() == (0, 0, 0, 0)


def test_outputs_written_in_place_into_views():
    op = make_gray()
    x = img(6, 4, 3)
    big = torch.zeros(6, 8, dtype=torch.uint8)
    view = big[:, ::2]  # a strided view: results land in the caller's memory
    op(view, x)
    assert close_u8(big[:, ::2].contiguous(), gray_ref(x))
    assert int(big[:, 1::2].abs().sum()) == 0


def test_keyword_arguments_by_schema_name(gray):
    x = img(3, 3, 3)
    out = torch.empty(3, 3, dtype=torch.uint8)
    gray(out0=out, pic=x)
    assert close_u8(out, gray_ref(x))


def test_symbolic_input_types_serve_several_sizes_with_one_compile():
    relu_rows.cache_clear()
    b = torch.randn(4)
    for n in (1, 3, 8, 2):
        x = torch.randn(n, 4)
        y, s = torch.empty(n, 4), torch.empty(n)
        relu_rows(y, s, x, b)
        ry, rs = relu_rows_ref(x, b)
        torch.testing.assert_close(y, ry)
        torch.testing.assert_close(s, rs)
    info = relu_rows.cache_info()
    assert (info.misses, info.hits, info.builds) == (1, 3, 1)


def test_max_nn_module_with_weights_in_graph_op():
    x = torch.randn(2, 4)
    out = torch.empty(2, 3)
    gelu_linear(out, x)
    torch.testing.assert_close(out, torch.nn.functional.gelu(x @ LIN_W.T + LIN_B), atol=1e-5, rtol=1e-5)


def test_torch_module_eager(torch_model):
    x = torch.randn(6, 5)
    with torch.no_grad():
        torch.testing.assert_close(torch_model(x), torch_model_ref(torch_model, x), atol=1e-5, rtol=1e-5)


def test_zero_outputs_and_explicit_num_outputs():
    @max.torch.graph_op(num_outputs=2)
    def two(x):
        return x * 2, ops.negate(x)

    x = torch.randn(3)
    a, b = torch.empty(3), torch.empty(3)
    two(a, b, x)
    torch.testing.assert_close(a, x * 2)
    torch.testing.assert_close(b, -x)


# ----------------------------------------------------------------------------- torch.compile
def test_compiled_matches_eager_and_reuses_the_cache(gray, gray_compiled):
    x = img(12, 10, 3, seed=3)
    eager = torch.empty(12, 10, dtype=torch.uint8)
    gray(eager, x)
    before = gray.cache_info().misses
    compiled = gray_compiled(x)
    assert close_u8(compiled, gray_ref(x))
    assert torch.equal(compiled, eager)
    assert gray.cache_info().misses == before  # the compiled call reuses the eager call's MAX graph
    compiled = gray_compiled(img(12, 10, 3, seed=4))
    assert close_u8(compiled, gray_ref(img(12, 10, 3, seed=4)))
    assert gray.cache_info().misses == before


def test_compiled_graph_calls_the_custom_op(gray):
    def fn(pic):
        out = pic.new_empty(pic.shape[:-1])
        gray(out, pic)
        return out

    seen = []

    def backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    x = img(4, 4, 3)
    assert close_u8(torch.compile(fn, backend=backend, fullgraph=True)(x), gray_ref(x))
    code = seen[0].code
    assert "libremax.max_grayscale" in code


def test_torch_module_compiled(torch_model, torch_model_compiled):
    x = torch.randn(6, 5)
    with torch.no_grad():
        torch.testing.assert_close(torch_model_compiled(x), torch_model_ref(torch_model, x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch_model_compiled(x), torch_model(x))


def test_compiled_dynamic_shapes_with_symbolic_types():
    """torch.compile(dynamic=True) traces with SymInt sizes; one MAX graph serves every batch."""
    relu_rows.cache_clear()

    def fn(x, b):
        y = x.new_empty(x.shape)
        s = x.new_empty(x.shape[:1])
        relu_rows(y, s, x, b)
        return y + 1, s

    cfn = torch.compile(fn, fullgraph=True, dynamic=True)
    b = torch.randn(4)
    for n in (2, 5, 9):
        x = torch.randn(n, 4)
        y, s = cfn(x, b)
        ry, rs = relu_rows_ref(x, b)
        torch.testing.assert_close(y, ry + 1)
        torch.testing.assert_close(s, rs)
    assert relu_rows.cache_info().misses == 1


# ----------------------------------------------------------------------------- errors
def test_wrong_output_shape_is_reported_before_running(gray):
    x = img(4, 5, 3)
    with pytest.raises(ValueError, match=r"max_grayscale.*output buffer 'out0'.*expected shape \[4, 5\].*"
                                         r"got shape \[4, 4\]"):
        gray(torch.empty(4, 4, dtype=torch.uint8), x)


def test_wrong_output_dtype_is_reported(gray):
    x = img(4, 5, 3)
    with pytest.raises(ValueError, match=r"output buffer 'out0'.*dtype uint8.*dtype float32"):
        gray(torch.empty(4, 5, dtype=torch.float32), x)


def test_wrong_output_shape_under_torch_compile(gray):
    def fn(pic):
        out = pic.new_empty(pic.shape[0], pic.shape[1] + 1)
        gray(out, pic)
        return out

    with pytest.raises(Exception, match=r"max_grayscale.*output buffer 'out0'.*expected shape \[3, 3\]"):
        torch.compile(fn, fullgraph=True, backend="eager")(img(3, 3, 3))


def test_symbolic_dims_must_agree_and_static_dims_must_match():
    b = torch.randn(4)
    with pytest.raises(ValueError, match=r"relu_rows.*input 'x'.*expected shape \[batch, 4\], got \[3, 5\]"):
        relu_rows(torch.empty(3, 4), torch.empty(3), torch.randn(3, 5), b)
    with pytest.raises(ValueError, match=r"output buffer 'out1'.*expected shape \[3\].*got shape \[2\]"):
        relu_rows(torch.empty(3, 4), torch.empty(2), torch.randn(3, 4), b)
    with pytest.raises(TypeError, match=r"input 'x': expected dtype float32, got float64"):
        relu_rows(torch.empty(3, 4), torch.empty(3), torch.randn(3, 4, dtype=torch.float64), b)


def test_wrong_argument_count():
    with pytest.raises(Exception, match="expected|argument"):
        relu_rows(torch.empty(3, 4), torch.randn(3, 4), torch.randn(4))


def test_returned_value_count_must_match_declaration():
    @max.torch.graph_op
    def two_results(x):
        return x, x

    with pytest.raises(ValueError, match=r"two_results.*returned 2 value\(s\).*1 output"):
        two_results(torch.empty(2), torch.randn(2))


def test_bad_declarations():
    with pytest.raises(TypeError, match=r"\*args.*input_types"):
        max.torch.graph_op(lambda *xs: xs[0])
    with pytest.raises(TypeError, match=r"input_types\[0\] must be a TensorType"):
        max.torch.graph_op(lambda x: x, input_types=["float32"])
    with pytest.raises(TypeError, match=r"input_types has 2 entries"):
        max.torch.graph_op(lambda x: x, input_types=[TensorType(DType.float32, [2], CPU)] * 2)
    with pytest.raises(ValueError, match="num_outputs"):
        max.torch.graph_op(lambda x: x, num_outputs=-1)


def test_output_types_dtype_mismatch():
    @max.torch.graph_op(output_types=[TensorType(DType.int32, [3], CPU)])
    def wrong_dtype(x):
        return x

    with pytest.raises(TypeError, match=r"wrong_dtype.*output 0.*float32.*int32"):
        wrong_dtype(torch.empty(3, dtype=torch.int32), torch.randn(3))


def test_mojo_kernel_library_is_rejected_with_the_engine_message():
    with pytest.raises(ValueError) as e:
        max.torch.graph_op(lambda x: x, kernel_library="kernels.mojopkg")
    assert MOJO_HELP in str(e.value)


def test_graph_op_with_a_python_kernel_library():
    @max.torch.graph_op(kernel_library=KERNELS)
    def scaled_plus(x):
        (y,) = ops.custom("torchtest_scale_shift", x.device, [x], [x.type], parameters={"scale": 3, "shift": 2})
        return y + x

    x = torch.randn(5)
    out = torch.empty(5)
    scaled_plus(out, x)
    torch.testing.assert_close(out, x * 3 + 2 + x)


# ----------------------------------------------------------------------------- example
def test_example_runs():
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "05_torch_graph_op.py")], capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "Grayscale conversion completed successfully!" in r.stdout
    assert "CustomOpLibrary grayscale: (64, 64, 3) -> (64, 64)" in r.stdout


# ----------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_eager_and_compiled(gray, gray_compiled):
    x = img(32, 16, 3, device="cuda")
    out = torch.empty(32, 16, dtype=torch.uint8, device="cuda")
    gray(out, x)
    assert out.device.type == "cuda"
    assert close_u8(out, gray_ref(x))
    misses = gray.cache_info().misses
    res = gray_compiled(x)
    assert res.device.type == "cuda" and torch.equal(res, out)
    assert gray.cache_info().misses == misses
    with pytest.raises(ValueError, match=r"output buffer 'out0'.*on cuda:0.*got one on cpu"):
        gray(torch.empty(32, 16, dtype=torch.uint8), x)


@pytest.mark.gpu
def test_gpu_symbolic_types():
    b = torch.randn(4, device="cuda")
    relu_rows.cache_clear()
    for n in (3, 6):
        x = torch.randn(n, 4, device="cuda")
        y, s = torch.empty(n, 4, device="cuda"), torch.empty(n, device="cuda")
        relu_rows(y, s, x, b)
        ry, rs = relu_rows_ref(x, b)
        torch.testing.assert_close(y, ry)
        torch.testing.assert_close(s, rs)
    assert relu_rows.cache_info().misses == 1
