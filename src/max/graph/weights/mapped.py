"""Address ranges of read-only memory-mapped checkpoint files, and dropping their resident pages.

A loader registers each file mapping it makes (never written to: private copy-on-write or read-only
mappings of the checkpoint).  Whoever copies or repacks a tensor that views such a mapping can then
tell the kernel that this process is done with those pages: they leave the process's resident set
and are read back from the page cache if anything touches them again (``MADV_DONTNEED`` on a clean
file mapping).  Nothing is ever lost; on other memory the calls do nothing.

A mapping of a whole file may be registered with the file's path and identity (:func:`file_identity`,
taken when it was mapped): :func:`source` then says which file and byte offset an address views, so a
consumer can key what it derives from those bytes by the file (the packed-weight cache does).
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import mmap
import os
import threading

__all__ = ["contains", "drop_pages", "file_identity", "register", "source", "unregister"]

_lock = threading.Lock()
_starts: list[int] = []
_ends: list[int] = []
_files: dict[int, tuple[str, tuple]] = {}  # start -> (path, identity) of a whole-file mapping
_PAGE = mmap.PAGESIZE
_libc = None


def file_identity(path: str) -> tuple:
    """What tells one version of a file from another without reading it: the real path, device, inode,
    size, modification and status-change times (``st_ctime_ns`` changes on every write and cannot be set
    back, unlike the modification time)."""
    st = os.stat(path)
    return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def register(start: int, nbytes: int, path: str | None = None, identity: tuple | None = None) -> None:
    """Declare ``[start, start + nbytes)`` a read-only file mapping whose pages may be dropped; with
    ``path`` and ``identity`` (:func:`file_identity` of the file when it was mapped), a mapping of that
    whole file from its first byte."""
    with _lock:
        i = bisect.bisect(_starts, start)
        _starts.insert(i, start)
        _ends.insert(i, start + nbytes)
        if path is not None and identity is not None:
            _files[start] = (path, identity)


def unregister(start: int) -> None:
    with _lock:
        i = bisect.bisect_left(_starts, start)
        if i < len(_starts) and _starts[i] == start:
            del _starts[i], _ends[i]
        _files.pop(start, None)


def source(ptr: int, nbytes: int) -> tuple[str, tuple, int] | None:
    """``(path, identity, offset)`` of the file bytes ``[ptr, ptr + nbytes)`` view, when they lie inside a
    mapping registered with its file; else None."""
    with _lock:
        i = bisect.bisect(_starts, ptr) - 1
        if i < 0 or ptr + nbytes > _ends[i] or _starts[i] not in _files:
            return None
        path, ident = _files[_starts[i]]
        return path, ident, ptr - _starts[i]


def contains(ptr: int, nbytes: int) -> bool:
    """Whether ``[ptr, ptr + nbytes)`` lies inside a registered mapping."""
    with _lock:
        i = bisect.bisect(_starts, ptr) - 1
        return i >= 0 and ptr + nbytes <= _ends[i]


def drop_pages(ptr: int, nbytes: int) -> bool:
    """Drop the resident whole pages of ``[ptr, ptr + nbytes)`` if it lies inside a registered mapping.

    Returns whether anything was dropped.  Pages shared with neighbouring tensors are dropped too (they
    fault back in when read); partial pages at the ends are kept.
    """
    global _libc
    if not contains(ptr, nbytes) or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    lo = -(-ptr // _PAGE) * _PAGE
    hi = (ptr + nbytes) // _PAGE * _PAGE
    if hi <= lo:
        return False
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc.madvise.restype = ctypes.c_int
    return _libc.madvise(lo, hi - lo, mmap.MADV_DONTNEED) == 0
