"""Streams and events.

On an accelerator a ``DeviceStream`` wraps a ``torch.cuda.Stream`` and a
``DeviceEvent`` wraps a ``torch.cuda.Event``.  On the CPU all work runs
synchronously on the calling thread, so a CPU stream is trivially in order: its
``synchronize`` and ``wait_for`` have nothing to wait for, and its events are
complete as soon as they are recorded.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from max.driver.device import CPU, Device

__all__ = ["DeviceStream", "DeviceEvent"]


def _check_device(device: Any, who: str) -> Device:
    if not isinstance(device, Device):
        raise TypeError(f"{who}: expected a Device, got {type(device).__name__} {device!r}")
    return device


class DeviceEvent:
    """A marker recorded on a stream; complete once the work before it has run.

    ``DeviceEvent(device=CPU(), enable_timing=False)``.  Events made by
    ``DeviceStream.record_event()`` are already recorded.
    """

    __slots__ = ("_device", "_ev", "_recorded")

    def __init__(self, device: Optional[Device] = None, enable_timing: bool = False) -> None:
        device = CPU() if device is None else _check_device(device, "DeviceEvent")
        self._device = device
        self._recorded = False
        self._ev = None if device.is_host else torch.cuda.Event(enable_timing=enable_timing)

    @property
    def device(self) -> Device:
        """The device whose streams this event can be recorded on."""
        return self._device

    @property
    def _torch_event(self):
        """The wrapped ``torch.cuda.Event`` (None on the CPU)."""
        return self._ev

    def is_ready(self) -> bool:
        """True when all work captured by the event has finished."""
        if self._ev is None:
            return True
        return bool(self._ev.query())

    query = is_ready

    def synchronize(self) -> None:
        """Block until the captured work has finished; ValueError if it failed."""
        if self._ev is None:
            return
        try:
            self._ev.synchronize()
        except RuntimeError as e:
            raise ValueError(f"DeviceEvent on {self._device}: an enqueued operation failed: {e}") from e

    def elapsed_time(self, end: "DeviceEvent") -> float:
        """Milliseconds between this event and ``end`` (GPU events made with enable_timing=True)."""
        if not isinstance(end, DeviceEvent):
            raise TypeError(f"elapsed_time: expected a DeviceEvent, got {type(end).__name__}")
        if self._ev is None or end._ev is None:
            raise ValueError("elapsed_time: timing is only available for accelerator events")
        return float(self._ev.elapsed_time(end._ev))

    def __repr__(self) -> str:
        return f"DeviceEvent(device={self._device})"


def _virtual(device: Device) -> bool:
    """A virtual (compile-only) device has no queue to run work on."""
    return device._tdev.type == "meta"


class DeviceStream:
    """An in-order stream of work on a device.

    ``DeviceStream(device)`` creates a new stream; ``device.default_stream`` is the
    one every device starts with.
    """

    __slots__ = ("_device", "_ts", "__weakref__")

    def __init__(self, device: Device) -> None:
        device = _check_device(device, "DeviceStream")
        self._device = device
        self._ts = None if device.is_host or _virtual(device) else torch.cuda.Stream(device=device._torch_device)

    @classmethod
    def _default_for(cls, device: Device) -> "DeviceStream":
        s = object.__new__(cls)
        s._device = device
        s._ts = None if device.is_host or _virtual(device) else torch.cuda.default_stream(device._torch_device)
        return s

    @classmethod
    def _from_torch(cls, stream: Any) -> "DeviceStream":
        """Wrap an existing ``torch.cuda.Stream``."""
        from max.driver.device import device_from_torch

        s = object.__new__(cls)
        s._device = device_from_torch(stream.device)
        s._ts = stream
        return s

    @property
    def device(self) -> Device:
        """The device this stream runs on."""
        return self._device

    @property
    def _torch_stream(self):
        """The wrapped ``torch.cuda.Stream`` (None for a CPU stream)."""
        return self._ts

    def synchronize(self) -> None:
        """Block until all work on this stream has finished; ValueError if it failed."""
        if self._ts is None:
            return
        try:
            self._ts.synchronize()
        except RuntimeError as e:
            raise ValueError(f"{self!r}: an enqueued operation failed: {e}") from e

    def wait_for(self, other: "DeviceStream | Device | DeviceEvent") -> None:
        """Make later work on this stream wait for ``other``.

        ``other`` is a stream, a device (its default stream) or a recorded event.
        A CPU stream waits by blocking the host until ``other`` is done.
        """
        if isinstance(other, Device):
            other = other.default_stream
        if isinstance(other, DeviceEvent):
            if other._ev is None:
                return
            if self._ts is None:
                other.synchronize()
            else:
                self._ts.wait_event(other._ev)
            return
        if not isinstance(other, DeviceStream):
            raise TypeError(
                "wait_for: expected a DeviceStream, Device or DeviceEvent, "
                f"got {type(other).__name__} {other!r}"
            )
        if other._ts is None or other is self:
            return  # host work is already complete when it returns
        if self._ts is None:
            other.synchronize()
        else:
            self._ts.wait_stream(other._ts)

    def record_event(self, event: Optional[DeviceEvent] = None) -> Optional[DeviceEvent]:
        """Record an event capturing all work submitted so far.

        With no argument a new ``DeviceEvent`` is returned; with one, that event is
        re-recorded and None is returned.  ValueError if recording fails (for
        example an event belonging to another device).
        """
        if event is None:
            ev = DeviceEvent(self._device)
            self._record(ev)
            return ev
        if not isinstance(event, DeviceEvent):
            raise TypeError(f"record_event: expected a DeviceEvent, got {type(event).__name__} {event!r}")
        if event._device != self._device:
            raise ValueError(
                f"record_event: the event belongs to {event._device} but this stream runs on {self._device}"
            )
        self._record(event)
        return None

    def _record(self, ev: DeviceEvent) -> None:
        if self._ts is not None:
            try:
                ev._ev.record(self._ts)
            except RuntimeError as e:
                raise ValueError(f"record_event on {self!r} failed: {e}") from e
        ev._recorded = True

    def __repr__(self) -> str:
        kind = "default" if self._is_default() else "user"
        return f"DeviceStream(device={self._device}, {kind})"

    def _is_default(self) -> bool:
        return self is self._device.default_stream
