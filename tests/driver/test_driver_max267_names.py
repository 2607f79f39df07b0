"""MAX 26.7 names of max.driver and max.engine.InferenceSession (issue 37)."""

import asyncio
import concurrent.futures
import os

import numpy as np
import pytest
import torch

from max import driver
from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession, PrintStyle
from max.graph import DeviceRef, Graph, TensorType, ops


@pytest.fixture
def no_virtual():
    yield
    driver.set_virtual_device_count(0)
    driver.set_virtual_device_api("")
    driver.set_virtual_device_target_arch("")
    driver.set_virtual_cpu_target("")


def test_device_queue_is_device_stream():
    assert driver.DeviceQueue is driver.DeviceStream
    q = driver.DeviceQueue(CPU())
    assert isinstance(q, driver.DeviceStream) and q.device == CPU()
    assert "DeviceQueue" in driver.__all__ and "DeviceStream" in driver.__all__


def test_virtual_device_mode(no_virtual, tmp_path):
    real = driver.accelerator_count()
    assert not driver.is_virtual_device_mode() and driver.get_virtual_device_count() == 0
    driver.set_virtual_device_api("hip")
    driver.set_virtual_device_target_arch("gfx942")
    driver.set_virtual_device_count(4)
    assert driver.is_virtual_device_mode() and driver.get_virtual_device_count() == 4
    assert driver.accelerator_count() == 4
    assert (driver.get_virtual_device_api(), driver.get_virtual_device_target_arch()) == ("hip", "gfx942")
    gpu = driver.Accelerator(3)
    assert (gpu.label, gpu.id, gpu.api, gpu.architecture_name, gpu.is_host) == ("gpu", 3, "hip", "gfx942", False)
    assert driver.accelerator_api() == "hip"
    gpu.default_stream.synchronize()  # nothing to wait for
    with pytest.raises(ValueError, match="only 4 accelerators"):
        driver.Accelerator(4)
    with pytest.raises(ValueError, match="virtual device"):
        Buffer(DType.float32, [2], device=gpu)  # no memory behind it
    # graphs for the virtual configuration build and type-check
    with Graph("v", input_types=[TensorType(DType.float32, [2], DeviceRef.from_device(gpu))]) as g:
        g.output(ops.abs(g.inputs[0]))
    assert g.output_types[0].device == DeviceRef.GPU(3)
    # ... and compile for it, to a MEF another machine can load (cross-compilation)
    with Graph("v0", input_types=[TensorType(DType.float32, [2], DeviceRef.GPU(0))]) as g0:
        g0.output(ops.abs(g0.inputs[0]))
    compiled = InferenceSession(devices=[driver.Accelerator(0)]).compile(g0)
    compiled.export_mef(tmp_path / "v0.mef")
    assert (tmp_path / "v0.mef").stat().st_size > 0
    driver.set_virtual_device_count(0)
    assert not driver.is_virtual_device_mode() and driver.accelerator_count() == real
    with pytest.raises(ValueError):
        driver.set_virtual_device_count(-1)
    with pytest.raises(TypeError):
        driver.set_virtual_device_count("2")
    with pytest.raises(ValueError):
        driver.set_virtual_device_api("opencl")


def test_virtual_cpu_target(no_virtual):
    import platform

    assert driver.get_virtual_cpu_target() == ""
    driver.set_virtual_cpu_target("x86-64-v3")
    assert driver.get_virtual_cpu_target() == "x86-64-v3"
    driver.set_virtual_cpu_target("generic")
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert driver.get_virtual_cpu_target() == "x86-64"
    with pytest.raises(ValueError, match="native"):
        driver.set_virtual_cpu_target("native")
    driver.set_virtual_cpu_target("")
    assert driver.get_virtual_cpu_target() == ""


def test_batch_inplace_copy_copies_every_pair_or_none():
    rng = np.random.default_rng(0)
    srcs = [Buffer.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in ((3,), (2, 4))]
    dsts = [Buffer(DType.float32, [3]), Buffer(DType.float32, [8])]  # same bytes, other shape
    driver.batch_inplace_copy(dsts, srcs)
    np.testing.assert_array_equal(dsts[0].to_numpy(), srcs[0].to_numpy())
    np.testing.assert_array_equal(dsts[1].to_numpy(), srcs[1].to_numpy().reshape(-1))
    before = dsts[0].to_numpy().copy()
    with pytest.raises(ValueError, match="sizes differ"):
        driver.batch_inplace_copy([dsts[0], Buffer(DType.float32, [5])], [Buffer.from_numpy(np.zeros(3, np.float32)),
                                                                           srcs[1]])
    np.testing.assert_array_equal(dsts[0].to_numpy(), before)  # the good pair was not written either
    with pytest.raises(ValueError):
        driver.batch_inplace_copy(dsts, srcs[:1])
    with pytest.raises(TypeError):
        driver.batch_inplace_copy(dsts[0], srcs[0])


@pytest.mark.parametrize("dtype", [DType.float32, DType.bfloat16, DType.int64, DType.bool])
def test_load_max_buffer_round_trips_ops_print(tmp_path, dtype):
    t = torch.randn(2, 3, 4)
    t = (t > 0) if dtype is DType.bool else t.to(dtype.to_torch())
    with Graph("ckpt", input_types=[TensorType(dtype, [2, 3, 4], DeviceRef.CPU())]) as g:
        g.inputs[0].print("h")
        g.output(g.inputs[0])
    s = InferenceSession()
    s.set_debug_print_options(PrintStyle.BINARY_MAX_CHECKPOINT, output_directory=str(tmp_path))
    try:
        s.load(g).execute(Buffer._from_torch(t.contiguous()))
    finally:
        s.set_debug_print_options(PrintStyle.COMPACT)
    b = driver.load_max_buffer(tmp_path / "h.max")
    assert b.dtype is dtype and b.shape == (2, 3, 4)
    assert torch.equal(torch.from_dlpack(b) if dtype is not DType.bfloat16 else b._torch(), t)


def test_load_max_buffer_rejects_other_files(tmp_path):
    p = tmp_path / "x.max"
    np.save(tmp_path / "x.npy", np.zeros(3))
    p.write_bytes((tmp_path / "x.npy").read_bytes())
    with pytest.raises(ValueError, match="not a MAX checkpoint"):
        driver.load_max_buffer(p)


def _graph():
    with Graph("add1", input_types=[TensorType(DType.float32, [3], DeviceRef.CPU())]) as g:
        g.output(ops.add(g.inputs[0], ops.constant(1.0, DType.float32, DeviceRef.CPU())))
    return g


def test_compile_async_init_and_init_all():
    s = InferenceSession()
    fut = s.compile_async(_graph())
    assert isinstance(fut, concurrent.futures.Future)
    compiled = fut.result(timeout=120)
    m, m2 = s.init_all([compiled, compiled])
    x = np.arange(3, dtype=np.float32)
    for model in (m, m2, s.init(compiled)):
        np.testing.assert_array_equal(model.execute(Buffer.from_numpy(x))[0].to_numpy(), x + 1)

    async def via_asyncio():
        return await asyncio.wrap_future(s.compile_async(_graph()))

    assert type(asyncio.run(via_asyncio())).__name__ == "CompiledModel"
    with pytest.raises(TypeError):
        s.compile_async(42)


def test_compile_reusing_mefs_writes_then_reads(tmp_path):
    s = InferenceSession()
    c1 = s.compile_reusing_mefs(_graph(), tmp_path)
    assert s.last_compile_stats.get("loaded_from") is None and len(list(tmp_path.glob("*.mef"))) == 1
    c2 = s.compile_reusing_mefs(_graph(), tmp_path)
    assert s.last_compile_stats.get("loaded_from", "").endswith(".mef")
    x = np.arange(3, dtype=np.float32)
    for c in (c1, c2):
        np.testing.assert_array_equal(s.init(c).execute(Buffer.from_numpy(x))[0].to_numpy(), x + 1)


def test_load_all():
    s = InferenceSession()
    a, b = s.load_all([_graph(), _graph()])
    x = np.ones(3, np.float32)
    np.testing.assert_array_equal(b.execute(Buffer.from_numpy(x))[0].to_numpy(), x + 1)
    with pytest.raises(ValueError):
        s.load_all([])
