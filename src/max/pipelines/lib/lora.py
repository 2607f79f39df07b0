"""LoRA adapters: PEFT adapter folders loaded into the slots of a model's :class:`~max.nn.lora.LoRALinear`
projections, selected per request by name, loaded and unloaded at run time (``LoRARequest``).

A PEFT folder has ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``, ``use_rslora``)
and ``adapter_model.safetensors`` (``base_model.model.<module path>.lora_A.weight`` ``[r, in]`` and
``.lora_B.weight`` ``[out, r]``).  Slot ``s`` of a module's stacks receives ``A.T`` and
``(scale * B).T`` with ``scale = lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA): the model adds
``scale * B @ A @ x`` for the tokens of requests using that adapter, as PEFT does.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from max.interfaces import LoRAOperation, LoRARequest, LoRAResponse, LoRAStatus

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

__all__ = ["DEFAULT_TARGETS", "LoRAError", "LoRAManager", "parse_lora_paths", "read_adapter"]


class LoRAError(ValueError):
    """A bad adapter or operation; ``status`` is the ``LoRAStatus`` to report."""

    def __init__(self, message: str, status: LoRAStatus = LoRAStatus.LOAD_INVALID_ADAPTER) -> None:
        super().__init__(message)
        self.status = status


def parse_lora_paths(paths: Sequence[str]) -> list[tuple[str, str]]:
    """``["name=path", "path"]`` -> ``[(name, path), ...]`` (a bare path is named by its folder)."""
    out = []
    for p in paths:
        name, sep, path = p.partition("=")
        if not sep:
            name, path = os.path.basename(os.path.normpath(p)), p
        if not name or not path:
            raise LoRAError(f"LoRA path {p!r} must be NAME=PATH or PATH", LoRAStatus.LOAD_INVALID_PATH)
        out.append((name, path))
    return out


@dataclass
class Adapter:
    name: str
    path: str
    rank: int
    scale: float
    targets: set[str]
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]  # module path -> (A [r, in], B [out, r])


def _module_path(key: str) -> Optional[tuple[str, str]]:
    """``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` -> ``("layers.0.self_attn.q_proj", "A")``."""
    for part, which in ((".lora_A.", "A"), (".lora_B.", "B")):
        if part in key:
            path = key.split(part)[0]
            for prefix in ("base_model.model.", "model."):
                if path.startswith(prefix):
                    path = path[len(prefix):]
            return path, which
    return None


def read_adapter(name: str, path: str) -> Adapter:
    """Read a PEFT LoRA folder; :class:`LoRAError` for a missing folder or an unsupported adapter."""
    cfg_path = os.path.join(path, "adapter_config.json")
    if not os.path.isdir(path) or not os.path.isfile(cfg_path):
        raise LoRAError(f"LoRA adapter {name!r}: {path} is not a PEFT adapter folder (no adapter_config.json)",
                        LoRAStatus.LOAD_INVALID_PATH)
    cfg = json.loads(open(cfg_path, encoding="utf-8").read())
    if cfg.get("peft_type", "LORA") != "LORA":
        raise LoRAError(f"LoRA adapter {name!r}: peft_type {cfg.get('peft_type')!r} is not LORA")
    if cfg.get("bias", "none") != "none" or cfg.get("use_dora") or cfg.get("fan_in_fan_out"):
        raise LoRAError(f"LoRA adapter {name!r}: bias, DoRA and fan_in_fan_out adapters are not supported")
    rank = int(cfg["r"])
    alpha = float(cfg.get("lora_alpha", rank))
    scale = alpha / (rank ** 0.5) if cfg.get("use_rslora") else alpha / rank
    files = [f for f in ("adapter_model.safetensors", "adapter_model.bin") if os.path.isfile(os.path.join(path, f))]
    if not files:
        raise LoRAError(f"LoRA adapter {name!r}: {path} has no adapter_model.safetensors",
                        LoRAStatus.LOAD_INVALID_PATH)
    if files[0].endswith(".safetensors"):
        from safetensors.torch import load_file

        state = load_file(os.path.join(path, files[0]))
    else:
        state = torch.load(os.path.join(path, files[0]), map_location="cpu", weights_only=True)
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in state.items():
        mp = _module_path(key)
        if mp is None:
            raise LoRAError(f"LoRA adapter {name!r}: unexpected tensor {key!r} (only lora_A/lora_B are supported)")
        parts.setdefault(mp[0], {})[mp[1]] = t.float()
    weights = {}
    for mod, ab in parts.items():
        if set(ab) != {"A", "B"}:
            raise LoRAError(f"LoRA adapter {name!r}: {mod} lacks lora_{'A' if 'A' not in ab else 'B'}")
        weights[mod] = (ab["A"], ab["B"])
    targets = {m.rsplit(".", 1)[-1] for m in weights}
    return Adapter(name, path, rank, scale, targets, weights)


class LoRAManager:
    """The adapter slots of one model: host-side stacks (bound as graph inputs) and name -> slot.

    ``modules``: module path -> ``(in_dim, out_dim)`` of every :class:`~max.nn.lora.LoRALinear`.
    """

    def __init__(self, modules: dict[str, tuple[int, int]], max_loras: int, max_rank: int, dtype: torch.dtype,
                 device: Any = "cpu") -> None:
        self.max_loras = int(max_loras)
        self.max_rank = int(max_rank)
        self.width = self.max_loras * self.max_rank
        self.dtype = dtype
        self.device = device
        self.modules = dict(modules)
        self.stacks = {m: (torch.zeros(i, self.width, dtype=dtype, device=device),
                           torch.zeros(self.width, o, dtype=dtype, device=device))
                       for m, (i, o) in self.modules.items()}
        self.slots: dict[str, int] = {}
        self.adapters: dict[str, Adapter] = {}
        self._lock = threading.Lock()
        self._zero_mask: Optional[torch.Tensor] = None

    # ------------------------------------------------------------ adapters
    def load(self, name: str, path: str) -> None:
        """Read the adapter and copy it into a free slot (LoRAError when it cannot be used)."""
        with self._lock:
            if name in self.slots:
                raise LoRAError(f"a LoRA adapter named {name!r} is already loaded", LoRAStatus.LOAD_NAME_EXISTS)
            free = sorted(set(range(self.max_loras)) - set(self.slots.values()))
            if not free:
                raise LoRAError(f"all {self.max_loras} LoRA slots are in use (max_num_loras); unload one first",
                                LoRAStatus.LOAD_ERROR)
            ad = read_adapter(name, path)
            if ad.rank > self.max_rank:
                raise LoRAError(f"LoRA adapter {name!r} has rank {ad.rank}, above max_lora_rank {self.max_rank}")
            unknown = sorted(m for m in ad.weights if m not in self.modules)
            if unknown:
                raise LoRAError(f"LoRA adapter {name!r} targets {unknown[:3]}, which this model was not built to "
                                f"adapt (its LoRA modules: {', '.join(sorted({m.rsplit('.', 1)[-1] for m in self.modules}))})")
            for m, (a, b) in ad.weights.items():
                i, o = self.modules[m]
                if tuple(a.shape) != (ad.rank, i) or tuple(b.shape) != (o, ad.rank):
                    raise LoRAError(f"LoRA adapter {name!r}: {m} has lora_A {list(a.shape)} / lora_B "
                                    f"{list(b.shape)}, expected [{ad.rank}, {i}] / [{o}, {ad.rank}]")
            s = free[0]
            self._write(s, ad)
            self.slots[name] = s
            self.adapters[name] = ad

    def _write(self, slot: int, ad: Optional[Adapter]) -> None:
        lo, hi = slot * self.max_rank, (slot + 1) * self.max_rank
        for m, (A, B) in self.stacks.items():
            A[:, lo:hi] = 0
            B[lo:hi, :] = 0
            if ad is not None and m in ad.weights:
                a, b = ad.weights[m]
                A[:, lo:lo + ad.rank] = a.T.to(self.dtype)
                B[lo:lo + ad.rank, :] = (ad.scale * b).T.to(self.dtype)

    def unload(self, name: str) -> None:
        with self._lock:
            if name not in self.slots:
                raise LoRAError(f"no LoRA adapter named {name!r} is loaded", LoRAStatus.UNLOAD_NAME_NONEXISTENT)
            self._write(self.slots.pop(name), None)
            self.adapters.pop(name, None)

    def handle(self, request: LoRARequest) -> LoRAResponse:
        """A ``LoRARequest`` (LIST / LOAD / UNLOAD) -> ``LoRAResponse``."""
        try:
            if request.operation is LoRAOperation.LIST:
                return LoRAResponse(LoRAStatus.SUCCESS, sorted(self.slots))
            if request.operation is LoRAOperation.LOAD:
                self.load(request.lora_name or "", request.lora_path or "")
                return LoRAResponse(LoRAStatus.SUCCESS, f"loaded LoRA adapter {request.lora_name!r}")
            self.unload(request.lora_name or "")
            return LoRAResponse(LoRAStatus.SUCCESS, f"unloaded LoRA adapter {request.lora_name!r}")
        except LoRAError as e:
            return LoRAResponse(e.status, str(e))

    def has(self, name: Optional[str]) -> bool:
        return name is not None and name in self.slots

    # ------------------------------------------------------------ step inputs
    def mask(self, adapters: Sequence[Optional[str]], lengths: Sequence[int]) -> torch.Tensor:
        """``[sum(lengths), width]``: ones in the columns of each token's adapter slot."""
        total = int(sum(lengths))
        m = torch.zeros(total, self.width, dtype=self.dtype, device=self.device)
        pos = 0
        for name, n in zip(adapters, lengths):
            s = self.slots.get(name) if name is not None else None
            if s is not None:
                m[pos:pos + n, s * self.max_rank:(s + 1) * self.max_rank] = 1
            pos += n
        return m

    def inputs(self, adapters: Sequence[Optional[str]], lengths: Sequence[int]) -> list[torch.Tensor]:
        """The graph's LoRA inputs for one step: the mask, then ``A``, ``B`` of each module."""
        out = [self.mask(adapters, lengths)]
        for A, B in self.stacks.values():
            out += [A, B]
        return out

