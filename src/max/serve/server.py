"""Building and running the ``max serve`` server.

:func:`build_app` loads the model once through the pipeline registry (a
``TextGenerationPipeline`` driven by the shared ``TokenGenerationScheduler``, or an
``EmbeddingsPipeline``) and wraps it in the FastAPI app; :func:`build_multi_app` serves several models
from one app (requests routed by their ``model``); :func:`serve` runs it under uvicorn (blocking);
:class:`ServerThread` runs one in a background thread (tests, benchmarks).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any, Optional

from max.serve.lifecycle import DEFAULT_DRAIN_TIMEOUT_S, draining_server
from max.serve.response_store import DEFAULT_RESPONSES_STORE_SIZE
from max.serve.state import DEFAULT_MAX_REQUEST_BYTES

logger = logging.getLogger("max.serve")


def model_task(pipeline_config: Any) -> Any:
    """The ``PipelineTask`` of the configured model."""
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    register_all_models()
    return PIPELINE_REGISTRY.retrieve_pipeline_task(pipeline_config)


def is_speech_recognition(pipeline_config: Any) -> bool:
    """Whether the configured model is a speech recognition model (Whisper), served by the audio routes (the
    registry says: its architecture has a transcription pipeline)."""
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    register_all_models()
    return PIPELINE_REGISTRY.transcribes(pipeline_config)


def build_app(pipeline_config: Any, *, served_model_name: Optional[str] = None, api_key: Optional[str] = None,
              max_queue_size: Optional[int] = None, metrics: Any = None, tool_parser: Optional[str] = None,
              max_request_bytes: Optional[int] = DEFAULT_MAX_REQUEST_BYTES,
              responses_store_size: int = DEFAULT_RESPONSES_STORE_SIZE, max_audio_seconds: float = 1800.0,
              **app_options: Any) -> Any:
    """Load the model of ``pipeline_config`` and return the FastAPI app serving it (``tool_parser`` and
    ``app_options`` such as ``reasoning_parser``, ``allowed_origins``: see :func:`~max.serve.app.create_app`;
    request bodies up to ``max_request_bytes``, None for no limit; ``/v1/responses`` keeps the last
    ``responses_store_size`` responses for ``previous_response_id``; uploaded audio up to
    ``max_audio_seconds`` for a speech recognition model)."""
    from max.serve.response_store import ResponseStore

    app = _build_app(pipeline_config, served_model_name=served_model_name, api_key=api_key,
                     max_queue_size=max_queue_size, metrics=metrics, tool_parser=tool_parser,
                     max_audio_seconds=max_audio_seconds, **app_options)
    app.state.serve.max_request_bytes = max_request_bytes
    app.state.serve.responses = ResponseStore(responses_store_size)
    return app


def kv_share(kv_cache_memory: Optional[int], device_memory_utilization: Optional[float], n_models: int
             ) -> tuple[Optional[int], Optional[float]]:
    """Each model's KV budget when ``n_models`` share one server: an explicit ``--kv-cache-memory`` is the
    whole server's and is split evenly; so is ``--device-memory-utilization`` (the cap of a default-sized
    pool, as a fraction of the memory free when the model loads; default 0.9)."""
    from max.pipelines.lib.config import KVCacheConfig

    if n_models < 1:
        raise ValueError(f"kv_share: n_models must be >= 1, got {n_models}")
    mem = None if kv_cache_memory is None else int(kv_cache_memory) // n_models
    util = device_memory_utilization
    if n_models > 1:
        util = (util if util is not None else KVCacheConfig.device_memory_utilization) / n_models
    return mem, util


class _Totals:
    """Sums of one attribute over several schedulers or KV managers: the queue, page and prefix-cache gauges
    of a server with several models (the spill tier's gauges read 0)."""

    spill = None

    def __init__(self, parts: list[Any]) -> None:
        self._parts = parts

    def __getattr__(self, name: str) -> Any:
        return sum(getattr(p, name, 0) for p in self._parts)

    @property
    def cache_hit_rate(self) -> float:
        q = self.prefix_cache_queried_tokens
        return self.prefix_cache_hit_tokens / q if q else 0.0


def build_multi_app(pipeline_configs: list[Any], served_model_names: list[Optional[str]], **options: Any) -> Any:
    """One app serving every model of ``pipeline_configs`` (text generation or embeddings; each loaded as
    :func:`build_app` loads one, ``served_model_names[i]`` its id, None for its path); requests go to the
    model their ``model`` names, the first when they name none.  The API key, limits, metrics and response
    store are the server's; a model's path or folder name is an alias of it only when no other model has
    the same one.  ``options`` as for :func:`build_app`."""
    from max.serve.metrics import ServeMetrics

    if len(pipeline_configs) != len(served_model_names) or not pipeline_configs:
        raise ValueError("build_multi_app: give one served name (or None) per model")
    if len(pipeline_configs) == 1:
        return build_app(pipeline_configs[0], served_model_name=served_model_names[0], **options)
    for cfg in pipeline_configs:
        if is_speech_recognition(cfg):
            raise ValueError(f"{cfg.model_config.model_path}: speech models are served on their own (one "
                             "--model-path); several models in one server must generate text or embeddings")
    metrics = options.pop("metrics", None) or ServeMetrics()
    apps = [build_app(cfg, served_model_name=name, metrics=metrics, **options)
            for cfg, name in zip(pipeline_configs, served_model_names)]
    states = [a.state.serve for a in apps]
    names = [st.model_name for st in states]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"several models would be served as {', '.join(dup)}: give each its own "
                         "--served-model-name")
    for st in states:  # an alias two models share names neither; a model's id is never another's alias
        st.aliases = {a for a in st.aliases if a not in names and sum(a in o.aliases for o in states) == 1}
    main = states[0]
    for st in states[1:]:
        if st.speaker is not None:
            raise ValueError(f"'{st.model_name}' is a text-to-speech model: speech models are served on their own")
        st.api_key, st.metrics, st.lifecycle, st.responses = main.api_key, main.metrics, main.lifecycle, main.responses
        st.max_request_bytes = main.max_request_bytes
    if main.speaker is not None:
        raise ValueError(f"'{main.model_name}' is a text-to-speech model: speech models are served on their own")
    main.others = states[1:]
    gens = [st.generator for st in states if st.generator is not None]
    if gens:
        kvs = [g.kv_manager for g in gens if g.kv_manager is not None]
        metrics.bind(_Totals([g.scheduler for g in gens]), _Totals(kvs) if kvs else None)
    return apps[0]


def _build_app(pipeline_config: Any, *, served_model_name: Optional[str], api_key: Optional[str],
               max_queue_size: Optional[int], metrics: Any, tool_parser: Optional[str],
               max_audio_seconds: float = 1800.0, **app_options: Any) -> Any:
    from max.interfaces import PipelineTask
    from max.pipelines.lib.registry import PIPELINE_REGISTRY
    from max.serve.app import EmbeddingsEngine, GenerationEngine, create_app
    from max.serve.metrics import ServeMetrics

    metrics = metrics or ServeMetrics()
    path = str(pipeline_config.model_config.model_path)
    name = served_model_name or path
    aliases = {path, os.path.basename(path.rstrip("/")), os.path.splitext(os.path.basename(path))[0]}
    if is_speech_recognition(pipeline_config):
        from max.serve.engines import TranscriptionEngine

        engine = TranscriptionEngine(PIPELINE_REGISTRY.retrieve_transcriber(pipeline_config),
                                     pipeline_config.batch_size_for("transcription"),
                                     max_audio_seconds=max_audio_seconds)
        return create_app(name, transcriber=engine, api_key=api_key, metrics=metrics, aliases=aliases,
                          **{k: v for k, v in app_options.items() if k == "allowed_origins"})
    task = model_task(pipeline_config)
    if task == PipelineTask.AUDIO_GENERATION:  # text to speech (CSM): /v1/audio/speech
        from max.serve.speech_engine import SpeechEngine

        _, pipeline = PIPELINE_REGISTRY.retrieve(pipeline_config, task=PipelineTask.AUDIO_GENERATION)
        return create_app(name, speaker=SpeechEngine(pipeline, pipeline_config.batch_size_for(task)), api_key=api_key,
                          metrics=metrics, aliases=aliases,
                          **{k: v for k, v in app_options.items() if k == "allowed_origins"})
    if task == PipelineTask.EMBEDDINGS_GENERATION:
        tokenizer, pipeline = PIPELINE_REGISTRY.retrieve(pipeline_config, task=PipelineTask.EMBEDDINGS_GENERATION)
        engine = EmbeddingsEngine(pipeline, max_length=getattr(tokenizer, "max_length", None))
        return create_app(name, embedder=engine, api_key=api_key, metrics=metrics, aliases=aliases,
                          **{k: v for k, v in app_options.items() if k == "allowed_origins"})
    if task != PipelineTask.TEXT_GENERATION:
        raise ValueError(f"max serve: models of task {task.value!r} are not served (text generation and "
                         "embeddings are)")
    from max.pipelines.lib.scheduler import TokenGenerationScheduler

    tokenizer, pipeline = PIPELINE_REGISTRY.retrieve(pipeline_config)
    if getattr(pipeline, "metrics", None) is not None and hasattr(pipeline.metrics, "acceptance_rate"):
        metrics.bind_speculative(pipeline.metrics)
    scheduler = TokenGenerationScheduler(
        pipeline, tokenizer, max_batch_size=pipeline_config.batch_size_for(task), max_queue_size=max_queue_size,
        prefill_token_budget=pipeline_config.prefill_chunk_size, metrics=metrics)
    return create_app(name, generator=GenerationEngine.from_pipeline(tokenizer, pipeline, scheduler),
                      api_key=api_key, metrics=metrics, aliases=aliases, tool_parser=tool_parser, **app_options)


def serve(app: Any, host: str = "127.0.0.1", port: int = 8000, *, metrics_port: Optional[int] = None,
          log_level: str = "info", drain_timeout: float = DEFAULT_DRAIN_TIMEOUT_S) -> None:
    """Run ``app`` under uvicorn until SIGTERM/SIGINT, then shut down gracefully (see
    :mod:`max.serve.lifecycle`: no new work, ``drain_timeout`` s for the requests in flight, the rest
    ended cleanly) and return; Prometheus metrics also on ``metrics_port`` when given."""
    import uvicorn

    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=host, registry=app.state.serve.metrics.registry)
        logger.info("metrics on http://%s:%d/metrics", host, metrics_port)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    draining_server(config, app.state.serve.lifecycle, drain_timeout).run()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerThread:
    """``app`` under uvicorn on a background thread (``with ServerThread(app) as srv: srv.url``)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: Optional[int] = None, log_level: str = "warning"
                 ) -> None:
        import uvicorn

        self.app = app
        self.host = host
        self.port = port or free_port(host)
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level=log_level,
                                                    timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, name="max-serve-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> "ServerThread":
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server thread exited during start-up")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError("the server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
