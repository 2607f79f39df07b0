"""The packed-weight cache: what :func:`max.engine.native.pack` made of a checkpoint's GGML blocks, kept on
disk and memory-mapped on the next load instead of repacking (the repack is most of a large GGUF's load).

Only weights read straight from a whole-file mapping registered with its file (``graph.weights.mapped``:
the GGUF loader's) are cached.  An entry is keyed by

* the **sha256 of the whole source file**: computed once, in a background thread while the first load
  packs, and remembered in a small sidecar keyed by the file's identity (real path, device, inode, size,
  modification and status-change times: ``mapped.file_identity``), so a later load of the same file does not
  read it again.  Any write to the file changes its status-change time, so a modified file is hashed afresh
  and never served another version's entries;
* the tensor's byte range in that file, its GGML kind, shape and row stride;
* the packed layout (``lmx_pack_layout()`` of the kernel library: a version the C code bumps with the layout).

Each entry is one file ``<cache_dir>/packed/<sha256>/<layout>/<offset>-<kind>-<N>x<K>-<row bytes>.lmxp``:
a 4 KiB header (a magic line and a JSON line: the key, the payload's length and its ``lmx_checksum``),
then the packed bytes, mapped copy-on-write on load (the kernels never write them).  A file whose header,
key, length or checksum does not match is rebuilt with a warning.  Entries are written by a background
thread (atomically: a temporary file renamed into place), so concurrent loads never read a partial one.

``LIBREMAX_PACK_CACHE=0`` disables the cache, ``LIBREMAX_PACK_CACHE=<folder>`` puts it there (the test suite
uses a temporary one); by default it lives beside the kernel builds (``build.cache_dir()``, moved by
``LIBREMAX_CACHE_DIR``).  Entries are never evicted: delete the folder to reclaim the space (about the
size of each GGUF file loaded).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from max.engine.native.build import atomic_write, cache_dir

__all__ = ["enabled", "flush", "lookup", "stats", "store"]

MAGIC = b"libremax packed weights 1\n"
HEADER = 4096
_HASH_BUF = 16 << 20

_lock = threading.Lock()
_files: dict[tuple, "_FileState"] = {}
_stats = {"hits": 0, "misses": 0, "stored": 0, "rebuilt": 0, "hashed": 0}


def _setting() -> str:
    return os.environ.get("LIBREMAX_PACK_CACHE", "").strip()


def enabled() -> bool:
    return _setting().lower() not in ("0", "off", "false", "no")


def stats() -> dict[str, int]:
    """Counts since the process started: entries served (``hits``), packed afresh (``misses``), written
    (``stored``), found damaged and rebuilt (``rebuilt``), and source files hashed (``hashed``)."""
    with _lock:
        return dict(_stats)


def _root() -> Path:
    v = _setting()
    return Path(v) if v and v.lower() not in ("1", "on", "true", "yes") else cache_dir() / "packed"


def _count(key: str, n: int = 1) -> None:
    with _lock:
        _stats[key] += n


class _FileState:
    """One source file (one identity) in this process: its sha256 once known, and the entries waiting for
    it or for the writer thread."""

    def __init__(self, path: str, identity: tuple) -> None:
        self.path, self.identity = path, identity
        self.sha: Optional[str] = None
        self.disabled = False
        self.queue: list[tuple[dict, torch.Tensor]] = []
        self.lock = threading.Lock()
        self.writing = False
        self.sha = self._sidecar_read()
        if self.sha is None:
            self.writing = True  # the hashing thread writes what queued up meanwhile
            threading.Thread(target=self._hash, name="libremax-pack-cache-hash", daemon=False).start()

    def _sidecar(self) -> Path:
        name = hashlib.blake2b(json.dumps(list(self.identity)).encode(), digest_size=16).hexdigest()
        return _root() / "files" / f"{name}.json"

    def _sidecar_read(self) -> Optional[str]:
        try:
            doc = json.loads(self._sidecar().read_text())
            if doc.get("identity") == json.loads(json.dumps(list(self.identity))):
                sha = doc.get("sha256")
                if isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha):
                    return sha
        except (OSError, ValueError, AttributeError):
            pass
        return None

    def _hash(self) -> None:
        try:
            from max.graph.weights import mapped

            h = hashlib.sha256()
            buf = bytearray(_HASH_BUF)
            view = memoryview(buf)
            with open(self.path, "rb") as f:
                if mapped.file_identity(self.path) != self.identity:
                    raise OSError("the file changed since it was mapped")
                while True:
                    n = f.readinto(buf)
                    if not n:
                        break
                    h.update(view[:n])
            if mapped.file_identity(self.path) != self.identity:
                raise OSError("the file changed while it was hashed")
            sha = h.hexdigest()
            _count("hashed")
            side = self._sidecar()
            side.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(side, [json.dumps({"identity": list(self.identity), "sha256": sha}).encode()])
        except OSError:
            with self.lock:
                self.disabled, self.queue, self.writing = True, [], False
            return
        with self.lock:
            self.sha = sha
        self._drain()

    def enqueue(self, meta: dict, packed: torch.Tensor) -> None:
        with self.lock:
            if self.disabled:
                return
            self.queue.append((meta, packed))
            if self.writing:
                return
            self.writing = True
        threading.Thread(target=self._drain, name="libremax-pack-cache-write", daemon=False).start()

    def _drain(self) -> None:
        from max.graph.weights import mapped

        while True:
            with self.lock:
                if not self.queue or self.disabled:
                    self.queue, self.writing = [], False
                    return
                meta, packed = self.queue.pop(0)
            try:
                if mapped.file_identity(self.path) != self.identity:  # changed since mapped: keep nothing
                    with self.lock:
                        self.disabled = True
                    continue
                _write_entry(self.entry_path(meta), dict(meta, sha256=self.sha), packed)
                _count("stored")
            except OSError:
                pass  # a read-only or full cache folder only costs the reuse

    def entry_path(self, meta: dict) -> Path:
        return (_root() / str(self.sha) / meta["layout"] /
                f"{meta['offset']}-{meta['kind']}-{meta['n']}x{meta['k']}-{meta['row_bytes']}.lmxp")


def _checksum(so: Any, t: torch.Tensor) -> int:
    return int(so.lmx_checksum(t.data_ptr(), t.numel()))


def _write_entry(path: Path, meta: dict, packed: torch.Tensor) -> None:
    from max.engine import native

    so = native.lib()
    doc = dict(meta, payload=int(packed.numel()), checksum=_checksum(so, packed))
    head = MAGIC + json.dumps(doc, sort_keys=True).encode() + b"\n"
    if len(head) > HEADER:
        raise OSError("header too long")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, [head, b"\0" * (HEADER - len(head)), memoryview(packed.numpy())])


def _state(path: str, identity: tuple) -> Optional[_FileState]:
    with _lock:
        st = _files.get(identity)
        if st is None:
            try:
                st = _files[identity] = _FileState(path, identity)
            except OSError:
                return None
    return None if st.disabled else st


def _key(src: tuple, kind: int, n: int, k: int, row_bytes: int, nbytes: int) -> dict:
    from max.engine import native

    layout = native.lib().lmx_pack_layout().decode()
    return {"offset": src[2], "kind": kind, "n": n, "k": k, "row_bytes": row_bytes, "src_bytes": nbytes,
            "layout": layout}


def lookup(ptr: int, kind: int, n: int, k: int, row_bytes: int, expect: int) -> tuple[Optional[torch.Tensor], Optional[Callable]]:
    """The cached packing of the ``n`` rows of ``row_bytes`` GGML blocks at address ``ptr`` (``expect`` packed
    bytes), or None; and a function that stores a fresh packing of them (None when they are not cacheable:
    the cache is off, or they do not view a registered file)."""
    from max.graph.weights import mapped

    if not enabled():
        return None, None
    src = mapped.source(ptr, n * row_bytes)
    if src is None:
        return None, None
    st = _state(src[0], src[1])
    if st is None:
        return None, None
    meta = _key(src, kind, n, k, row_bytes, n * row_bytes)

    def put(packed: torch.Tensor) -> None:
        st.enqueue(meta, packed)

    with st.lock:
        sha = st.sha
    if sha is None:  # still hashing the file (first load): pack, and write once the hash is known
        _count("misses")
        return None, put
    path = st.entry_path(meta)
    got = _read_entry(path, dict(meta, sha256=sha), expect)
    if got is None:
        _count("misses")
    elif isinstance(got, str):
        warnings.warn(f"libremax: packed-weight cache file {path} is damaged ({got}); repacking it", RuntimeWarning,
                      stacklevel=3)
        _count("rebuilt")
        _count("misses")
        got = None
    else:
        _count("hits")
    return got, put


def _read_entry(path: Path, meta: dict, expect: int) -> "torch.Tensor | str | None":
    """The entry's packed bytes mapped (None: no entry; a string: why the file is not a valid entry)."""
    from max.engine import native

    try:
        size = os.path.getsize(path)
    except OSError:
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER)
    except OSError:
        return None
    if not head.startswith(MAGIC):
        return "not a packed-weight file"
    try:
        doc = json.loads(head[len(MAGIC):].split(b"\n", 1)[0])
    except ValueError:
        return "unreadable header"
    if not isinstance(doc, dict) or any(doc.get(k) != v for k, v in meta.items()):
        return "its key does not match"
    if doc.get("payload") != expect:
        return f"it holds {doc.get('payload')} bytes, the layout needs {expect}"
    if size != HEADER + expect:
        return f"it has {size} bytes, {HEADER + expect} expected (truncated?)"
    try:  # private (copy-on-write: never written); no MAP_POPULATE: the checksum below faults every page in
        # anyway, and populating the page table up front cost 0.45 s more on a 1.1 GB model (2-core AVX2 host)
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), HEADER + expect, flags=mmap.MAP_PRIVATE,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError) as e:
        return f"cannot map it: {e}"
    t = torch.frombuffer(mm, dtype=torch.uint8, count=expect, offset=HEADER)  # keeps the mapping alive
    if _checksum(native.lib(), t) != doc.get("checksum"):
        return "checksum mismatch"
    return t


def flush(timeout: float | None = None) -> None:
    """Wait until every queued entry is written (tests, benchmarks)."""
    import time

    end = None if timeout is None else time.monotonic() + timeout
    while True:
        with _lock:
            states = list(_files.values())
        busy = False
        for st in states:
            with st.lock:
                busy |= st.writing and not st.disabled
        if not busy or (end is not None and time.monotonic() > end):
            return
        time.sleep(0.01)


def _forget() -> None:
    """Drop this process's per-file states (tests: a later load reads the sidecars again)."""
    flush()
    with _lock:
        _files.clear()
