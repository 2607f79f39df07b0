"""Build libremax's native CPU kernels (``csrc/*.c``) into a shared library, once per machine.

The library is compiled with the system C compiler for the CPU it runs on
(``-march=native``) and cached under ``$LIBREMAX_CACHE_DIR`` (default
``~/.cache/libremax``), keyed by the sources, the flags, the compiler and the
CPU.  It links OpenMP dynamically as ``libgomp.so.1``: loaded after torch, the
dynamic linker resolves that to the libgomp torch already loaded, so torch's
operators and these kernels run on one thread pool.

``LIBREMAX_NATIVE=0`` disables the library (torch kernels only);
``LIBREMAX_NATIVE_ISA=generic`` builds a portable variant without SIMD paths
(used by the tests to check the scalar code).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

SRC_DIR = Path(__file__).with_name("csrc")


class NativeBuildError(RuntimeError):
    """The kernels could not be compiled (no compiler, or it failed)."""


def cache_dir() -> Path:
    root = os.environ.get("LIBREMAX_CACHE_DIR")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "libremax"


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


def _cpu_signature() -> str:
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = line
                    break
    except OSError:
        pass
    return platform.machine() + flags


def flags_for(isa: str) -> list[str]:
    arch = ["-march=native"] if isa == "native" else ["-march=x86-64"] if platform.machine() in ("x86_64", "AMD64") else []
    return ["-O3", *arch, "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off", "-fno-math-errno",
            "-fvisibility=hidden", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wno-unused-function"]


def library_path(isa: str | None = None) -> Path:
    """Build (if needed) and return the shared library for ``isa`` ('native' or 'generic')."""
    isa = isa or os.environ.get("LIBREMAX_NATIVE_ISA", "native")
    if isa not in ("native", "generic"):
        raise NativeBuildError(f"LIBREMAX_NATIVE_ISA must be 'native' or 'generic', got {isa!r}")
    cc = _compiler()
    if cc is None:
        raise NativeBuildError("no C compiler found (set CC, or install gcc/clang)")
    sources = sorted(SRC_DIR.glob("*.c"))
    headers = sorted(SRC_DIR.glob("*.h"))
    flags = flags_for(isa)
    h = hashlib.sha256()
    for p in sources + headers:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    h.update(" ".join(flags).encode())
    try:
        h.update(subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout.encode())
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeBuildError(f"{cc} --version failed: {e}") from None
    if isa == "native":
        h.update(_cpu_signature().encode())
    out_dir = cache_dir() / "native"
    target = out_dir / f"libremax_kernels_{isa}_{h.hexdigest()[:16]}.so"
    if target.exists():
        return target
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        out_dir = Path(tempfile.gettempdir()) / "libremax-native"
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / target.name
        if target.exists():
            return target
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    cmd = [cc, *flags, "-I", str(SRC_DIR), *map(str, sources), "-o", tmp, "-lm"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        os.unlink(tmp)
        raise NativeBuildError(f"compiling the native kernels failed: {e}") from None
    if r.returncode != 0:
        os.unlink(tmp)
        raise NativeBuildError(f"compiling the native kernels failed ({' '.join(cmd[:3])} ...):\n{r.stderr[-4000:]}")
    os.replace(tmp, target)  # atomic: concurrent builders never see a partial file
    return target
