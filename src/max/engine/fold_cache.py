"""The compile cache's store of load-time weight folding results.

Weight folding (``session._fold_weights``) runs pure ops whose operands are all weights or constants
once at load, e.g. repacking GGML blocks into the native kernels' layout, and that can cost more than
the whole compilation.  A compile-cache folder (``LIBREMAX_COMPILE_CACHE`` or an ``export_mefs`` /
``precompiled_mefs`` folder) keeps those results under ``folded/``, each named by a digest of the op,
its attributes, its result types and the *bytes* of the weights it was computed from: a result is
reused only for the same weight values, so the weights still come from the registry given at load.
MEF files written by ``CompiledModel.export_mef`` never hold weight data.

One file per folded node: a JSON line ``{"results": [{"dtype", "shape", "offset", "nbytes", "sum"}]}``,
then the raw bytes (no pickle); a result whose bytes do not match its checksum is computed again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch


def tensor_digest(t: torch.Tensor) -> str:
    """A digest of a tensor's dtype, shape and bytes."""
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    c = t.detach().contiguous()
    if c.device.type != "cpu":
        c = c.cpu()
    if c.numel():
        h.update(memoryview(c.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


def salt(policy: Any) -> str:
    """What else a folded result depends on: the compiler, the backend policy and the native
    library's file (its packing code)."""
    from max.engine import native
    from max.engine.compiler import mef

    variant = policy.kernel_variant(True)
    try:
        so = native.library(variant) if variant else None
    except native.NativeBuildError:  # a policy this host cannot run (its programs are refused when read)
        so = None
    lib = ""
    if so is not None:
        st = os.stat(so._name)
        lib = f"{so._name}|{st.st_size}|{st.st_mtime_ns}"
    return json.dumps([mef.compiler_fingerprint(), mef.policy_dict(policy), lib])


class FoldStore:
    """Folded results under ``read_dir/folded`` (looked up) and ``write_dir/folded`` (stored)."""

    def __init__(self, read_dir: Optional[Path], write_dir: Optional[Path], salt: str = "") -> None:
        self._salt = salt  # the compiler, backend policy and native library the results were made with
        self._read = read_dir / "folded" if read_dir is not None else None
        self._write = write_dir / "folded" if write_dir is not None else None
        self.hits = 0
        self.stored = 0

    def entry_key(self, op: str, attrs_json: str, types: Sequence[Any], input_digests: Sequence[str]) -> str:
        h = hashlib.blake2b(digest_size=20)
        h.update(json.dumps([self._salt, op, attrs_json, [str(t) for t in types], list(input_digests)]).encode())
        return h.hexdigest()

    def get(self, key: str, device: torch.device) -> Optional[list]:
        if self._read is None:
            return None
        path = self._read / f"{key}.bin"
        try:
            with open(path, "rb") as f:
                head = f.readline()
                meta = json.loads(head)
                base = len(head)
                out = []
                for r in meta["results"]:
                    f.seek(base + r["offset"])
                    data = bytearray(r["nbytes"])
                    if f.readinto(data) != r["nbytes"] or hashlib.blake2b(data, digest_size=20).hexdigest() != r["sum"]:
                        return None  # truncated or damaged: compute again (and store it anew)
                    raw = np.frombuffer(data, dtype=np.uint8)
                    t = torch.from_numpy(raw).view(getattr(torch, r["dtype"])).reshape(r["shape"])
                    out.append(t.to(device))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError):
            return None
        self.hits += 1
        return out

    def put(self, key: str, results: Sequence[torch.Tensor]) -> None:
        if self._write is None:
            return
        try:
            self._write.mkdir(parents=True, exist_ok=True)
            metas, blobs, off = [], [], 0
            for r in results:
                c = r.detach().contiguous().cpu()
                b = c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b""
                metas.append({"dtype": str(c.dtype).removeprefix("torch."), "shape": list(c.shape),
                              "offset": off, "nbytes": len(b), "sum": hashlib.blake2b(b, digest_size=20).hexdigest()})
                blobs.append(b)
                off += len(b)
            path = self._write / f"{key}.bin"
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            with open(tmp, "wb") as f:
                f.write(json.dumps({"results": metas}).encode() + b"\n")
                for b in blobs:
                    f.write(b)
            os.replace(tmp, path)
            self.stored += 1
        except OSError:
            pass  # a read-only or full cache folder only costs the reuse
