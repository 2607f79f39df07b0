"""Build libremax's native CPU kernels (``csrc/*.c``) into shared libraries, one per ISA variant.

Every variant is the same sources compiled with explicit target flags (not ``-march=native``), so
a variant runs on any CPU that has its features and can be built -- and tested -- on any host
whose compiler targets it:

======== ============================================= =========================================
variant  compiled for                                  runs where the CPU reports
======== ============================================= =========================================
avx512   x86-64-v4 + AVX-512 VNNI                      avx512f/bw/vl/dq + avx512_vnni
avxvnni  x86-64-v3 + AVX-VNNI (VEX ``vpdpbusd``)        avx2 + fma + f16c + avx_vnni
avx2     x86-64-v3 (AVX2, FMA, F16C, BMI2)             avx2 + fma + f16c
neondot  armv8.2-a + dotprod (``sdot``)                 asimd + asimddp
neon     armv8-a (NEON is part of every AArch64 CPU)   asimd
generic  the baseline of the architecture, no SIMD     anything
======== ============================================= =========================================

At run time :func:`choose` picks the first variant of that list the CPU can execute (like
llama.cpp's per-ISA CPU backends); ``LIBREMAX_NATIVE_ISA`` forces one (``native`` or ``auto``:
the automatic choice), and naming one this CPU cannot run is an error that lists the ones it can.

Each library is compiled on first use with the system C compiler and cached under
``$LIBREMAX_CACHE_DIR`` (default ``~/.cache/libremax``), keyed by the sources, the flags and the
compiler.  It links OpenMP dynamically as ``libgomp.so.1``: loaded after torch, the dynamic linker
resolves that to the libgomp torch already loaded, so torch's operators and these kernels run on
one thread pool.  ``LIBREMAX_NATIVE=0`` disables the kernels (torch only).

:func:`build_program` compiles a variant's kernels with a C driver into an executable, with any
compiler: the tests cross-compile the ARM variants that way and run them under qemu-user.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

SRC_DIR = Path(__file__).with_name("csrc")

X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")
ARM64 = platform.machine().lower() in ("aarch64", "arm64")

# variant -> (architecture, compiler flags, CPU features it needs), best first per architecture.
VARIANTS: dict[str, tuple[str, tuple[str, ...], frozenset[str]]] = {
    "avx512": ("x86_64", ("-march=x86-64-v4", "-mavx512vnni", "-mtune=generic"),
               frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx2", "fma", "f16c"})),
    "avxvnni": ("x86_64", ("-march=x86-64-v3", "-mavxvnni", "-mtune=generic"),
                frozenset({"avx2", "fma", "f16c", "bmi2", "avx_vnni"})),
    "avx2": ("x86_64", ("-march=x86-64-v3", "-mtune=generic"), frozenset({"avx2", "fma", "f16c", "bmi2"})),
    "neondot": ("aarch64", ("-march=armv8.2-a+dotprod",), frozenset({"asimd", "asimddp"})),
    "neon": ("aarch64", ("-march=armv8-a",), frozenset({"asimd"})),
    "generic": ("any", ("-DLMX_PORTABLE",), frozenset()),  # no SIMD paths (NEON is on by default on AArch64)
}
ALIASES = ("native", "auto")


class NativeBuildError(RuntimeError):
    """The kernels could not be compiled (no compiler, or it failed), or the ISA asked for is unusable."""


def cache_dir() -> Path:
    root = os.environ.get("LIBREMAX_CACHE_DIR")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "libremax"


def atomic_write(path: Path, chunks: list) -> None:
    """Write ``chunks`` (bytes-like) to ``path`` through a temporary file renamed into place, so a concurrent
    reader sees the old file or the whole new one; the temporary file is removed when writing fails (OSError
    is raised)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            for c in chunks:
                f.write(c)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


@functools.lru_cache(maxsize=None)
def cpu_features() -> frozenset[str]:
    """The feature flags the CPU reports (``/proc/cpuinfo``'s ``flags`` or ``Features`` line)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset({"asimd"}) if ARM64 else frozenset()  # e.g. macOS: every arm64 CPU has NEON


def _arch_matches(arch: str) -> bool:
    return arch == "any" or (arch == "x86_64" and X86) or (arch == "aarch64" and ARM64)


def runnable(features: frozenset[str] | None = None) -> list[str]:
    """The variants this CPU can execute, best first."""
    feats = cpu_features() if features is None else features
    return [v for v, (arch, _, need) in VARIANTS.items() if _arch_matches(arch) and need <= feats]


def choose(requested: str | None = None) -> str:
    """The variant to run: ``requested`` (None: ``LIBREMAX_NATIVE_ISA``, as ``max.engine.backend`` reads it),
    else the best this CPU runs."""
    if requested is None:
        from max.engine.backend import environment

        requested = environment().isa
    req = requested.strip().lower()
    can = runnable()
    if req in ("", *ALIASES):
        return can[0]
    if req not in VARIANTS:
        raise NativeBuildError(f"LIBREMAX_NATIVE_ISA={req!r} is not a kernel variant: choose one of "
                               f"{', '.join(VARIANTS)} (or 'native' for the best this CPU runs: {can[0]})")
    if req not in can:
        raise NativeBuildError(f"LIBREMAX_NATIVE_ISA={req!r}: this CPU cannot run the {req} kernels; "
                               f"it can run: {', '.join(can)}")
    return req


def flags_for(isa: str) -> list[str]:
    return ["-O3", *VARIANTS[isa][1], "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off", "-fno-math-errno",
            "-fvisibility=hidden", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wno-unused-function"]


def _key(cc: str, flags: list[str], extra: list[Path]) -> str:
    """16 hex digits naming a build: the kernel sources and headers, ``extra`` files, the flags, the
    machine and the compiler's version."""
    h = hashlib.sha256()
    for p in sorted(SRC_DIR.glob("*.c")) + sorted(SRC_DIR.glob("*.h")) + extra:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    h.update(" ".join([cc, *flags]).encode())
    h.update(platform.machine().encode())
    try:
        h.update(subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout.encode())
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeBuildError(f"{cc} --version failed: {e}") from None
    return h.hexdigest()[:16]


def _compile(cmd: list[str], out_dir: Path, target: Path, what: str, mode: int | None = None) -> Path:
    """Run ``cmd`` (whose output path is the placeholder ``{out}``) into a temporary file, then move it
    to ``target`` atomically, so concurrent builders never see a partial file."""
    fd, tmp = tempfile.mkstemp(dir=out_dir)
    os.close(fd)
    cmd = [tmp if c == "{out}" else c for c in cmd]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        os.unlink(tmp)
        raise NativeBuildError(f"compiling {what} failed: {e}") from None
    if r.returncode != 0:
        os.unlink(tmp)
        raise NativeBuildError(f"compiling {what} failed ({' '.join(cmd[:4])} ...):\n{r.stderr[-4000:]}")
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, target)
    return target


def library_path(isa: str | None = None) -> Path:
    """Build (if needed) and return the shared library of variant ``isa`` (default: :func:`choose`)."""
    isa = choose(isa)
    cc = _compiler()
    if cc is None:
        raise NativeBuildError("no C compiler found (set CC, or install gcc/clang)")
    flags = flags_for(isa)
    out_dir = cache_dir() / "native"
    target = out_dir / f"libremax_kernels_{isa}_{_key(cc, flags, [])}.so"
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
    sources = [str(p) for p in sorted(SRC_DIR.glob("*.c"))]
    return _compile([cc, *flags, "-I", str(SRC_DIR), *sources, "-o", "{out}", "-lm"], out_dir, target,
                    f"the {isa} native kernels")


def build_program(isa: str, main: str | os.PathLike, cc: str, extra_flags: tuple[str, ...] = ("-static",),
                  out_dir: str | os.PathLike | None = None) -> Path:
    """Compile the kernels of variant ``isa`` with its flags plus the C file ``main`` (which has the
    ``main()``) into an executable with compiler ``cc`` -- e.g. ``aarch64-linux-gnu-gcc`` for an ARM
    variant on an x86 host, statically linked so an emulator (qemu-user) runs it without a sysroot.

    Unlike :func:`library_path` this does not check that this CPU runs the variant.  Cached under
    ``out_dir`` (default: the library cache), keyed like the libraries."""
    if isa not in VARIANTS:
        raise NativeBuildError(f"{isa!r} is not a kernel variant: choose one of {', '.join(VARIANTS)}")
    main = Path(main)
    flags = [f for f in flags_for(isa) if f not in ("-fPIC", "-shared")] + list(extra_flags)
    out = Path(out_dir) if out_dir is not None else cache_dir() / "native"
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{main.stem}_{isa}_{_key(cc, flags, [main])}"
    if target.exists():
        return target
    sources = [str(p) for p in sorted(SRC_DIR.glob("*.c"))]
    return _compile([cc, *flags, "-I", str(SRC_DIR), *sources, str(main), "-o", "{out}", "-lm"], out, target,
                    f"{main.name} with the {isa} kernels", mode=0o755)
