"""``max serve`` replicas on Ray Serve (``pip install libremax[ray]``).

Each replica is a Ray Serve replica (its own process, placed by Ray on any node of the cluster) that
loads the model and runs the very FastAPI app ``max serve`` runs (:func:`max.serve.server.build_app`:
chat, completions, embeddings, models, streaming, health, metrics); Ray's HTTP proxy spreads the
requests over the replicas, and Ray's autoscaler adds or removes replicas between ``min_replicas``
and ``max_replicas`` to keep about ``target_ongoing_requests`` requests in flight on each.

Three ways in:

- ``max serve --replicas N`` (or ``--min-replicas/--max-replicas``): starts a local Ray cluster, or
  joins one with ``--ray-address``, and serves until Ctrl-C / SIGTERM (:func:`run`);
- ``serve run max.serve.ray:app model_path=/path/to/model num_replicas=2`` with Ray's own CLI (the
  application builder :func:`app`; every ``key=value`` is a :class:`~max.pipelines.PipelineConfig`
  field or one of the deployment options of :func:`deployment`);
- :func:`deployment` from Python, to compose with other Ray Serve applications.

Every response carries ``X-Max-Replica`` (the replica that answered).  ``GET /metrics`` answers with
the metrics of the replica that took the request; every replica also mirrors its metrics into Ray's
metrics (``ray_maxserve_*``, tagged ``replica``), which each Ray node exports for Prometheus
(``ray start --metrics-export-port``; on the local cluster of ``max serve --replicas``, the port of
``--metrics-port``).  GPU replicas ask Ray for one GPU per device in ``devices``; Ray then shows each
replica only its own GPUs, numbered from 0.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from typing import Any, Callable, Optional

logger = logging.getLogger("max.serve")

__all__ = ["app", "check_ray_address", "deployment", "ray_available", "run", "shutdown", "wait_for_signal",
           "wait_running"]

INSTALL_HINT = "Ray Serve is not installed: pip install 'libremax[ray]' (or pip install 'ray[serve]')"

_DEPLOYMENT_KEYS = ("num_replicas", "min_replicas", "max_replicas", "target_ongoing_requests", "num_cpus",
                    "served_model_name", "api_key", "max_queue_size", "tool_parser")


def ray_available() -> bool:
    """Whether ``ray[serve]`` can be imported."""
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        return False
    return True


def _require_ray() -> None:
    if not ray_available():
        raise ImportError(INSTALL_HINT)


def check_ray_address(address: str, timeout: float = 5.0) -> None:
    """Raise ConnectionError unless the Ray cluster at ``address`` (``host:port``, ``ray://host:port``)
    answers a TCP connection within ``timeout`` seconds (``auto`` and ``local`` are left to Ray)."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[1] if "://" in address else address
    hostport = hostport.rstrip("/")
    host, sep, port_s = hostport.rpartition(":")
    if not sep or not port_s.isdigit():
        default = 10001 if address.startswith("ray://") else 6379
        host, port_s = hostport, str(default)
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port_s)), timeout=timeout):
            pass
    except OSError as e:
        raise ConnectionError(f"cannot reach the Ray cluster at {address!r} ({host}:{port_s}: {e}); start it "
                              "with `ray start --head` there, or leave --ray-address out to start a local "
                              "cluster") from None


class _ReplicaHeader:
    """Pure ASGI middleware adding ``X-Max-Replica: <replica id>`` to every response."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._id: Optional[bytes] = None

    def _replica_id(self) -> bytes:
        if self._id is None:
            self._id = _replica_label().encode()
        return self._id

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = self._replica_id()

        async def tagged(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), (b"x-max-replica", rid)]
            await send(message)

        await self.app(scope, receive, tagged)


def _replica_label() -> str:
    try:
        from ray import serve

        ctx = serve.get_replica_context()
        rep = getattr(ctx, "replica_id", None)
        rid = getattr(rep, "unique_id", None) or getattr(ctx, "replica_tag", None)
    except Exception:  # noqa: BLE001 - outside a replica
        rid = None
    return str(rid or f"{socket.gethostname()}-{os.getpid()}")


def _export_to_ray(registry: Any, interval: float = 2.0) -> threading.Thread:
    """Mirror this replica's Prometheus metrics (``registry``) into Ray's metrics every ``interval`` s,
    each sample tagged ``replica``: Ray exports them (as ``ray_maxserve_*``) from every node's metrics
    endpoint (``ray start --metrics-export-port``), which Prometheus scrapes per node."""
    from ray.util.metrics import Gauge

    replica = _replica_label()
    gauges: dict[str, Any] = {}

    def sync() -> None:
        for fam in registry.collect():
            for smp in fam.samples:
                if smp.name.endswith("_created"):
                    continue
                keys = tuple(sorted(smp.labels)) + ("replica",)
                g = gauges.get(smp.name)
                if g is None:
                    g = gauges[smp.name] = Gauge(smp.name, fam.documentation or smp.name, tag_keys=keys)
                g.set(float(smp.value), tags={**smp.labels, "replica": replica})

    def loop() -> None:
        import time

        while True:
            try:
                sync()
            except Exception:  # noqa: BLE001 - metrics must never take a replica down
                logger.debug("exporting metrics to Ray failed", exc_info=True)
            time.sleep(interval)

    t = threading.Thread(target=loop, name="max-serve-ray-metrics", daemon=True)
    t.start()
    return t


def _app_builder(config_kwargs: dict, app_kwargs: dict) -> Callable[[], Any]:
    """The function each replica calls (once, at start) to load the model and build its app."""

    def build_replica_app() -> Any:
        from max.pipelines import PipelineConfig
        from max.serve.server import build_app

        asgi = build_app(PipelineConfig(**config_kwargs), **app_kwargs)
        asgi.state.serve.replicated = True  # a 503 while draining sends clients to the other replicas
        asgi.add_middleware(_ReplicaHeader)
        _export_to_ray(asgi.state.serve.metrics.registry)
        return asgi

    return build_replica_app


def _uses_gpus(config_kwargs: dict) -> int:
    spec = str(config_kwargs.get("device_specs") or config_kwargs.get("devices") or "default").lower()
    if spec.startswith(("gpu", "accelerator")):
        ids = spec.split(":", 1)[1] if ":" in spec else "0"
        return max(1, len([i for i in ids.split(",") if i.strip()]))
    if spec == "default":
        from max.driver import accelerator_count

        return 1 if accelerator_count() else 0
    return 0


def deployment(config_kwargs: dict, app_kwargs: Optional[dict] = None, *, num_replicas: Optional[int] = None,
               min_replicas: Optional[int] = None, max_replicas: Optional[int] = None,
               target_ongoing_requests: Optional[float] = None, num_cpus: Optional[float] = None,
               name: str = "MaxServe") -> Any:
    """A Ray Serve deployment whose replicas each load the model of ``PipelineConfig(**config_kwargs)``
    and serve ``build_app(config, **app_kwargs)``.

    ``num_replicas`` fixes the replica count; ``min_replicas``/``max_replicas`` (and
    ``target_ongoing_requests``, default 2) make it Ray's ``autoscaling_config`` instead.  Each
    replica reserves ``num_cpus`` CPUs (default 1) and one GPU per device of ``devices``.
    """
    _require_ray()
    from ray import serve

    from max.pipelines.lib.config import batch_size_for

    app_kwargs = dict(app_kwargs or {})
    autoscale = min_replicas is not None or max_replicas is not None
    if autoscale and num_replicas not in (None, min_replicas):
        raise ValueError("give either a fixed replica count or --min-replicas/--max-replicas, not both")
    lo = 1 if min_replicas is None else min_replicas
    hi = max(lo, 1) if max_replicas is None else max_replicas
    if autoscale and not (0 <= lo <= hi and hi >= 1):
        raise ValueError(f"replicas: need 0 <= min_replicas <= max_replicas and max_replicas >= 1, got "
                         f"{lo}..{hi}")
    if num_replicas is not None and num_replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {num_replicas}")
    options: dict[str, Any] = {
        "name": name,
        "ray_actor_options": {"num_cpus": 1 if num_cpus is None else num_cpus, "num_gpus": _uses_gpus(config_kwargs)},
        "max_ongoing_requests": max(8, batch_size_for(config_kwargs.get("max_batch_size"), "text_generation") * 2),
        "health_check_period_s": 10,
        "graceful_shutdown_timeout_s": 20,
    }
    if autoscale:
        options["autoscaling_config"] = {
            "min_replicas": lo, "max_replicas": hi, "initial_replicas": max(lo, 1),
            "target_ongoing_requests": 2 if target_ongoing_requests is None else target_ongoing_requests}
    else:
        options["num_replicas"] = num_replicas or 1
    ingress = serve.ingress(_app_builder(dict(config_kwargs), app_kwargs))

    class MaxServeReplica:
        """One model replica serving libremax's OpenAI-compatible routes."""

    return serve.deployment(ingress(MaxServeReplica), **options)


def app(args: dict) -> Any:
    """The Ray Serve application builder of ``serve run max.serve.ray:app key=value ...``: the keys of
    :func:`deployment` (``num_replicas``, ``min_replicas``, ``max_replicas``, ``target_ongoing_requests``,
    ``num_cpus``) and of the server (``served_model_name``, ``api_key``, ``max_queue_size``,
    ``tool_parser``); every other key is a ``PipelineConfig`` field (``model_path``, ``devices``,
    ``max_length``...).  The config is checked here, before any replica starts."""
    from max.pipelines import PipelineConfig

    args = dict(args)
    dep = {k: args.pop(k) for k in list(args) if k in _DEPLOYMENT_KEYS}
    app_kwargs = {k: dep.pop(k) for k in ("served_model_name", "api_key", "max_queue_size", "tool_parser")
                  if k in dep}
    if "max_queue_size" in app_kwargs:
        app_kwargs["max_queue_size"] = int(app_kwargs["max_queue_size"])
    for k in ("num_replicas", "min_replicas", "max_replicas"):
        if k in dep:
            dep[k] = int(dep[k])
    for k in ("target_ongoing_requests", "num_cpus"):
        if k in dep:
            dep[k] = float(dep[k])
    cfg = PipelineConfig(**args)  # a bad field or model path fails here, not in every replica
    app_kwargs.setdefault("served_model_name", str(cfg.model_config.model_path))
    return deployment(args, app_kwargs, **dep).bind()


def run(config_kwargs: dict, app_kwargs: Optional[dict] = None, *, host: str = "127.0.0.1", port: int = 8000,
        num_replicas: Optional[int] = None, min_replicas: Optional[int] = None, max_replicas: Optional[int] = None,
        target_ongoing_requests: Optional[float] = None, num_cpus: Optional[float] = None,
        ray_address: Optional[str] = None, blocking: bool = True, wait_timeout: float = 600.0,
        metrics_export_port: Optional[int] = None) -> str:
    """Serve the model on Ray Serve at ``http://host:port`` and return that URL once every replica is up.

    Without ``ray_address`` a local Ray cluster is started (with at least one logical CPU per
    replica); with it, the existing cluster is joined (:func:`check_ray_address` first: an
    unreachable address fails before any model work; ``metrics_export_port``: where the local cluster
    exports Ray's metrics, the replicas' among them).  ``blocking``: serve until SIGINT/SIGTERM, then
    shut Serve and Ray down; otherwise return at once and let the caller call :func:`shutdown`.
    """
    _require_ray()
    if ray_address:
        check_ray_address(ray_address)
    dep = deployment(config_kwargs, app_kwargs, num_replicas=num_replicas, min_replicas=min_replicas,
                     max_replicas=max_replicas, target_ongoing_requests=target_ongoing_requests, num_cpus=num_cpus)
    import ray
    from ray import serve

    if not ray.is_initialized():
        if ray_address:
            try:
                ray.init(address=ray_address, logging_level=logging.WARNING)
            except ConnectionError as e:
                raise ConnectionError(_join_error(ray_address, e)) from e
            _JOINED.add("max")
        else:
            want = max(num_replicas or 1, max_replicas or 1, min_replicas or 1)
            cpus = max(os.cpu_count() or 1, int(want * (1 if num_cpus is None else num_cpus)) + 1)
            # libremax works offline: the local cluster sends no usage statistics unless the user asked
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            extra = {"_metrics_export_port": metrics_export_port} if metrics_export_port else {}
            ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING, **extra)
    serve.start(http_options={"host": host, "port": port})
    serve.run(dep.bind(), name="max", route_prefix="/", blocking=False)
    wait_running("max", wait_timeout)
    url = f"http://{host}:{port}"
    logger.info("serving on %s (Ray Serve)", url)
    if blocking:
        wait_for_signal()
    return url


def wait_for_signal() -> None:
    """Block until SIGINT/SIGTERM, then :func:`shutdown`."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    finally:
        shutdown()


def wait_running(app_name: str = "max", timeout: float = 600.0) -> None:
    """Wait until the Serve application ``app_name`` runs (every replica up); RuntimeError with Ray's
    message when its replicas fail to start, TimeoutError after ``timeout`` s."""
    import time

    from ray import serve

    t0 = time.monotonic()
    while True:
        st = serve.status().applications.get(app_name)
        status = str(getattr(st, "status", ""))
        if status.endswith("RUNNING"):
            return
        if status.endswith(("DEPLOY_FAILED", "UNHEALTHY")):
            msg = getattr(st, "message", "") or ""
            for d in (getattr(st, "deployments", None) or {}).values():
                msg = msg or getattr(d, "message", "")
            raise RuntimeError(f"the replicas failed to start: {msg}")
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"the replicas were not running after {timeout:.0f} s (status {status})")
        time.sleep(0.5)


_JOINED: set[str] = set()
"""Serve applications this process deployed on a cluster it joined (only those are deleted at the end)."""


def _join_error(address: str, e: BaseException) -> str:
    """ray.init's failure to join ``address``, with the fix when the cluster wants an auth token."""
    chain, cur = [], e
    while cur is not None:
        chain.append(str(cur))
        cur = cur.__cause__ or cur.__context__
    text = " ".join(chain)
    if "AuthToken" in text or "Authentication" in text:
        return (f"the Ray cluster at {address!r} uses token authentication: set RAY_AUTH_MODE=token and make "
                "its token available here (RAY_AUTH_TOKEN, or the file ~/.ray/auth_token from the head node)")
    return f"could not join the Ray cluster at {address!r}: {e}"


def shutdown() -> None:
    """End the serving: on a local cluster this process started, stop Ray Serve and the cluster; on a
    joined cluster, delete only the applications this process deployed (others' keep running) and
    disconnect."""
    import ray
    from ray import serve

    try:
        if _JOINED:
            for name in sorted(_JOINED):
                serve.delete(name)
            _JOINED.clear()
        else:
            serve.shutdown()
    finally:
        ray.shutdown()
