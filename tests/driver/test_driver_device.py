"""Devices, DeviceSpec and the module-level device queries."""

import pickle

import pytest
import torch

from max import driver
from max.driver import (
    CPU,
    Accelerator,
    Device,
    DeviceSpec,
    DeviceStream,
    accelerator_api,
    accelerator_architecture_name,
    accelerator_count,
    device_from_torch,
    devices_exist,
    load_devices,
    scan_available_devices,
)

HAS_GPU = torch.cuda.is_available()


def test_cpu_members():
    cpu = CPU()
    assert isinstance(cpu, CPU) and isinstance(cpu, Device)
    assert not isinstance(cpu, Accelerator)
    assert cpu.label == "cpu" and cpu.api == "cpu" and cpu.id == 0
    assert cpu.is_host
    assert cpu.is_compatible and cpu.is_compatible_with_max
    assert repr(cpu) == "Device(type=cpu,id=0)"
    assert str(cpu) == "Device(type=cpu,id=0)"  # MAX 26.7 (max-behaviours.md B1.7)
    assert cpu._torch_device == torch.device("cpu")
    assert isinstance(cpu.stats, dict) and cpu.stats["device"] == "cpu:0"
    cpu.synchronize()


def test_cpu_is_cached_singleton_and_ids():
    assert CPU() is CPU() is CPU(0) is CPU(id=-1)
    # libremax models one host device: every id names it, reported as id 0.
    assert CPU(1) is CPU()
    assert Device.cpu() is CPU()
    assert CPU() == CPU() and hash(CPU()) == hash(CPU())
    assert CPU() != "cpu:0"


def test_cpu_bad_ids():
    with pytest.raises(ValueError, match=r"-5"):
        CPU(-5)
    with pytest.raises(TypeError, match="float"):
        CPU(1.5)
    with pytest.raises(TypeError, match="bool"):
        CPU(True)


def test_default_stream_is_stable():
    s = CPU().default_stream
    assert isinstance(s, DeviceStream)
    assert s is CPU().default_stream
    assert s.device is CPU()


def test_architecture_name_raises_on_cpu():
    with pytest.raises(ValueError, match="^failed to get device architecture name: Not implemented for device: cpu"):
        CPU().architecture_name


def test_can_access():
    assert CPU().can_access(CPU())
    with pytest.raises(TypeError, match="Device"):
        CPU().can_access("cpu")


def test_device_constructor_and_from_torch():
    assert Device("cpu") is CPU()
    assert Device(torch.device("cpu")) is CPU()
    assert Device(DeviceSpec.cpu()) is CPU()
    assert Device(CPU()) is CPU()
    assert device_from_torch(torch.device("cpu")) is CPU()
    assert device_from_torch("cpu") is CPU()
    with pytest.raises(ValueError, match="meta"):
        device_from_torch(torch.device("meta"))
    with pytest.raises(TypeError, match="int"):
        Device(3)
    with pytest.raises(ValueError, match="tpu"):
        Device("tpu:0")


def test_pickle_roundtrip():
    assert pickle.loads(pickle.dumps(CPU())) is CPU()


@pytest.mark.skipif(HAS_GPU, reason="CPU-only behaviour")
def test_accelerator_absent():
    assert accelerator_count() == 0
    assert accelerator_api() == "cpu"
    for call in (lambda: Accelerator(), lambda: Accelerator(id=0), lambda: Device.accelerator()):
        with pytest.raises(ValueError, match="no accelerator is available"):
            call()
    with pytest.raises(ValueError, match="no accelerator"):
        accelerator_architecture_name()
    with pytest.raises(ValueError, match="no accelerator is available"):
        Device("gpu:0")


def test_accelerator_bad_id_message():
    n = accelerator_count()
    with pytest.raises(ValueError) as e:
        Accelerator(n + 3)
    msg = str(e.value)
    assert str(n + 3) in msg
    if n:
        assert f"only {n} accelerator" in msg
    else:
        assert "no accelerator is available" in msg
    with pytest.raises(TypeError, match="str"):
        Accelerator("0")


def test_device_spec():
    assert DeviceSpec.cpu() == DeviceSpec(-1, "cpu")
    assert DeviceSpec.accelerator() == DeviceSpec(0, "gpu")
    assert DeviceSpec.accelerator(2).id == 2
    assert DeviceSpec(3).device_type == "cpu"
    with pytest.raises(ValueError, match="tpu"):
        DeviceSpec(0, "tpu")
    with pytest.raises(TypeError, match="float"):
        DeviceSpec(0.5, "gpu")


def test_scan_load_exist():
    specs = scan_available_devices()
    n = accelerator_count()
    if n == 0:
        assert specs == [DeviceSpec.cpu()]
    else:
        assert specs == [DeviceSpec.accelerator(i) for i in range(n)]
    assert devices_exist(specs)
    devs = load_devices(specs)
    assert len(devs) == len(specs)
    assert all(isinstance(d, Device) for d in devs)
    assert devices_exist([DeviceSpec.cpu()])
    assert not devices_exist([DeviceSpec.accelerator(n + 1)])
    with pytest.raises(ValueError, match=str(n + 1)):
        load_devices([DeviceSpec.accelerator(n + 1)])
    with pytest.raises(TypeError, match="DeviceSpec"):
        load_devices(["cpu"])


def test_module_example():
    device = driver.CPU() if driver.accelerator_count() == 0 else driver.Accelerator()
    assert f"{device}" in ("Device(type=cpu,id=0)", "Device(type=gpu,id=0)")


@pytest.mark.gpu
def test_accelerator_members():
    gpu = Accelerator()
    assert isinstance(gpu, Accelerator) and isinstance(gpu, Device)
    assert gpu is Accelerator(0) is Device.accelerator() is Device("gpu:0")
    assert gpu.label == "gpu" and gpu.id == 0 and not gpu.is_host
    assert gpu.api == ("hip" if torch.version.hip else "cuda") == accelerator_api()
    assert repr(gpu) == "Device(type=gpu,id=0)" and str(gpu) == "gpu:0"
    assert gpu._torch_device == torch.device("cuda", 0)
    assert device_from_torch(torch.device("cuda", 0)) is gpu
    arch = gpu.architecture_name
    assert arch == accelerator_architecture_name()
    if not torch.version.hip:
        major, minor = torch.cuda.get_device_capability(0)
        assert arch == f"sm_{major}{minor}"
    assert gpu.is_compatible
    assert gpu.can_access(gpu) and not gpu.can_access(CPU())
    stats = gpu.stats
    assert stats["total_memory"] >= stats["free_memory"] > 0
    assert gpu != CPU()
    gpu.synchronize()
    assert gpu.default_stream._torch_stream == torch.cuda.default_stream(0)
