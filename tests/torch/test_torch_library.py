"""max.torch.CustomOpLibrary: Python kernel libraries called with torch tensors,
destination-passing outputs, torch.compile, caching, errors, GPUs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from max.dtype import DType
from max.graph import KernelLibrary
from max.graph.kernel_library import MOJO_HELP
from max.torch import CustomOpLibrary

KERNELS = Path(__file__).resolve().parent / "torch_test_kernels.py"
GRAY_W = torch.tensor([0.21, 0.71, 0.07], dtype=torch.float64)


@pytest.fixture(scope="module")
def lib():
    return CustomOpLibrary(KERNELS)


@pytest.fixture(scope="module")
def compiled_pair(lib):
    def fn(x, y):
        a = torch.empty_like(x)
        s = x.new_empty(x.shape[:-1])
        lib.torchtest_split_sum(a, s, x, y)
        g = torch.empty_like(x)
        lib.torchtest_scale_shift(g, a, scale=2)
        return g, s

    return torch.compile(fn, fullgraph=True)


def gray_ref(img):
    return (img.to(torch.float64) * GRAY_W.to(img.device)).sum(-1).to(img.dtype)


def test_lists_its_kernels(lib):
    names = {"torchtest_scale_shift", "torchtest_split_sum", "torchtest_grayscale", "torchtest_nonzero_count"}
    assert names <= set(dir(lib))
    assert "torchtest_grayscale" in repr(lib)
    assert lib.torchtest_grayscale is lib["torchtest_grayscale"]


def test_functional_kernel_writes_outputs_in_place(lib):
    x = torch.randn(4, 3)
    out = torch.empty(4, 3)
    assert lib.torchtest_scale_shift(out, x, scale=3) is None
    torch.testing.assert_close(out, x * 3 + 1)
    lib.torchtest_scale_shift(out, x, scale=3, shift=-2)
    torch.testing.assert_close(out, x * 3 - 2)
    schema = str(lib.torchtest_scale_shift.op._opoverload._schema)
    assert "(Tensor(a!)[] outputs, Tensor x, *, int scale, int shift=1) -> ()" in schema


def test_two_outputs(lib):
    x, y = torch.randn(5, 2), torch.randn(5, 2)
    a, s = torch.empty(5, 2), torch.empty(5)
    lib.torchtest_split_sum(a, s, x, y)
    torch.testing.assert_close(a, x + y)
    torch.testing.assert_close(s, (x * y).sum(-1))


def test_inplace_kernel_is_destination_passing_like_the_mojo_example(lib):
    op = lib.torchtest_grayscale
    img = (torch.rand(9, 7, 3) * 255).to(torch.uint8)
    out = img.new_empty(img.shape[:-1])
    op(out, img)
    assert torch.equal(out, gray_ref(img))
    assert "(Tensor(a0!) img_out, Tensor(a1!) img_in) -> ()" in str(op.op._opoverload._schema)


def test_new_sizes_reuse_the_compiled_graph(lib):
    op = lib.torchtest_scale_shift
    _, compiles = op.cache_info()
    for n in (2, 7, 11):
        x = torch.randn(n)
        out = torch.empty(n)
        op(out, x, scale=5)
        torch.testing.assert_close(out, x * 5 + 1)
    hits, after = op.cache_info()
    assert after - compiles <= 1  # dims are symbolic: one graph per (dtypes, ranks, devices, parameters)
    op(torch.empty(3), torch.randn(3), scale=5)
    assert op.cache_info() == (hits + 1, after)


def test_torch_compile(lib, compiled_pair):
    x, y = torch.randn(6, 4), torch.randn(6, 4)
    g, s = compiled_pair(x, y)
    torch.testing.assert_close(g, (x + y) * 2 + 1)
    torch.testing.assert_close(s, (x * y).sum(-1))


def test_torch_compile_inplace_kernel(lib):
    def fn(img):
        out = img.new_empty(img.shape[:-1])
        lib.torchtest_grayscale(out, img)
        return out

    img = (torch.rand(8, 8, 3) * 255).to(torch.uint8)
    assert torch.equal(torch.compile(fn, fullgraph=True, backend="aot_eager")(img), gray_ref(img))


def test_module_object_and_kernel_library_object(lib):
    by_kl = CustomOpLibrary(KernelLibrary(paths=[KERNELS]))
    x = torch.randn(3)
    out = torch.empty(3)
    by_kl.torchtest_scale_shift(out, x, scale=2)
    torch.testing.assert_close(out, x * 2 + 1)
    mod = next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == str(KERNELS))
    by_mod = CustomOpLibrary(mod)
    assert "torchtest_grayscale" in dir(by_mod)
    assert by_mod.torchtest_grayscale is lib.torchtest_grayscale  # one torch op per kernel


def test_wrong_output_buffer_is_reported_before_running(lib):
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"torchtest_scale_shift.*output buffer 0: expected shape \[4, 3\] and "
                                         r"dtype float32, got shape \[4, 2\] and dtype float32"):
        lib.torchtest_scale_shift(torch.empty(4, 2), x, scale=1)
    with pytest.raises(ValueError, match=r"output buffer 1: expected shape \[4\].*got shape \[4, 3\] and dtype float64"):
        lib.torchtest_split_sum(torch.empty(4, 3), torch.empty(4, 3, dtype=torch.float64), x, x)


def test_data_dependent_kernel_is_checked_after_running(lib):
    x = torch.tensor([1.0, 0.0, 2.0, 3.0])
    out = torch.empty(3)
    lib.torchtest_nonzero_count(out, x)
    assert torch.equal(out, torch.full((3,), 7.0))
    with pytest.raises(ValueError, match=r"torchtest_nonzero_count.*output buffer 0: the kernel produced shape \[3\]"):
        lib.torchtest_nonzero_count(torch.empty(2), x)


def test_too_few_arguments(lib):
    with pytest.raises(TypeError, match=r"expected output buffer\(s\) followed by 2 input\(s\)"):
        lib.torchtest_split_sum(torch.randn(2), torch.randn(2))


def test_unknown_op_and_mojo_paths(lib):
    with pytest.raises(AttributeError, match=r"'no_such_op' is not registered"):
        lib.no_such_op
    assert not hasattr(lib, "no_such_op")
    for path in ("my_library/grayscale.mojo", "kernels.mojopkg"):
        with pytest.raises(ValueError) as e:
            CustomOpLibrary(path)
        assert MOJO_HELP in str(e.value)


def test_parameter_types_need_annotations():
    from max.engine.custom import custom_op
    from max.torch.library import kernel_op
    from max.graph.kernel_library import _REGISTRY

    @custom_op("torchtest_bad_param")
    def bad(x, *, mystery):
        return x

    with pytest.raises(TypeError, match=r"'mystery' needs a bool, int, str or DType annotation"):
        kernel_op(_REGISTRY["torchtest_bad_param"])

    @custom_op("torchtest_dtype_param")
    def cast_to(x, *, dtype: DType = DType.float64):
        return x.to(dtype)  # the engine passes DType parameters as torch dtypes

    x = torch.randn(3)
    out = torch.empty(3, dtype=torch.float16)
    kernel_op(_REGISTRY["torchtest_dtype_param"])(out, x, dtype="float16")
    torch.testing.assert_close(out, x.half())


@pytest.mark.gpu
def test_gpu_kernels(lib):
    x = torch.randn(4, 3, device="cuda")
    out = torch.empty(4, 3, device="cuda")
    lib.torchtest_scale_shift(out, x, scale=3)
    torch.testing.assert_close(out, x * 3 + 1)
    img = (torch.rand(9, 7, 3, device="cuda") * 255).to(torch.uint8)
    g = img.new_empty(img.shape[:-1])
    lib.torchtest_grayscale(g, img)
    assert torch.equal(g, gray_ref(img))
    with pytest.raises(ValueError, match="one device"):
        lib.torchtest_scale_shift(torch.empty(4, 3), x, scale=3)
