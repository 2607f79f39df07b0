"""DeviceStream and DeviceEvent."""

import pytest
import torch

from max.driver import CPU, Accelerator, Buffer, DeviceEvent, DeviceStream
from max.dtype import DType


def test_cpu_stream_basics():
    s = DeviceStream(CPU())
    assert s.device is CPU()
    assert s is not CPU().default_stream
    assert s._torch_stream is None
    s.synchronize()
    s.wait_for(CPU().default_stream)
    s.wait_for(CPU())
    s.wait_for(s)
    assert "Device(type=cpu,id=0)" in repr(s)


def test_cpu_events_are_complete():
    s = CPU().default_stream
    ev = s.record_event()
    assert isinstance(ev, DeviceEvent) and ev.device is CPU()
    assert ev.is_ready() and ev.query()
    ev.synchronize()
    assert s.record_event(ev) is None
    s.wait_for(ev)
    with pytest.raises(ValueError, match="accelerator"):
        ev.elapsed_time(DeviceEvent())


def test_stream_errors():
    with pytest.raises(TypeError, match="expected a Device, got str"):
        DeviceStream("cpu")
    with pytest.raises(TypeError, match="DeviceStream, Device or DeviceEvent"):
        CPU().default_stream.wait_for(3)
    with pytest.raises(TypeError, match="DeviceEvent"):
        CPU().default_stream.record_event("ev")


def test_buffer_stream_binding():
    s = DeviceStream(CPU())
    b = Buffer(dtype=DType.float32, shape=[2], stream=s)
    assert b.stream is s and b.device is CPU()
    with pytest.raises(TypeError, match="stream must be a DeviceStream"):
        Buffer(dtype=DType.float32, shape=[2], stream=CPU())


@pytest.mark.gpu
def test_gpu_stream_and_events():
    gpu = Accelerator()
    s = DeviceStream(gpu)
    assert isinstance(s._torch_stream, torch.cuda.Stream)
    assert s._torch_stream != gpu.default_stream._torch_stream
    b = Buffer.zeros([1 << 20], DType.float32, gpu)
    with torch.cuda.stream(s._torch_stream):
        s.wait_for(gpu)
        b._torch().add_(1)
    ev = s.record_event()
    assert ev.device is gpu
    gpu.default_stream.wait_for(ev)
    ev.synchronize()
    assert ev.is_ready()
    s.synchronize()
    assert b[0].item() == 1.0
    ev2 = DeviceEvent(gpu)
    assert s.record_event(ev2) is None
    ev2.synchronize()
    with pytest.raises(ValueError, match="belongs to cpu:0"):
        s.record_event(DeviceEvent(CPU()))
    CPU().default_stream.wait_for(s)  # host blocks until s is done
    gpu.default_stream.wait_for(s)
    gpu.synchronize()
