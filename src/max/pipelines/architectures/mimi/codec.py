"""``MimiCodec``: load a Mimi checkpoint, compile its graphs, and encode waveforms to codes / decode codes to
waveforms, whole or as a stream of chunks (:meth:`MimiCodec.decode_chunk` with a
:class:`MimiDecodeState`; several streams at once with :meth:`MimiCodec.decode_chunks`), or several
requests' codes at once (:meth:`MimiCodec.decode_batch`)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from max.driver import Buffer
from max.pipelines.architectures.common.weights import load_weights_into
from max.pipelines.architectures.mimi.config import WHO, settings_from_dict
from max.pipelines.architectures.mimi.model import (
    MimiNet,
    build_decode_graph,
    build_encode_graph,
    encoder_paddings,
)
from max.pipelines.architectures.mimi.weights import adapt_tensors

__all__ = ["MimiCodec", "MimiDecodeState"]


@dataclass
class MimiDecodeState:
    """What a decode stream carries from one chunk to the next: the causal convolutions' past inputs, the
    transposed convolutions' overhangs, the transformer's keys/values of its last ``sliding_window`` positions
    (batch 1 each), and how many code frames were decoded."""

    tensors: list[torch.Tensor]
    frames: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class MimiCodec:
    """The Mimi neural audio codec (transformers' ``MimiModel``) on max graphs.

    ``num_codebooks`` (default: the config's ``num_quantizers``) is how many codebooks :meth:`encode` gives and
    :meth:`decode` takes; it may be lowered to any number from ``num_semantic_quantizers`` up (as
    ``MimiModel.encode(num_quantizers=...)`` allows)."""

    def __init__(self, config: Mapping[str, Any], tensors: Mapping[str, Any], prefix: str = "", *,
                 num_codebooks: int | None = None, session: Any = None) -> None:
        s = settings_from_dict(config)
        self.settings = s
        n = s.num_quantizers if num_codebooks is None else num_codebooks
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not (
                s.num_semantic_quantizers <= n <= s.num_quantizers):
            raise ValueError(f"{WHO}: num_codebooks must be an int in [{s.num_semantic_quantizers}, "
                             f"{s.num_quantizers}], got {num_codebooks!r}")
        self.num_codebooks = int(n)
        self.net = MimiNet(s)
        load_weights_into(self.net, adapt_tensors(s, tensors, prefix), WHO)
        if session is None:
            from max.engine import InferenceSession
            session = InferenceSession()
        self._session = session
        self._registry = self.net.state_dict()
        self._graphs: dict[str, Any] = {}
        self._compile_lock = threading.Lock()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_state_dict(cls, config: Mapping[str, Any], tensors: Mapping[str, Any], prefix: str = "",
                        **kw: Any) -> "MimiCodec":
        """From a config dict (``MimiConfig.to_dict()``) and tensors (numpy or torch) whose codec names start
        with ``prefix`` (``"codec_model."`` in a CSM checkpoint)."""
        return cls(config, tensors, prefix, **kw)

    @classmethod
    def from_pretrained(cls, path: str | Path, **kw: Any) -> "MimiCodec":
        """From a folder ``MimiModel.save_pretrained`` wrote (``config.json`` and safetensors)."""
        from safetensors.torch import load_file

        p = Path(path)
        cfg_file = p / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(f"{WHO}: no config.json in {str(p)!r}")
        files = sorted(p.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{WHO}: no .safetensors files in {str(p)!r}")
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            tensors.update(load_file(str(f)))
        return cls(json.loads(cfg_file.read_text()), tensors, **kw)

    # ------------------------------------------------------------------ sizes
    @property
    def sample_rate(self) -> int:
        return self.settings.sampling_rate

    @property
    def frame_rate(self) -> float:
        return self.settings.frame_rate

    @property
    def samples_per_frame(self) -> int:
        """Waveform samples one code frame decodes to."""
        return self.settings.samples_per_frame

    @property
    def codebook_size(self) -> int:
        return self.settings.codebook_size

    # ------------------------------------------------------------------ graphs
    def _graph(self, kind: str) -> Any:
        g = self._graphs.get(kind)
        if g is None:
            with self._compile_lock:
                g = self._graphs.get(kind)
                if g is None:
                    build = build_decode_graph if kind == "decode" else build_encode_graph
                    g = self._session.load(build(self.net, self.num_codebooks), weights_registry=self._registry)
                    self._graphs[kind] = g
        return g

    @staticmethod
    def _buf(t: Any) -> Buffer:
        if isinstance(t, np.ndarray):
            t = torch.from_numpy(np.ascontiguousarray(t))
        return Buffer.from_dlpack(t.contiguous())

    # ------------------------------------------------------------------ encode
    def encode(self, waveform: Any) -> np.ndarray:
        """Codes int64 ``[num_codebooks, frames]`` of a mono waveform (float, ``[samples]``, at
        :attr:`sample_rate`); ``frames = ceil(samples / samples_per_frame)``."""
        w = np.asarray(waveform.detach().cpu().numpy() if isinstance(waveform, torch.Tensor) else waveform)
        if w.dtype.kind != "f":
            raise TypeError(f"{WHO}: waveform must be a float array (mono samples), got dtype {w.dtype}")
        if w.ndim != 1:
            raise ValueError(f"{WHO}: waveform must be mono samples [samples], got shape {list(w.shape)}")
        if w.size == 0:
            raise ValueError(f"{WHO}: waveform is empty")
        if not np.all(np.isfinite(w)):
            raise ValueError(f"{WHO}: waveform has NaN or infinite samples")
        x = torch.from_numpy(np.ascontiguousarray(w, np.float32)).reshape(1, -1, 1)
        extras = [torch.zeros(1, e, c) for e, c in encoder_paddings(self.net, w.size)]
        (codes,) = self._graph("encode").execute(self._buf(x), *(self._buf(e) for e in extras))
        return codes._torch().numpy()[0].astype(np.int64)

    # ------------------------------------------------------------------ decode
    def _check_codes(self, codes: Any, what: str = "codes") -> np.ndarray:
        c = codes.detach().cpu().numpy() if isinstance(codes, torch.Tensor) else np.asarray(codes)
        if c.dtype.kind not in "iu":
            raise TypeError(f"{WHO}: {what} must be an integer array (int64), got dtype {c.dtype}")
        if c.ndim != 2:
            raise ValueError(f"{WHO}: {what} must be [num_codebooks, frames], got shape {list(c.shape)}")
        if c.shape[0] != self.num_codebooks:
            raise ValueError(f"{WHO}: {what} have {c.shape[0]} codebooks, this codec decodes {self.num_codebooks}")
        if c.size and (c.min() < 0 or c.max() >= self.codebook_size):
            bad = c[(c < 0) | (c >= self.codebook_size)].ravel()[0]
            raise ValueError(f"{WHO}: {what} hold {int(bad)}, outside the codebook [0, {self.codebook_size})")
        return c.astype(np.int64, copy=False)

    def new_decode_state(self) -> MimiDecodeState:
        """The state a decode stream starts from (what whole-codes decoding starts from)."""
        return MimiDecodeState([torch.zeros(1, *sh) for sh in self.net.decode_state_shapes()])

    def _run_decode(self, codes: np.ndarray, offsets: Sequence[int], states: Sequence[torch.Tensor]) -> tuple:
        offs = torch.tensor(list(offsets), dtype=torch.int64)
        out = self._graph("decode").execute(self._buf(codes), self._buf(offs), *(self._buf(t) for t in states))
        audio, *new = (o._torch() for o in out)
        return audio, new  # outputs never alias inputs (Model.execute's contract)

    def decode_chunk(self, codes: Any, state: MimiDecodeState) -> np.ndarray:
        """The next ``frames * samples_per_frame`` samples of the stream ``state`` (advanced in place) for the
        next code frames ``[num_codebooks, frames]``; the chunks of a stream concatenate to :meth:`decode` of
        all its codes."""
        return self.decode_chunks([codes], [state])[0]

    def decode_chunks(self, codes: Sequence[Any], states: Sequence[MimiDecodeState]) -> list[np.ndarray]:
        """:meth:`decode_chunk` of several streams at once: ``codes[i]`` continues ``states[i]`` (distinct
        streams).  Chunks of equal length share one graph call; nothing is advanced when any input is bad."""
        if isinstance(codes, (np.ndarray, torch.Tensor)) or not isinstance(codes, Sequence) or not isinstance(
                states, Sequence):
            raise TypeError(f"{WHO}: decode_chunks takes a list of codes and a list of states")
        if len(codes) != len(states):
            raise ValueError(f"{WHO}: {len(codes)} code chunks for {len(states)} states")
        cs = [self._check_codes(c, f"codes[{i}]" if len(codes) > 1 else "codes") for i, c in enumerate(codes)]
        for st in states:
            if not isinstance(st, MimiDecodeState):
                raise TypeError(f"{WHO}: state must come from new_decode_state(), got {type(st).__name__}")
        if len({id(st) for st in states}) != len(states):
            raise ValueError(f"{WHO}: the same stream state is given twice")
        out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(cs)
        groups: dict[int, list[int]] = {}
        for i, c in enumerate(cs):
            if c.shape[1]:
                groups.setdefault(c.shape[1], []).append(i)
        locks = sorted((st.lock for st in states), key=id)
        for lk in locks:
            lk.acquire()
        try:
            for rows in groups.values():
                batch = np.stack([cs[i] for i in rows])
                tensors = [torch.cat([states[i].tensors[k] for i in rows]) if len(rows) > 1
                           else states[rows[0]].tensors[k] for k in range(len(states[rows[0]].tensors))]
                audio, new = self._run_decode(batch, [states[i].frames * self._latent_stride for i in rows], tensors)
                a = audio.numpy().astype(np.float32, copy=False)
                for j, i in enumerate(rows):
                    out[i] = a[j].copy()
                    states[i].tensors = [t[j:j + 1].clone() if len(rows) > 1 else t for t in new]
                    states[i].frames += cs[i].shape[1]
        finally:
            for lk in locks:
                lk.release()
        return out

    @property
    def _latent_stride(self) -> int:
        return self.settings.latent_stride if self.settings.has_resample else 1

    def decode(self, codes: Any) -> np.ndarray:
        """The float32 waveform ``[frames * samples_per_frame]`` of codes int64 ``[num_codebooks, frames]``."""
        return self.decode_chunk(codes, self.new_decode_state())

    def decode_batch(self, codes: Sequence[Any]) -> list[np.ndarray]:
        """:meth:`decode` of several requests' codes in one graph call (shorter ones padded at the end: the
        codec is causal, so padding never reaches their samples, which are cut back to their length)."""
        if isinstance(codes, (np.ndarray, torch.Tensor)) or not isinstance(codes, Sequence):
            raise TypeError(f"{WHO}: decode_batch takes a list of [num_codebooks, frames] arrays")
        cs = [self._check_codes(c, f"codes[{i}]") for i, c in enumerate(codes)]
        if not cs:
            return []
        t = max(c.shape[1] for c in cs)
        if t == 0:
            return [np.zeros(0, np.float32) for _ in cs]
        batch = np.zeros((len(cs), self.num_codebooks, t), np.int64)
        for i, c in enumerate(cs):
            batch[i, :, :c.shape[1]] = c
        states = [torch.zeros(len(cs), *sh) for sh in self.net.decode_state_shapes()]
        audio, _ = self._run_decode(batch, [0] * len(cs), states)
        a = audio.numpy().astype(np.float32, copy=False)
        return [a[i, :c.shape[1] * self.samples_per_frame].copy() for i, c in enumerate(cs)]
