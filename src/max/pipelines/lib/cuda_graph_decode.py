"""Decode steps as CUDA graphs: one captured graph per (batch bucket, page bucket), replayed with one launch.

Used only when a decoder runs on a CUDA device (``decode_graphs_for`` says None everywhere else, so the
CPU path never sees this module).  A pure decode step (every request adds one token) of ``n`` requests
whose longest page list has ``w`` pages runs the graph captured for ``(B, P)``: ``B`` the smallest batch
bucket >= ``n`` (1, 2, 4, ... up to ``max_batch``), ``P`` the smallest page bucket >= ``w`` (likewise up
to the cache's pages per sequence).  The graph reads static input tensors: each step the requests'
tokens, cache lengths and page lists are written into pinned host buffers and copied in (two copies),
the ``B - n`` padding rows point at a scratch page that no request owns (token 0, cache length 0), so
their K/V writes land where nobody reads.  The step graph runs under
``max.engine.kernels.ragged.static_decode`` (no host reads, shapes from the inputs alone), and the
captured function ends with the greedy choice (argmax of the logits on the device), so a greedy batch
copies back only its token ids.

The bookkeeping (buckets, staging, padding, capture once per key, replay counts) is independent of
CUDA: ``EagerReplay`` is a capture backend that "records" by running the function and "replays" by
running it again into the recorded output tensors, so tests exercise all of it on the CPU.
``LIBREMAX_CUDA_GRAPHS=0`` turns the graphs off (the eager engine runs every step).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

logger = logging.getLogger("max.pipelines")

__all__ = ["CudaGraphCapture", "DecodeGraphs", "EagerReplay", "bucket_for", "buckets_upto", "decode_graphs_for",
           "plain_greedy"]


def buckets_upto(limit: int) -> list[int]:
    """1, 2, 4, ... below ``limit``, then ``limit`` itself (``limit`` >= 1)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"buckets_upto: limit must be a positive int, got {limit!r}")
    out, b = [], 1
    while b < limit:
        out.append(b)
        b *= 2
    return out + [limit]


def bucket_for(n: int, buckets: Sequence[int]) -> Optional[int]:
    """The smallest bucket >= ``n`` (``n`` >= 1), None when ``n`` exceeds them all."""
    if n < 1:
        raise ValueError(f"bucket_for: n must be >= 1, got {n}")
    for b in buckets:
        if b >= n:
            return b
    return None


# ------------------------------------------------------------------------------------------- backends
class CudaGraphCapture:
    """Records with ``torch.cuda.CUDAGraph``: two warm-up runs on a side stream (lazy initialisation and
    the allocator's first blocks stay outside the graph), then the capture; every graph shares one
    memory pool (they never run at the same time)."""

    def __init__(self) -> None:
        self._pool: Any = None

    def capture(self, fn: Callable[[], tuple]) -> tuple[Any, tuple]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outs = fn()
        if self._pool is None:
            self._pool = graph.pool()
        return graph, outs

    def replay(self, handle: Any) -> None:
        handle.replay()


class EagerReplay:
    """The same contract without CUDA: ``capture`` runs ``fn`` once and keeps its outputs as the "static"
    outputs; ``replay`` runs it again and copies the results into them."""

    def capture(self, fn: Callable[[], tuple]) -> tuple[Any, tuple]:
        outs = fn()
        return (fn, outs), outs

    def replay(self, handle: Any) -> None:
        fn, recorded = handle
        for dst, src in zip(recorded, fn()):
            dst.copy_(src)


# ------------------------------------------------------------------------------------------- graphs
@dataclass
class _Entry:
    """One (batch, pages) key: its static inputs, host staging buffers and recorded graph."""

    batch: int
    pages: int
    tokens: torch.Tensor           # int64 [B] on the device
    u32: torch.Tensor              # int32 [(B + 1) + B + B * P] on the device, viewed as uint32 inputs
    host_tokens: torch.Tensor      # pinned (CUDA) int64 [B]
    host_u32: torch.Tensor         # pinned (CUDA) int32, same layout as u32
    inputs: tuple                  # the step graph's inputs, in order
    handle: Any = None
    outs: tuple = ()
    replays: int = 0
    copied: Any = field(default=None, repr=False)  # CUDA event after the last host -> device copy


class DecodeGraphs:
    """Captured decode steps of one compiled step graph (see the module docstring).

    ``model``: the engine ``Model`` of the step graph (inputs ``tokens, input_row_offsets,
    return_n_logits, blocks, cache_lengths, lookup_table, max_lengths``; output 0 the last-token logits);
    ``blocks``: the cache's page pool tensor; ``scratch_page``: a page no request owns."""

    def __init__(self, model: Any, blocks: torch.Tensor, page_size: int, max_batch: int, max_pages: int,
                 scratch_page: int, backend: Any = None) -> None:
        self.model = model
        self.blocks = blocks
        self.page_size = int(page_size)
        self.device = blocks.device
        self.batch_buckets = buckets_upto(int(max_batch))
        self.page_buckets = buckets_upto(int(max_pages))
        if not 0 <= scratch_page < blocks.shape[0]:
            raise ValueError(f"DecodeGraphs: scratch page {scratch_page} is outside the pool of {blocks.shape[0]}")
        self.scratch_page = int(scratch_page)
        if backend is None:
            if self.device.type != "cuda":
                raise ValueError("DecodeGraphs: CUDA graphs need the cache on a CUDA device (pass backend= "
                                 "EagerReplay() to run the same bookkeeping elsewhere)")
            backend = CudaGraphCapture()
        self.backend = backend
        self._entries: dict[tuple[int, int], _Entry] = {}
        self.captures = 0
        self.replays = 0
        self.disabled: Optional[str] = None
        """Why the graphs were turned off (a capture failed: every step then runs eagerly), or None."""

    # ---------------------------------------------------------------- keys
    def key_for(self, n: int, width: int) -> Optional[tuple[int, int]]:
        """``(batch bucket, page bucket)`` of ``n`` requests whose longest page list has ``width`` pages;
        None when either is beyond the largest bucket (the step then runs eagerly)."""
        b = bucket_for(n, self.batch_buckets)
        p = bucket_for(max(1, width), self.page_buckets)
        return None if b is None or p is None else (b, p)

    @property
    def keys(self) -> list[tuple[int, int]]:
        return sorted(self._entries)

    # ---------------------------------------------------------------- staging
    def _entry(self, key: tuple[int, int]) -> _Entry:
        e = self._entries.get(key)
        if e is not None:
            return e
        B, P = key
        dev, cuda = self.device, self.device.type == "cuda"
        width = (B + 1) + B + B * P
        host_tokens = torch.zeros(B, dtype=torch.int64, pin_memory=cuda)
        host_u32 = torch.zeros(width, dtype=torch.int32, pin_memory=cuda)
        tokens = torch.zeros(B, dtype=torch.int64, device=dev)
        u32 = torch.zeros(width, dtype=torch.int32, device=dev)
        view = u32.view(torch.uint32)
        offsets = view[:B + 1]
        cache_lengths = view[B + 1:2 * B + 1]
        lookup = view[2 * B + 1:].view(B, P)
        max_lengths = torch.tensor([[1, P * self.page_size]], dtype=torch.int32).view(torch.uint32)
        n_logits = torch.ones(1, dtype=torch.int64)
        e = _Entry(B, P, tokens, u32, host_tokens, host_u32,
                   (tokens, offsets, n_logits, self.blocks, cache_lengths, lookup, max_lengths))
        # the padding layout: every row one token, every page the scratch page, cache length 0
        self._stage(e, np.zeros(0, np.int64), np.zeros(0, np.int64), [])
        model, inputs = self.model, e.inputs

        def step() -> tuple:
            from max.engine.kernels.ragged import static_decode

            with static_decode():
                logits = model.execute_static(*inputs)[0]
            return logits, torch.argmax(logits, dim=-1)

        e.handle, e.outs = self.backend.capture(step)
        self.captures += 1
        self._entries[key] = e
        logger.debug("captured the decode step for batch %d, %d pages", B, P)
        return e

    def _stage(self, e: _Entry, tokens: np.ndarray, cache_lengths: np.ndarray, pages: Sequence[Sequence[int]]
               ) -> None:
        """Write the step's rows (then padding rows) into ``e``'s host buffers and copy them in."""
        if e.copied is not None:
            e.copied.synchronize()  # the previous copy out of the pinned buffers has finished
        B, P, n = e.batch, e.pages, len(tokens)
        ht = e.host_tokens.numpy()
        hu = e.host_u32.numpy()
        ht[:n] = tokens
        ht[n:] = 0
        hu[:B + 1] = np.arange(B + 1)
        hu[B + 1:B + 1 + n] = cache_lengths
        hu[B + 1 + n:2 * B + 1] = 0
        lk = hu[2 * B + 1:].reshape(B, P)
        lk[:] = self.scratch_page
        for i, row in enumerate(pages):
            lk[i, :len(row)] = row
        cuda = e.tokens.device.type == "cuda"
        e.tokens.copy_(e.host_tokens, non_blocking=cuda)
        e.u32.copy_(e.host_u32, non_blocking=cuda)
        if cuda:
            e.copied = torch.cuda.Event()
            e.copied.record()

    # ---------------------------------------------------------------- run
    def run(self, tokens: Sequence[int], cache_lengths: Sequence[int], pages: Sequence[Sequence[int]]
            ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """One decode step: request ``i`` adds token ``tokens[i]`` at position ``cache_lengths[i]`` of its
        pages ``pages[i]``.  Returns ``(logits [n, vocab], greedy token ids [n])`` (views of the graph's
        outputs: read them before the next step), or None when the step fits no bucket."""
        n = len(tokens)
        if n == 0 or len(cache_lengths) != n or len(pages) != n:
            raise ValueError(f"DecodeGraphs.run: {n} tokens, {len(cache_lengths)} cache lengths, "
                             f"{len(pages)} page lists")
        cl = np.asarray(cache_lengths, np.int64)
        for i, row in enumerate(pages):
            if int(cl[i]) // self.page_size >= len(row):
                raise ValueError(f"DecodeGraphs.run: request {i} writes position {int(cl[i])} but holds "
                                 f"{len(row)} page(s) of {self.page_size}")
        key = self.key_for(n, max(len(r) for r in pages))
        if key is None or self.disabled is not None:
            return None
        try:
            e = self._entry(key)
        except Exception as exc:  # noqa: BLE001 - a step that cannot be captured runs eagerly from now on
            self.disabled = f"capture of batch {key[0]}, {key[1]} pages failed: {type(exc).__name__}: {exc}"
            logger.warning("CUDA-graph decode off: %s", self.disabled)
            return None
        self._stage(e, np.asarray(tokens, np.int64), cl, pages)
        self.backend.replay(e.handle)
        e.replays += 1
        self.replays += 1
        logits, ids = e.outs
        return logits[:n], ids[:n]


# ------------------------------------------------------------------------------------------- model hook
def plain_greedy(ctx: Any) -> bool:
    """Whether a request's next token is the argmax of the raw logits: greedy, no penalties, logit bias,
    logits processors, grammar, log probabilities or minimum-length EOS ban."""
    p = ctx.sampling_params
    if not (p.temperature == 0.0 or p.top_k == 1):
        return False
    if p.frequency_penalty or p.presence_penalty or p.repetition_penalty != 1.0 or p.logit_bias \
            or p.logits_processors:
        return False
    if getattr(ctx, "matcher", None) is not None or int(getattr(ctx, "log_probabilities", 0) or 0) > 0:
        return False
    return len(ctx.get_min_token_logit_mask(1)[0]) == 0


def decode_graphs_for(pipeline_model: Any, backend: Any = None) -> Optional[DecodeGraphs]:
    """``DecodeGraphs`` for a ``DecoderPipelineModel`` whose step graph runs on one CUDA device with a
    plain paged cache (no LoRA, last-token logits); None otherwise, or with ``LIBREMAX_CUDA_GRAPHS=0``.
    ``backend``: a capture backend (``EagerReplay()`` runs the bookkeeping on any device, for tests).
    Takes one page of the cache as the padding rows' scratch page."""
    from max.nn.kv_cache import PagedKVCacheManager
    from max.nn.transformer import ReturnLogits

    if os.environ.get("LIBREMAX_CUDA_GRAPHS", "1") == "0":
        return None
    mgr = getattr(pipeline_model, "kv_manager", None)
    if type(mgr) is not PagedKVCacheManager or len(mgr.device_buffers) != 1:
        return None
    blocks = mgr.device_buffers[0]._torch()
    if backend is None and (blocks.device.type != "cuda" or not torch.cuda.is_available()):
        return None
    if getattr(pipeline_model, "signals", None) is not None or getattr(pipeline_model, "_lora", None) is not None:
        return None
    if pipeline_model.return_logits not in (None, ReturnLogits.LAST_TOKEN):
        return None
    if len(pipeline_model.model.input_metadata) != 7:  # tokens, offsets, n_logits, the cache's four inputs
        return None
    scratch = mgr.reserve_page()  # held for good: never registered, never released
    return DecodeGraphs(pipeline_model.model, blocks, mgr.page_size, mgr.max_batch_size, mgr.max_pages_per_seq,
                        scratch, backend=backend)
