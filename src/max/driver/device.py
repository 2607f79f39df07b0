"""Devices: the host CPU and accelerators (torch CUDA or ROCm/HIP devices).

``Device`` is the base class; ``CPU`` and ``Accelerator`` are subclasses that are
called like constructors (``CPU()``, ``Accelerator(id=-1)``) and also work with
``isinstance``.  Devices are cached singletons per ``(label, id)``, so ``is`` and
``==`` are both cheap and agree.

Choices where the reference pages disagree or are silent:

* ``CPU(id)``: the newer page says a CPU's id is always 0, the older one calls it
  a NUMA node.  libremax does not model NUMA nodes: every ``id >= -1`` names the
  one host device, whose ``id`` is 0.
* ``accelerator_api()`` returns ``"cpu"`` when there is no accelerator (so code
  that branches on it runs on CPU-only hosts); ``accelerator_architecture_name()``
  raises ValueError there, like ``Device.architecture_name`` on a CPU.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Literal, Mapping

import torch

__all__ = [
    "Device",
    "CPU",
    "Accelerator",
    "DeviceSpec",
    "device_from_torch",
    "accelerator_count",
    "accelerator_api",
    "accelerator_architecture_name",
    "devices_exist",
    "load_devices",
    "scan_available_devices",
]

_LOCK = threading.RLock()
_CPU_TDEV = torch.device("cpu")
_CACHE: dict[tuple[str, int], "Device"] = {}


def _check_id(id: Any, who: str) -> int:
    if isinstance(id, bool) or not hasattr(id, "__index__"):
        raise TypeError(f"{who}: id must be an int, got {type(id).__name__} {id!r}")
    id = int(id.__index__())
    if id < -1:
        raise ValueError(f"{who}: id must be -1 (the default device) or a non-negative int, got {id}")
    return id


def accelerator_count() -> int:
    """Number of accelerators torch can see (0 on a CPU-only host); in virtual device mode
    (``set_virtual_device_count``), the virtual count."""
    from max.driver import virtual

    if virtual.is_virtual_device_mode():
        return virtual.get_virtual_device_count()
    try:
        if not torch.cuda.is_available():
            return 0
        return int(torch.cuda.device_count())
    except Exception:  # a broken driver install reads as "no accelerator"
        return 0


def _is_hip() -> bool:
    return getattr(torch.version, "hip", None) is not None


def accelerator_api() -> str:
    """``"cuda"`` for NVIDIA GPUs, ``"hip"`` for AMD GPUs; ``"cpu"`` when none exists."""
    if accelerator_count() == 0:
        return "cpu"
    from max.driver import virtual

    if virtual.is_virtual_device_mode():
        return virtual.get_virtual_device_api() or "cuda"
    return "hip" if _is_hip() else "cuda"


def accelerator_architecture_name() -> str:
    """Architecture name of the first accelerator (``sm_90``, ``gfx942``...).

    Raises ValueError when no accelerator is available.
    """
    return Accelerator()._arch_name()


class Device:
    """A device: the host CPU or an accelerator.

    ``Device(x)`` accepts a Device, a ``DeviceSpec``, a ``torch.device`` or a
    string such as ``"cpu"``, ``"gpu:1"`` or ``"cuda:0"`` and returns the cached
    ``CPU`` / ``Accelerator`` instance for it.
    """

    __slots__ = ("_label", "_id", "_tdev", "_stream", "__weakref__")

    _label: str
    _id: int
    _tdev: torch.device

    def __new__(cls, *args: Any, **kwargs: Any) -> "Device":
        if cls is not Device:  # pragma: no cover - subclasses define __new__
            raise TypeError(f"{cls.__name__} must define __new__")
        if len(args) + len(kwargs) != 1:
            raise TypeError(
                "Device() takes exactly one argument (a Device, DeviceSpec, torch.device "
                f"or a string like 'cpu' or 'gpu:0'), got {len(args) + len(kwargs)}"
            )
        (value,) = list(args) + list(kwargs.values())
        return _device_from_any(value)

    @classmethod
    def _make(cls, label: str, id: int, tdev: torch.device) -> "Device":
        key = (label, id, tdev.type == "meta")
        dev = _CACHE.get(key)
        if dev is not None:
            return dev
        with _LOCK:
            dev = _CACHE.get(key)
            if dev is None:
                dev = object.__new__(cls)
                dev._label = label
                dev._id = id
                dev._tdev = tdev
                dev._stream = None
                _CACHE[key] = dev
        return dev

    # ---------------------------------------------------------------- factories
    @classmethod
    def cpu(cls, id: int = -1) -> "CPU":
        """The host CPU device (``Device.cpu()``)."""
        return CPU(id)

    @classmethod
    def accelerator(cls, id: int = -1) -> "Accelerator":
        """An accelerator device; ``id=-1`` is the first one."""
        return Accelerator(id)

    # ---------------------------------------------------------------- identity
    @property
    def label(self) -> str:
        """``"cpu"`` for the host, ``"gpu"`` for accelerators."""
        return self._label

    @property
    def id(self) -> int:
        """Zero-based id; always 0 for the CPU."""
        return self._id

    @property
    def api(self) -> str:
        """``"cpu"``, ``"cuda"`` (NVIDIA) or ``"hip"`` (AMD)."""
        if self._label == "cpu":
            return "cpu"
        if self._tdev.type == "meta":  # a virtual device
            from max.driver import virtual

            return virtual.get_virtual_device_api() or "cuda"
        return "hip" if _is_hip() else "cuda"

    @property
    def is_host(self) -> bool:
        """True for the CPU."""
        return self._label == "cpu"

    @property
    def _torch_device(self) -> torch.device:
        """The ``torch.device`` this device maps to (``cpu`` or ``cuda:N``); ValueError for a virtual
        device, which has no memory to hold or run anything."""
        if self._tdev.type == "meta":
            raise ValueError(f"{self} is a virtual device (compile-only mode, set_virtual_device_count): it has "
                             "no memory, so buffers cannot be allocated and nothing can run on it")
        return self._tdev

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Device):
            return NotImplemented
        return self._label == other._label and self._id == other._id

    def __hash__(self) -> int:
        return hash((self._label, self._id))

    def __repr__(self) -> str:
        return f"Device(type={self._label},id={self._id})"

    __str__ = __repr__  # MAX prints Device(type=cpu,id=0) for both

    def __reduce__(self):
        return (_device_by_key, (self._label, self._id))

    # ---------------------------------------------------------------- properties
    @property
    def is_compatible(self) -> bool:
        """Whether libremax can run work on this device (the torch build supports it)."""
        if self._label == "cpu":
            return True
        try:
            arch = self._arch_name()
            archs = torch.cuda.get_arch_list()
        except Exception:
            return False
        if not archs or arch in archs:
            return True
        if _is_hip():
            return False
        # PTX for an older compute capability can be JIT-compiled for this one.
        cap = int(arch[3:]) if arch.startswith("sm_") and arch[3:].isdigit() else None
        for a in archs:
            if cap is not None and a.startswith("compute_") and a[8:].isdigit():
                if int(a[8:]) <= cap:
                    return True
        return False

    @property
    def is_compatible_with_max(self) -> bool:
        """Older name of :attr:`is_compatible`."""
        return self.is_compatible

    def _arch_name(self) -> str:
        if self._label == "cpu":
            raise ValueError(f"failed to get device architecture name: Not implemented for device: {self._label}")
        if self._tdev.type == "meta":  # a virtual device (max.driver.virtual)
            from max.driver import virtual

            arch = virtual.get_virtual_device_target_arch()
            if not arch:
                raise ValueError(f"{self} is a virtual device with no target architecture; call "
                                 "set_virtual_device_target_arch() before set_virtual_device_count()")
            return arch
        if _is_hip():
            props = torch.cuda.get_device_properties(self._id)
            return str(getattr(props, "gcnArchName", "gfx")).split(":")[0]
        major, minor = torch.cuda.get_device_capability(self._id)
        return f"sm_{major}{minor}"

    @property
    def architecture_name(self) -> str:
        """``sm_80``/``sm_90`` (NVIDIA) or ``gfx942`` (AMD); ValueError on a CPU."""
        return self._arch_name()

    def can_access(self, other: "Device") -> bool:
        """Whether this device can directly access ``other``'s memory."""
        if not isinstance(other, Device):
            raise TypeError(f"can_access: expected a Device, got {type(other).__name__} {other!r}")
        if self == other:
            return True
        if self.is_host or other.is_host:
            return False
        try:
            return bool(torch.cuda.can_device_access_peer(self._id, other._id))
        except Exception:
            return False

    @property
    def default_stream(self):
        """The device's default ``DeviceStream``."""
        s = self._stream
        if s is None:
            from max.driver.stream import DeviceStream

            with _LOCK:
                if self._stream is None:
                    self._stream = DeviceStream._default_for(self)
                s = self._stream
        return s

    def synchronize(self) -> None:
        """Wait for all work on the device; ValueError if any of it failed."""
        if self._label == "cpu":
            return
        try:
            torch.cuda.synchronize(self._tdev)
        except RuntimeError as e:
            raise ValueError(f"{self}: an enqueued operation failed: {e}") from e

    @property
    def max_single_alloc_size(self) -> int:
        """The largest single allocation (bytes) the device allows: its physical memory (host RAM
        for the CPU, total memory for an accelerator)."""
        if self._label == "cpu":
            try:
                return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
            except (ValueError, OSError, AttributeError):
                import psutil  # pragma: no cover - platforms without sysconf

                return int(psutil.virtual_memory().total)
        return int(torch.cuda.get_device_properties(self._id).total_memory)

    @property
    def stats(self) -> Mapping[str, Any]:
        """Utilisation data: memory totals in bytes (and allocator counters on GPUs)."""
        if self._label == "cpu":
            out: dict[str, Any] = {"device": f"{self._label}:{self._id}", "cpu_count": os.cpu_count()}
            try:
                page = os.sysconf("SC_PAGE_SIZE")
                out["total_memory"] = os.sysconf("SC_PHYS_PAGES") * page
                out["free_memory"] = os.sysconf("SC_AVPHYS_PAGES") * page
            except (ValueError, OSError, AttributeError):
                pass
            return out
        free, total = torch.cuda.mem_get_info(self._id)
        return {
            "device": f"{self._label}:{self._id}",
            "name": torch.cuda.get_device_name(self._id),
            "free_memory": int(free),
            "total_memory": int(total),
            "allocated_memory": int(torch.cuda.memory_allocated(self._id)),
            "reserved_memory": int(torch.cuda.memory_reserved(self._id)),
            "max_allocated_memory": int(torch.cuda.max_memory_allocated(self._id)),
        }


class CPU(Device):
    """The host CPU.  ``CPU()`` / ``CPU(id=-1)``; every id names the one host device (id 0)."""

    __slots__ = ()

    def __new__(cls, id: int = -1) -> "CPU":
        _check_id(id, f"CPU(id={id!r})")
        return CPU._make("cpu", 0, _CPU_TDEV)


class Accelerator(Device):
    """An accelerator (a torch CUDA or ROCm device).  ``id=-1`` picks the first one."""

    __slots__ = ()

    def __new__(cls, id: int = -1) -> "Accelerator":
        id = _check_id(id, f"Accelerator(id={id!r})")
        n = accelerator_count()
        if n == 0:
            raise ValueError(
                f"Accelerator(id={id}): no accelerator is available "
                "(torch.cuda.is_available() is False); use CPU() instead"
            )
        if id == -1:
            id = 0
        if id >= n:
            raise ValueError(
                f"Accelerator(id={id}): only {n} accelerator{'s' if n != 1 else ''} "
                f"exist{'s' if n == 1 else ''} (valid ids: 0..{n - 1})"
            )
        from max.driver import virtual

        if virtual.is_virtual_device_mode():
            # No memory behind it: buffers carry shape and dtype only (torch's meta device).
            return Accelerator._make("gpu", id, torch.device("meta"))
        return Accelerator._make("gpu", id, torch.device("cuda", id))


def _device_by_key(label: str, id: int) -> Device:
    return CPU(id) if label == "cpu" else Accelerator(id)


def device_from_torch(torch_device: Any) -> Device:
    """The Device for a ``torch.device`` (or a string torch understands)."""
    cached = _TORCH_DEV_CACHE.get(torch_device)
    if cached is not None:
        return cached
    try:
        td = torch.device(torch_device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device_from_torch: {torch_device!r} is not a torch device") from e
    if td.type == "cpu":
        dev: Device = CPU()
    elif td.type == "cuda":
        idx = td.index if td.index is not None else torch.cuda.current_device()
        dev = Accelerator(idx)
    else:
        raise ValueError(
            f"device_from_torch: torch device {td} is not supported; expected 'cpu' or 'cuda[:N]'"
        )
    if isinstance(torch_device, torch.device) and (td.type == "cpu" or td.index is not None):
        _TORCH_DEV_CACHE[torch_device] = dev
    return dev


_TORCH_DEV_CACHE: dict[Any, Device] = {}


def _device_from_any(value: Any) -> Device:
    if isinstance(value, Device):
        return value
    if isinstance(value, DeviceSpec):
        return _device_by_key(value.device_type, value.id)
    if isinstance(value, torch.device):
        return device_from_torch(value)
    if isinstance(value, str):
        s = value.strip().lower()
        kind, _, num = s.partition(":")
        if num and not num.lstrip("-").isdigit():
            raise ValueError(f"Device({value!r}): expected 'cpu', 'gpu', 'gpu:N' or 'cuda:N'")
        idx = int(num) if num else -1
        if kind == "cpu":
            return CPU(idx)
        if kind in ("gpu", "cuda", "hip", "accelerator"):
            return Accelerator(idx)
        raise ValueError(f"Device({value!r}): expected 'cpu', 'gpu', 'gpu:N' or 'cuda:N'")
    raise TypeError(
        "Device(): expected a Device, DeviceSpec, torch.device or a string like 'gpu:0', "
        f"got {type(value).__name__} {value!r}"
    )


@dataclass(frozen=True)
class DeviceSpec:
    """A device description: ``id`` and ``device_type`` (``"cpu"`` or ``"gpu"``)."""

    id: int
    device_type: Literal["cpu", "gpu"] = "cpu"

    def __post_init__(self) -> None:
        if self.device_type not in ("cpu", "gpu"):
            raise ValueError(
                f"DeviceSpec: device_type must be 'cpu' or 'gpu', got {self.device_type!r}"
            )
        _check_id(self.id, f"DeviceSpec(id={self.id!r})")

    @staticmethod
    def cpu(id: int = -1) -> "DeviceSpec":
        """A CPU spec."""
        return DeviceSpec(id, "cpu")

    @staticmethod
    def accelerator(id: int = 0) -> "DeviceSpec":
        """An accelerator spec (default id 0)."""
        return DeviceSpec(id, "gpu")


def _check_specs(specs: Any, who: str) -> list[DeviceSpec]:
    if isinstance(specs, DeviceSpec):
        return [specs]
    try:
        items = list(specs)
    except TypeError:
        raise TypeError(f"{who}: expected a list of DeviceSpec, got {type(specs).__name__}") from None
    for s in items:
        if not isinstance(s, DeviceSpec):
            raise TypeError(f"{who}: expected DeviceSpec entries, got {type(s).__name__} {s!r}")
    return items


def devices_exist(devices: list[DeviceSpec]) -> bool:
    """Whether every spec names a device that exists on this host."""
    n = accelerator_count()
    for s in _check_specs(devices, "devices_exist"):
        if s.device_type == "gpu" and not (n > 0 and s.id < n):
            return False
    return True


def load_devices(device_specs: list[DeviceSpec]) -> list[Device]:
    """The devices for the given specs (ValueError for one that does not exist)."""
    return [_device_by_key(s.device_type, s.id) for s in _check_specs(device_specs, "load_devices")]


def scan_available_devices() -> list[DeviceSpec]:
    """Specs of all accelerators, or ``[DeviceSpec.cpu()]`` when there are none."""
    n = accelerator_count()
    if n == 0:
        return [DeviceSpec.cpu()]
    return [DeviceSpec.accelerator(i) for i in range(n)]
