"""``max serve`` replicas on Ray Serve: a local Ray cluster on 127.0.0.1 serves the tiny Llama with 2
replicas; 40 requests through the ``openai`` client (chat and completions, streamed and not, sent
concurrently) each get the answer the single-process server gives (greedy decoding), both replicas
answer some, ``/v1/models`` lists the model, each replica's Prometheus metrics come out of Ray's
metrics endpoint tagged by replica; a tiny BERT as a second application answers ``/v1/embeddings``
with the in-process pipeline's vectors; and Ray is shut down.  Plus the CLI's checks that come
before any model work (an unreachable ``--ray-address``, conflicting replica options).

Skips only when ``ray[serve]`` is not installed (``pip install 'libremax[ray]'``; scripts/setup.sh
installs it).  Takes ~40 s on a 2-core machine: most of it is Ray starting its controller, proxy
and the two replica processes (each imports torch and compiles the model)."""

from __future__ import annotations

import concurrent.futures
import socket

import pytest

from max.serve.ray import INSTALL_HINT, ray_available

needs_ray = pytest.mark.skipif(not ray_available(), reason=f"ray[serve] is not installed ({INSTALL_HINT})")

CHAT = [[{"role": "user", "content": "Hello there"}], [{"role": "user", "content": "What is 2 + 2?"}]]
PROMPTS = ["def forward(self, x):", "import os"]


def _ask(client, kind: str, i: int) -> tuple[str, str | None]:
    """``(answer text, replica)`` of request ``i`` of ``kind`` (chat/completion, stream or not), greedy."""
    stream = kind.endswith("stream")
    if kind.startswith("chat"):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=CHAT[i % 2], max_tokens=8, temperature=0, stream=stream)
        body = raw.parse()
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in body if c.choices)
        else:
            assert body.choices[0].finish_reason in ("stop", "length")
            assert body.usage.completion_tokens <= 8
            text = body.choices[0].message.content
    else:
        raw = client.completions.with_raw_response.create(model="tiny", prompt=PROMPTS[i % 2], max_tokens=8,
                                                          temperature=0, stream=stream)
        body = raw.parse()
        text = "".join(c.choices[0].text for c in body) if stream else body.choices[0].text
    return text, raw.headers.get("x-max-replica")


@needs_ray
@pytest.mark.slow
def test_two_replicas_answer_like_one_server(tiny_model, tiny_bert, client, monkeypatch):
    import openai

    from max.entrypoints.cli import config_kwargs
    from max.serve import ray as max_ray
    from max.serve.server import free_port

    kinds = ["chat", "chat-stream", "completion", "completion-stream"]
    # the reference: the single-process server of the other serving tests, same model, same options
    want = {(k, i): _ask(client, k, i)[0] for k in kinds for i in range(2)}
    assert all(want.values())
    kw = config_kwargs(tiny_model, None, "cpu", 256, 16, num_threads=1)
    port, metrics_port = free_port(), free_port()
    while metrics_port == port:  # two free_port() calls may give the same just-released port
        metrics_port = free_port()
    monkeypatch.setenv("RAY_metrics_report_interval_ms", "500")  # Ray's metrics agent: every 0.5 s, not 10 s
    url = max_ray.run(kw, {"served_model_name": "tiny"}, host="127.0.0.1", port=port, num_replicas=2,
                      blocking=False, metrics_export_port=metrics_port)
    try:
        assert url == f"http://127.0.0.1:{port}"
        rc = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in rc.models.list().data] == ["tiny"]
        jobs = [(kinds[j % 4], j // 4) for j in range(40)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda job: (job, _ask(rc, *job)), jobs))
        replicas = set()
        for (kind, i), (text, replica) in answers:
            assert text == want[(kind, i % 2)], f"{kind} #{i}: {text!r} != {want[(kind, i % 2)]!r} (replica {replica})"
            assert replica
            replicas.add(replica)
        assert len(replicas) == 2, f"expected both replicas to answer, got {replicas}"
        # each replica's Prometheus metrics, exported through Ray's metrics endpoint, tagged by replica
        served = _replica_request_counts(metrics_port, want_total=40)
        assert set(served) == replicas and sum(served.values()) == 40, served
        _check_embeddings_app(url, tiny_bert)
    finally:
        max_ray.shutdown()
    import ray

    assert not ray.is_initialized()


def _check_embeddings_app(url: str, bert_path: str) -> None:
    """An embeddings model as a second application of the same cluster (route prefix ``/embed``, one
    replica): ``/v1/embeddings`` through the ``openai`` client gives the in-process pipeline's vectors."""
    import numpy as np
    import openai
    from ray import serve

    from max.pipelines.lib.embeddings_pipeline import load_embeddings_pipeline
    from max.serve import ray as max_ray

    dep = max_ray.deployment({"model_path": bert_path, "devices": "cpu", "num_threads": 1},
                             {"served_model_name": "bert"}, num_replicas=1, name="MaxEmbed")
    serve.run(dep.bind(), name="embed", route_prefix="/embed", blocking=False)
    max_ray.wait_running("embed", timeout=300)
    texts = ["the cat sat on the mat", "hello world"]
    r = openai.OpenAI(base_url=url + "/embed/v1", api_key="unused", max_retries=0, timeout=60).embeddings.create(
        model="bert", input=texts)
    want, _ = load_embeddings_pipeline(bert_path, device_specs="cpu").encode_texts(texts)
    np.testing.assert_allclose(np.array([d.embedding for d in r.data]), want, rtol=1e-5, atol=1e-6)


def _replica_request_counts(metrics_port: int, want_total: int, timeout: float = 30.0) -> dict[str, float]:
    """``{replica: 200 answers to chat + completions}`` from Ray's metrics export (polled until they add
    up to ``want_total``: replicas mirror their metrics every 2 s, Ray exports them shortly after)."""
    import re
    import time
    import urllib.request

    pat = re.compile(r'^ray_maxserve_requests_total\{([^}]*)\} ([0-9.e+]+)$', re.M)
    t0 = time.monotonic()
    while True:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        counts: dict[str, float] = {}
        for labels, value in pat.findall(text):
            tags = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            if tags.get("status") == "200" and tags.get("endpoint") in ("/v1/chat/completions", "/v1/completions"):
                counts[tags["replica"]] = counts.get(tags["replica"], 0.0) + float(value)
        if sum(counts.values()) >= want_total or time.monotonic() - t0 > timeout:
            return counts
        time.sleep(0.5)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: nothing listens there


@needs_ray
def test_unreachable_ray_address_fails_before_model_work(tiny_model, monkeypatch):
    from click.testing import CliRunner

    from max.entrypoints.cli import main

    def boom(*a, **k):
        raise AssertionError("model work started")

    monkeypatch.setattr("max.serve.ray.run", boom)
    monkeypatch.setattr("max.pipelines.PipelineConfig", boom)
    addr = f"127.0.0.1:{_closed_port()}"
    res = CliRunner().invoke(main, ["serve", "--model-path", tiny_model, "--devices", "cpu", "--ray-address", addr])
    assert res.exit_code != 0
    assert f"cannot reach the Ray cluster at '{addr}'" in res.output


@pytest.mark.parametrize("args,match", [
    (["--replicas", "2", "--max-replicas", "3"], "not both"),
    (["--replicas", "2", "--lora-paths", "a=b"], "cannot be combined with Ray Serve"),
])
def test_conflicting_replica_options_are_usage_errors(tiny_model, args, match):
    from click.testing import CliRunner

    from max.entrypoints.cli import main

    res = CliRunner().invoke(main, ["serve", "--model-path", tiny_model, "--devices", "cpu", *args])
    assert res.exit_code == 2 and match in res.output, res.output


@needs_ray
def test_deployment_options_reach_ray(tiny_model):
    """The replica count, Ray's autoscaling config and the per-replica resources are what was asked for;
    ``serve run max.serve.ray:app key=value`` checks the model's config before any replica starts."""
    from max.serve import ray as max_ray

    auto = max_ray.deployment({"model_path": tiny_model, "devices": "cpu"}, min_replicas=1, max_replicas=3,
                              target_ongoing_requests=4)
    cfg = auto._deployment_config.autoscaling_config
    assert (cfg.min_replicas, cfg.max_replicas, cfg.target_ongoing_requests) == (1, 3, 4.0)
    assert auto.ray_actor_options == {"num_cpus": 1, "num_gpus": 0}
    fixed = max_ray.deployment({"model_path": tiny_model, "devices": "gpu:0,1"}, num_replicas=3, num_cpus=2)
    assert fixed.num_replicas == 3 and fixed.ray_actor_options == {"num_cpus": 2, "num_gpus": 2}
    assert fixed._deployment_config.autoscaling_config is None
    built = max_ray.app({"model_path": tiny_model, "devices": "cpu", "num_replicas": "2", "max_length": "64"})
    assert type(built).__name__ == "Application"
    try:  # what `serve run max.serve.ray:app key=value ...` does with the builder (Ray's own helper)
        from ray.serve._private.api import call_user_app_builder_with_args_if_necessary as call_builder
    except ImportError:
        call_builder = None
    if call_builder is not None:
        assert type(call_builder(max_ray.app, {"model_path": tiny_model, "devices": "cpu"})).__name__ == "Application"
    with pytest.raises(ValueError, match="unknown option .no_such_field."):
        max_ray.app({"model_path": tiny_model, "no_such_field": "1"})
    with pytest.raises(ValueError, match="not both"):
        max_ray.deployment({"model_path": tiny_model}, num_replicas=2, min_replicas=1, max_replicas=3)
