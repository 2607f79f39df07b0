"""Virtual devices (compile-only mode) and the virtual CPU target.

``set_virtual_device_count(n)`` with ``n > 0`` makes the driver report ``n``
accelerators whatever the hardware: ``accelerator_count()`` returns ``n`` and
``Accelerator(i)`` (``0 <= i < n``) returns a *virtual* device.  A virtual
device has no memory: buffers on it carry shape and dtype only (torch's
``meta`` device), so graphs can be built and typed for a GPU configuration
that does not match this machine, but nothing runs on it, and reading a
buffer's values raises.  ``set_virtual_device_api`` / ``set_virtual_device_target_arch``
name the API (``"cuda"``, ``"hip"``, ``"metal"``) and architecture
(``"sm_90"``...) those devices report; set them before the count.  ``0``
turns the mode off.

``set_virtual_cpu_target(name)`` records the LLVM target-CPU name CPU kernels
are meant for (``"x86-64-v3"``, ``"generic"``...; ``""`` restores the host
CPU; ``"native"`` is refused).  libremax's CPU kernels are compiled once for
the host by the C toolchain, so the value is recorded and reported, not used
for code generation.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = [
    "get_virtual_cpu_target", "get_virtual_device_api", "get_virtual_device_count",
    "get_virtual_device_target_arch", "is_virtual_device_mode", "set_virtual_cpu_target",
    "set_virtual_device_api", "set_virtual_device_count", "set_virtual_device_target_arch",
]

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"count": 0, "api": "", "arch": "", "cpu": ""}


def _check_str(value: Any, who: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{who}: expected a str, got {type(value).__name__} {value!r}")
    return value


def set_virtual_device_count(count: int) -> None:
    """Report ``count`` virtual accelerators (``0`` disables virtual device mode)."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"set_virtual_device_count: count must be an int, got {type(count).__name__} {count!r}")
    if count < 0:
        raise ValueError(f"set_virtual_device_count: count must be >= 0, got {count}")
    with _LOCK:
        _STATE["count"] = count


def get_virtual_device_count() -> int:
    """The number of virtual devices, or 0 when virtual device mode is off."""
    return int(_STATE["count"])


def is_virtual_device_mode() -> bool:
    """True while virtual device mode is on (a count > 0)."""
    return _STATE["count"] > 0


def set_virtual_device_api(api: str) -> None:
    """The API virtual devices report (``"cuda"``, ``"hip"``, ``"metal"``)."""
    api = _check_str(api, "set_virtual_device_api")
    if api not in ("", "cuda", "hip", "metal"):
        raise ValueError(f"set_virtual_device_api: unknown API {api!r} (expected 'cuda', 'hip' or 'metal')")
    _STATE["api"] = api


def get_virtual_device_api() -> str:
    """The API virtual devices report, or ``""`` when not set."""
    return str(_STATE["api"])


def set_virtual_device_target_arch(arch: str) -> None:
    """The architecture virtual devices report (``"sm_80"``, ``"sm_90"``, ``"gfx942"``...)."""
    _STATE["arch"] = _check_str(arch, "set_virtual_device_target_arch")


def get_virtual_device_target_arch() -> str:
    """The architecture virtual devices report, or ``""`` when not set."""
    return str(_STATE["arch"])


_X86 = ("x86_64", "amd64", "i386", "i686", "x86")


def set_virtual_cpu_target(cpu: str) -> None:
    """The LLVM target-CPU name CPU kernels are meant for; ``"generic"`` is the portable baseline of
    the host's architecture family, ``""`` the host CPU.  ValueError for ``"native"``."""
    cpu = _check_str(cpu, "set_virtual_cpu_target")
    if cpu == "native":
        raise ValueError("set_virtual_cpu_target: 'native' would tie kernels to this host's CPU; name a target "
                         "CPU (e.g. 'x86-64-v3') or use 'generic'")
    if cpu == "generic":
        import platform

        machine = platform.machine().lower()
        if machine in _X86:
            cpu = "x86-64"
        elif machine in ("aarch64", "arm64"):
            cpu = "generic"  # the armv8-a baseline
        else:
            raise ValueError(f"set_virtual_cpu_target: no generic baseline for host architecture {machine!r}")
    _STATE["cpu"] = cpu


def get_virtual_cpu_target() -> str:
    """The CPU target set with :func:`set_virtual_cpu_target` (``""``: the host CPU)."""
    return str(_STATE["cpu"])
