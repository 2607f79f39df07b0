"""Prometheus metrics of ``max serve``.

One :class:`ServeMetrics` per server, on its own ``CollectorRegistry`` (so several
servers can live in one process, e.g. in tests).  It is also the scheduler's
``metrics`` hook object (``batch_size``, ``step_seconds``, ``first_token``,
``inter_token``, ``tokens_generated``); gauges that describe the current state
(queue depth, running requests, KV-cache pages) are read at scrape time.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "maxserve"

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServeMetrics:
    """The server's counters, gauges and histograms (``render()`` gives the text exposition)."""

    def __init__(self, registry: Optional[CollectorRegistry] = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._bound: dict[str, Gauge] = {}  # the prefix-cache gauges, once bound
        r = self.registry
        self.requests = Counter(f"{PREFIX}_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.finished = Counter(f"{PREFIX}_request_finish", "Generation requests by finish reason",
                                ["reason"], registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds",
                              "Time from scheduling a request to its first token", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.itl = Histogram(f"{PREFIX}_inter_token_latency_seconds",
                             "Time per token between consecutive outputs of a request", buckets=_LATENCY_BUCKETS,
                             registry=r)
        self.e2e = Histogram(f"{PREFIX}_request_latency_seconds", "End-to-end request latency",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.step = Histogram(f"{PREFIX}_step_seconds", "Duration of one scheduler step (one batched model call)",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.batch = Histogram(f"{PREFIX}_batch_size", "Requests in a scheduler step", buckets=_BATCH_BUCKETS,
                               registry=r)
        self.queue_depth = Gauge(f"{PREFIX}_queue_depth", "Requests waiting to be scheduled", registry=r)
        self.running = Gauge(f"{PREFIX}_running_requests", "Requests in the running batch", registry=r)
        self.kv_used = Gauge(f"{PREFIX}_kv_cache_pages_used", "KV-cache pages in use", registry=r)
        self.kv_total = Gauge(f"{PREFIX}_kv_cache_pages_total", "KV-cache pages in the pool", registry=r)
        self.kv_usage = Gauge(f"{PREFIX}_kv_cache_usage_ratio", "Fraction of KV-cache pages in use", registry=r)
        self.kv_bytes = Gauge(f"{PREFIX}_kv_cache_capacity_bytes", "Bytes of the KV-cache page pool", registry=r)
        self.kv_tokens = Gauge(f"{PREFIX}_kv_cache_capacity_tokens", "Tokens the KV-cache page pool holds",
                               registry=r)
        self.state_used = Gauge(f"{PREFIX}_state_cache_slots_used", "Recurrent-state slots in use (hybrid models)",
                                registry=r)
        self.state_total = Gauge(f"{PREFIX}_state_cache_slots_total", "Recurrent-state slots (hybrid models)",
                                 registry=r)
        self.state_bytes = Gauge(f"{PREFIX}_state_cache_capacity_bytes",
                                 "Bytes of the recurrent-state slots and snapshots (hybrid models; 0 otherwise)",
                                 registry=r)
        self.snap_used = Gauge(f"{PREFIX}_state_cache_snapshots_used",
                               "Prefix-cache recurrent-state snapshots held (hybrid models)", registry=r)
        self.snap_total = Gauge(f"{PREFIX}_state_cache_snapshots_total",
                                "Prefix-cache recurrent-state snapshot slots (hybrid models)", registry=r)

    # ------------------------------------------------------------ live sources
    def bind(self, scheduler: Any = None, kv_manager: Any = None) -> None:
        """Read queue depth / running requests from ``scheduler`` and KV page use from ``kv_manager``
        whenever the metrics are scraped."""
        if scheduler is not None:
            self.queue_depth.set_function(_safe(lambda: scheduler.queue_depth))
            self.running.set_function(_safe(lambda: scheduler.running))
        if kv_manager is not None:
            total = _safe(lambda: kv_manager.total_num_pages)
            used = _safe(lambda: kv_manager.total_num_pages - kv_manager.num_free_pages)
            self.kv_total.set_function(total)
            self.kv_used.set_function(used)
            self.kv_usage.set_function(lambda: (used() / total()) if total() else 0.0)
            self.kv_bytes.set_function(_safe(lambda: kv_manager.memory_bytes))
            self.kv_tokens.set_function(_safe(lambda: kv_manager.capacity_tokens))
            self.state_used.set_function(_safe(lambda: getattr(kv_manager, "state_slots_used", 0)))
            self.state_total.set_function(_safe(lambda: getattr(kv_manager, "state_slots_total", 0)))
            self.state_bytes.set_function(_safe(lambda: getattr(kv_manager, "state_memory_bytes", 0)))
            self.snap_used.set_function(_safe(lambda: getattr(kv_manager, "state_snapshots_used", 0)))
            self.snap_total.set_function(_safe(lambda: getattr(kv_manager, "state_snapshots_total", 0)))
            self._bind_prefix_cache(kv_manager)

    def _bind_prefix_cache(self, kv: Any) -> None:
        """Prefix-cache hit rates, and its host / disk spill tier (pages, bytes, tokens served from it)."""
        def spill(attr: str) -> Callable[[], float]:
            return lambda: getattr(kv.spill, attr) if getattr(kv, "spill", None) is not None else 0

        for name, doc, fn in (
                ("prefix_cache_queried_tokens", "Prompt tokens looked up in the prefix cache",
                 lambda: kv.prefix_cache_queried_tokens),
                ("prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache (either tier)",
                 lambda: kv.prefix_cache_hit_tokens),
                ("prefix_cache_hit_ratio", "Prefix-cache hit tokens / queried tokens", lambda: kv.cache_hit_rate),
                ("prefix_cache_spill_hit_tokens", "Prompt tokens whose pages came back from the spill tier",
                 lambda: getattr(kv, "spill_hit_tokens", 0)),
                ("prefix_cache_spill_hit_ratio", "Spill-tier hit tokens / queried tokens",
                 lambda: (kv.spill_hit_tokens / kv.prefix_cache_queried_tokens)
                 if kv.prefix_cache_queried_tokens else 0.0),
                ("kv_spill_pages", "Evicted KV pages kept in the spill tier",
                 lambda: len(kv.spill) if getattr(kv, "spill", None) is not None else 0),
                ("kv_spill_bytes", "Bytes of the spill tier in use", spill("bytes_used")),
                ("kv_spill_capacity_bytes", "Bytes the spill tier may hold", spill("capacity_bytes")),
                ("kv_spill_stored_pages", "Pages written to the spill tier (cumulative)", spill("stored_pages")),
                ("kv_spill_hit_pages", "Pages read back from the spill tier (cumulative)", spill("hit_pages"))):
            gauge = self._bound.get(name)
            if gauge is None:
                if f"{PREFIX}_{name}" in getattr(self.registry, "_names_to_collectors", {}):
                    continue  # registered on this registry by another ServeMetrics
                gauge = self._bound[name] = Gauge(f"{PREFIX}_{name}", doc, registry=self.registry)
            gauge.set_function(_safe(fn))  # bound again: the newest source (a multi-model server's totals)

    def bind_speculative(self, spec: Any) -> None:
        """Speculative decoding: draft tokens proposed / accepted and the acceptance rate, read from the
        pipeline's ``SpeculativeDecodingMetrics`` at scrape time."""
        r = self.registry
        for name, doc, fn in (
                ("spec_decode_draft_tokens_proposed", "Draft tokens proposed", lambda: spec.draft_tokens_proposed),
                ("spec_decode_draft_tokens_accepted", "Draft tokens accepted", lambda: spec.draft_tokens_accepted),
                ("spec_decode_acceptance_ratio", "Accepted / proposed draft tokens", lambda: spec.acceptance_rate),
                ("spec_decode_tokens_per_step", "Tokens generated per speculative target step",
                 lambda: spec.tokens_per_round)):
            Gauge(f"{PREFIX}_{name}", doc, registry=r).set_function(_safe(fn))

    # ------------------------------------------------------------ scheduler hooks
    def batch_size(self, n: int, queue_depth: int) -> None:
        self.batch.observe(n)

    def step_seconds(self, s: float) -> None:
        self.step.observe(s)

    def first_token(self, s: float) -> None:
        self.ttft.observe(s)

    def inter_token(self, s: float) -> None:
        self.itl.observe(s)

    def tokens_generated(self, n: int) -> None:
        self.generation_tokens.inc(n)

    # ------------------------------------------------------------ server side
    def request_done(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _safe(fn: Callable[[], float]) -> Callable[[], float]:
    def get() -> float:
        try:
            return float(fn())
        except Exception:  # noqa: BLE001 - a scrape must not fail
            return float("nan")

    return get
