"""Standardized configuration for pipeline inference: ``PipelineConfig`` and its records.

Each concern is a record whose fields are *knobs* (:func:`max.pipelines.lib.knobs.knob`): the field's
declaration carries its default, type, help text, validation (choices, bounds), keyword aliases and
command-line flag, once.  The records: ``MAXModelConfig`` (the model: path, weights, encoding, devices),
``KVCacheConfig`` (the KV cache), ``SamplingConfig`` (graph-level sampling), ``ProfilingConfig``,
``LoRAConfig`` and the pipeline's own fields (scheduling and serving: batch sizes, lengths, speculative
decoding).  All but ``MAXModelConfig`` (which ``resolve()`` completes in place) are frozen.

``PipelineConfig(**kwargs)`` accepts every knob of every record flat (and the knobs' aliases, e.g.
``devices`` for ``device_specs``, ``cache_dtype`` for ``kv_cache_dtype``); each keyword is routed to the
record that owns it, and an unknown keyword raises ValueError listing the valid ones.  Keys may use
dashes (``quantization-encoding``) and values may be CLI strings (``"8"``, ``"true"``, ``"q4_k"``,
``"gpu:0,1"``): they are converted by the field's type.  ``max generate`` / ``max serve``'s model flags are
generated from the same declarations (``max.entrypoints.cli.knob_option``).

``max_batch_size`` left unset means the workload's entry of :data:`MAX_BATCH_SIZE_DEFAULTS`
(:meth:`PipelineConfig.batch_size_for`): the KV cache's slots and the scheduler's limit both read it.

Resolution has two halves.  Making a config locates the model (``resolve()``: a local folder with
``config.json`` + weights, a GGUF file, or a repo id in the local Hugging Face cache), finds the weight
files and checks ``quantization_encoding`` against them, so a bad path fails at once.  Picking the
architecture is ``PipelineRegistry.resolve(config)`` (registry.py), which returns a
``ResolvedArchitecture``; this module never imports the registry.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import logging
import os
import sys
import typing
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from max.driver import DeviceSpec
from max.dtype import DType
from max.graph.weights import WeightsFormat
from max.nn.kv_cache import KVCacheStrategy, parse_memory_size
from max.nn.kv_cache.cache_params import KV_CACHE_DTYPES
from max.pipelines.lib.knobs import Flag, accept_aliases, check_knobs, default_of, knob, knobs_of
from max.pipelines.lib.gguf_utils import GGUFMetadata, is_gguf_file, read_gguf_metadata
from max.graph.quantization import formats
from max.pipelines.lib.hf_utils import (
    HuggingFaceRepo,
    model_type_classes,
    RepoType,
    SupportedEncoding,
    get_rope_parameters,
    load_generation_config,
    load_huggingface_config,
)

logger = logging.getLogger("max.pipelines")

__all__ = [
    "AudioGenerationConfig",
    "KVCacheConfig",
    "LoRAConfig",
    "MAXModelConfig",
    "PipelineConfig",
    "PipelineRole",
    "PrependPromptSpeechTokens",
    "ProfilingConfig",
    "PrometheusMetricsMode",
    "SamplingConfig",
    "MAX_BATCH_SIZE_DEFAULTS",
    "SupportedEncoding",
    "batch_size_for",
    "parse_device_specs",
]


class PipelineRole(str, enum.Enum):
    PrefillAndDecode = "prefill_and_decode"
    PrefillOnly = "prefill_only"
    DecodeOnly = "decode_only"


class PrependPromptSpeechTokens(str, enum.Enum):
    NEVER = "never"
    """Never prepend the prompt speech tokens sent to the audio decoder."""
    ONCE = "once"
    """Prepend the prompt speech tokens to the first block of the audio decoder."""
    ROLLING = "rolling"
    """Prepend them to the first block, and to later blocks to reach the buffer size."""


class PrometheusMetricsMode(str, enum.Enum):
    INSTRUMENT_ONLY = "instrument_only"
    LAUNCH_MULTIPROC_SERVER = "launch_multiproc_server"
    LAUNCH_SERVER = "launch_server"


# --------------------------------------------------------------------------- value coercion

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def parse_device_specs(value: Any) -> list[DeviceSpec]:
    """Device specs from CLI-like input: ``"cpu"``, ``"gpu"`` (first accelerator),
    ``"gpu:0,1"``, ``"default"`` (accelerators if any, else CPU), a DeviceSpec, or a list."""
    from max.driver import scan_available_devices

    if value is None:
        return scan_available_devices()
    if isinstance(value, DeviceSpec):
        return [value]
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("", "default"):
            return scan_available_devices()
        if v == "cpu":
            return [DeviceSpec.cpu()]
        if v in ("gpu", "accelerator"):
            return [DeviceSpec.accelerator(0)]
        for prefix in ("gpu:", "accelerator:", "cpu:"):
            if v.startswith(prefix):
                try:
                    ids = [int(x) for x in v[len(prefix):].split(",") if x.strip()]
                except ValueError:
                    raise ValueError(f"Invalid devices {value!r}: expected e.g. '{prefix}0,1'") from None
                if not ids or any(i < 0 for i in ids):
                    raise ValueError(f"Invalid devices {value!r}: expected non-negative ids, e.g. '{prefix}0,1'")
                if len(set(ids)) != len(ids):
                    raise ValueError(f"Invalid devices {value!r}: device ids must be distinct")
                if prefix == "cpu:":  # logical CPU devices: one tensor-parallel shard each, all on the host
                    return [DeviceSpec.cpu(i) for i in ids]
                return [DeviceSpec.accelerator(i) for i in ids]
        raise ValueError(f"Invalid devices {value!r}: expected 'cpu', 'cpu:<ids>', 'gpu', 'gpu:<ids>' or 'default'")
    if isinstance(value, (list, tuple)):
        out: list[DeviceSpec] = []
        for v in value:
            out.extend(parse_device_specs(v))
        return out
    raise TypeError(f"Invalid devices {value!r}: expected a str, DeviceSpec or list of DeviceSpec")


def _coerce(name: str, tp: Any, value: Any) -> Any:
    """Convert ``value`` (possibly a CLI string) to the annotated type ``tp``."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Union:
        non_none = [a for a in args if a is not type(None)]
        if isinstance(value, str) and value.strip().lower() == "none" and len(non_none) < len(args):
            return None
        last_err: Optional[Exception] = None
        for a in non_none:
            try:
                return _coerce(name, a, value)
            except (TypeError, ValueError) as e:
                last_err = e
        raise ValueError(f"{name}: cannot use {value!r}: {last_err}")
    if origin in (list, tuple):
        elem = args[0] if args else Any
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()] if value else []
        if not isinstance(value, (list, tuple)):
            value = [value]
        return [_coerce(name, elem, v) for v in value]
    if origin is dict or tp is Any or origin is typing.Literal:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ValueError(f"{name}: expected a bool, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ValueError(f"{name}: expected an int, got {value!r}")
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                raise ValueError(f"{name}: expected an int, got {value!r}") from None
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{name}: expected an int, got {value!r}")
        if isinstance(value, (int, float)):
            return int(value)
        raise ValueError(f"{name}: expected an int, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ValueError(f"{name}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected a number, got {value!r}") from None
    if tp is str:
        return value if isinstance(value, str) else str(value)
    if tp is Path:
        return Path(value).expanduser() if isinstance(value, (str, os.PathLike)) else value
    if tp is SupportedEncoding:
        return SupportedEncoding.parse(value)
    if tp is DType:
        if isinstance(value, DType):
            return value
        try:
            return DType[str(value)]
        except KeyError:
            raise ValueError(f"{name}: unknown dtype {value!r}") from None
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        try:
            return tp(value)
        except ValueError:
            try:
                return tp[str(value)]
            except KeyError:
                raise ValueError(f"{name}: expected one of {[e.value for e in tp]}, got {value!r}") from None
    return value


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))


def _public_fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")]


class _ConfigBase:
    """Dataclass helpers: coerce CLI-like values on construction, check the knobs' choices and bounds
    (:mod:`max.pipelines.lib.knobs`); ``help()``."""

    def _coerce_fields(self) -> None:
        hints = _hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.name.startswith("_"):
                continue
            object.__setattr__(self, f.name, _coerce(f"{type(self).__name__}.{f.name}", hints[f.name],
                                                      getattr(self, f.name)))

    def __post_init__(self) -> None:
        self._coerce_fields()
        check_knobs(self)

    @classmethod
    def help(cls) -> dict[str, str]:
        """Config options and their descriptions."""
        return {name: spec.help for name, (_, spec) in knobs_of(cls).items()}


# --------------------------------------------------------------------------- nested configs

KV_CACHE_DTYPE_CHOICES = ("auto", *KV_CACHE_DTYPES)
"""``kv_cache_dtype``'s values: ``auto`` and the names of ``max.nn.kv_cache.cache_params.KV_CACHE_DTYPES``."""


def _kv_cache_dtype_name(value: Any) -> Any:
    """``cache_dtype=`` (a DType, or a dtype name) as a ``kv_cache_dtype`` name."""
    if isinstance(value, DType):
        for name, dt in KV_CACHE_DTYPES.items():
            if dt == value:
                return name
        raise ValueError(f"cache_dtype {value} is not a KV cache dtype; use one of {', '.join(KV_CACHE_DTYPES)}")
    return value


@accept_aliases
@dataclass(frozen=True)
class KVCacheConfig(_ConfigBase):
    """KV cache layout and memory settings (a frozen record: ``dataclasses.replace`` makes a changed copy).

    ``kv_cache_dtype`` is the one knob for how K and V are stored; ``cache_dtype`` (MAX's name) is its
    alias as a keyword, and as a property reads it as a ``DType`` (None for ``auto``)."""

    cache_strategy: KVCacheStrategy = knob(KVCacheStrategy.MODEL_DEFAULT,
                                           help="KV cache strategy: 'model_default' or 'paged'.")
    kv_cache_page_size: int = knob(128, ge=1, aliases=("page_size",), help="Tokens per KV cache page (paged strategy).")
    enable_prefix_caching: bool = knob(True, help="Reuse KV cache pages of shared prompt prefixes.",
                                       flag=Flag(default=True, show_default=True))
    """On by default, as MAX's ``KVCacheConfig`` and ``max serve`` have it (``--no-enable-prefix-caching`` or
    ``enable_prefix_caching=False`` turns it off)."""
    enable_kvcache_swapping_to_host: bool = knob(
        False, help="Spill prefix-cache pages evicted from the KV cache to host memory (or --kv-cache-spill-dir) "
                    "and bring them back on a prefix hit.",
        flag=Flag(is_flag=True, extra=True))
    device_memory_utilization: float = knob(
        0.9, gt=0, le=1, help="Most of the free device memory the default-sized KV cache may take (default {default}).",
        flag=Flag())
    host_kvcache_swap_space_gb: float = knob(50.0, gt=0,
                                             help="Most GiB the prefix cache's spill tier holds (default {default}).",
                                             flag=Flag(extra=True))
    kv_cache_dtype: str = knob(
        "auto", choices=KV_CACHE_DTYPE_CHOICES, aliases=("cache_dtype", "kv_cache_format"),
        help="How the KV cache stores keys and values: auto (the model's float dtype), or int8 / fp8_e4m3 (8-bit "
             "codes with a scale per token and KV head: about a quarter of a float32 cache; int8 costs SmolLM2 a KL "
             "of ~0.0006), or a float dtype.",
        flag=Flag(extra=True))
    kv_cache_spill_dir: Optional[str] = knob(
        None, help="Spill evicted prefix-cache pages to files in this directory instead of host memory (implies "
                   "--enable-kvcache-swapping-to-host).",
        flag=Flag(extra=True, path={"file_okay": False}, implies=(("enable_kvcache_swapping_to_host", True),)))
    kv_cache_memory: Optional[int] = knob(
        None, ge=1,
        help="KV cache size per device, e.g. 512MiB or 2GiB (default: room for --max-batch-size sequences of "
             "--max-length tokens but at most 32768 tokens, within --device-memory-utilization of free memory).",
        flag=Flag(memory_size=True, metavar="SIZE"))
    """Bytes (strings such as ``"512MiB"`` are accepted); see ``max.nn.kv_cache.sizing``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_cache_dtype", _kv_cache_dtype_name(self.kv_cache_dtype))
        if self.kv_cache_memory is not None and not isinstance(self.kv_cache_memory, int):
            try:
                object.__setattr__(self, "kv_cache_memory", parse_memory_size(self.kv_cache_memory))
            except ValueError as e:
                raise ValueError(f"kv_cache_memory: {e}") from None
        super().__post_init__()
        if self.enable_kvcache_swapping_to_host and not self.enable_prefix_caching:
            raise ValueError("enable_kvcache_swapping_to_host requires enable_prefix_caching")
        if self.kv_cache_spill_dir is not None and not self.enable_kvcache_swapping_to_host:
            raise ValueError("kv_cache_spill_dir requires enable_kvcache_swapping_to_host")

    @property
    def cache_dtype(self) -> Optional[DType]:
        """``kv_cache_dtype`` as a DType (None for ``auto``: the model's float dtype)."""
        return None if self.kv_cache_dtype == "auto" else KV_CACHE_DTYPES[self.kv_cache_dtype]

    def refuse_kv_cache_dtype(self, family: str, allowed: Sequence[Any] = (), why: str = "") -> None:
        """NotImplementedError at load when a family cannot store its cache as ``kv_cache_dtype`` (``allowed``:
        the DTypes it can; ``auto`` is always allowed)."""
        dt = self.cache_dtype
        if dt is not None and dt not in allowed:
            ok = ", ".join(["auto", *(n for n, d in KV_CACHE_DTYPES.items() if d in allowed)])
            raise NotImplementedError(f"{family}: kv_cache_dtype {self.kv_cache_dtype!r} is not supported "
                                      f"({why or 'its attention reads a float cache'}); use {ok}")

    def refuse_swapping(self, family: str) -> None:
        """NotImplementedError at load for a family without prefix caching given the spill tier's options."""
        if self.enable_kvcache_swapping_to_host:
            raise NotImplementedError(f"{family}: enable_kvcache_swapping_to_host / kv_cache_spill_dir need "
                                      "prefix caching, which this family does not have")


@dataclass(frozen=True)
class SamplingConfig(_ConfigBase):
    """Graph-level sampling options (per-request values live in ``SamplingParams``)."""

    in_dtype: DType = knob(DType.float32, help="dtype of the logits given to the sampler.")
    out_dtype: DType = knob(DType.float32, help="dtype of the logits returned by the sampler.")
    enable_structured_output: bool = knob(False, help="Enable constrained decoding (JSON schemas).")
    enable_variable_logits: bool = knob(False, help="Allow several logits per sequence (echo / speculative decoding).")
    enable_penalties: bool = knob(False, help="Apply frequency/presence/repetition penalties.")
    enable_min_tokens: bool = knob(False, help="Mask EOS until min_new_tokens have been generated.")


@dataclass(frozen=True)
class ProfilingConfig(_ConfigBase):
    gpu_profiling: str = knob("off", choices=("off", "on", "detailed"),
                              help="GPU profiling mode: off, on or detailed.")


@dataclass(frozen=True)
class LoRAConfig(_ConfigBase):
    enable_lora: bool = knob(False, help="Build the model with LoRA slots (implied by --lora-paths); adapters can "
                                         "then be loaded at run time (POST /v1/load_lora_adapter).",
                             flag=Flag(is_flag=True, default=False))
    lora_paths: list[str] = knob(default_factory=list, help="A PEFT LoRA adapter to load at start-up, NAME=PATH "
                                 "(repeat for several); requests select it with \"model\": \"NAME\".", flag=Flag())
    max_lora_rank: int = knob(16, help="Largest LoRA rank accepted (default {default}).", flag=Flag())
    max_num_loras: int = knob(1, help="LoRA adapters resident at once (default {default}).", flag=Flag())


# --------------------------------------------------------------------------- model config

_FLOAT_ENCODINGS = (SupportedEncoding.float32, SupportedEncoding.bfloat16)
_ON_LOAD_QUANTIZE = tuple(SupportedEncoding(f.user_name) for f in formats.quantizable_on_load())
_ON_LOAD_DEQUANTIZE = tuple(SupportedEncoding(f.user_name) for f in formats.float_formats(ggml=True))


def load_conversion_targets(available: list) -> list:
    """Encodings the weights in ``available`` encodings can be converted to once at load: GGML
    block-quantised weights (and GPTQ/AWQ int4 groups) dequantise to float32/bfloat16/float16; float weights quantise to
    q4_0/q4_1/q5_0/q5_1/q8_0 (what ``--quantization-encoding`` accepts beyond the files' own)."""
    out: list = []
    if any(a.is_quantized for a in available):
        out += [e for e in _ON_LOAD_DEQUANTIZE if e not in available]
    if any(not a.is_quantized for a in available):
        out += [e for e in _ON_LOAD_QUANTIZE if e not in available]
    return out


def load_conversion_source(requested: Any, available: list) -> Any:
    """The available encoding ``requested`` is converted from at load, or None if it cannot be."""
    if requested not in load_conversion_targets(available):
        return None
    if requested in _ON_LOAD_DEQUANTIZE:
        return next(a for a in available if a.is_quantized)
    return next(a for a in available if not a.is_quantized)


@accept_aliases
@dataclass
class MAXModelConfig(_ConfigBase):
    """Where the model is and how its weights are stored."""

    model_path: str = knob("", help="Model folder (config.json + weights), .gguf file, or cached HF repo id.",
                           flag=Flag(note="Default: the bundled SmolLM2-135M-Instruct."))
    """A local model folder (``config.json`` + weights), a GGUF file, or a repo id present
    in the local Hugging Face cache."""
    served_model_name: Optional[str] = knob(None, help="Name the server reports for the model (defaults to "
                                                       "model_path).")
    weight_path: list[Path] = knob(default_factory=list, aliases=("weight_paths",),
                                   help="Weight files to load (relative to the model folder, or absolute).")
    """Weight files; relative paths are resolved against the model folder."""
    quantization_encoding: Optional[SupportedEncoding] = knob(None, aliases=("encoding",),
                                                              help=formats.encoding_help(), flag=Flag())
    allow_safetensors_weights_fp32_bf6_bidirectional_cast: bool = knob(
        False, help="Allow float32<->bfloat16 casts of safetensors.")
    """Allow running float32 safetensors weights as bfloat16 and vice versa."""
    huggingface_model_revision: str = knob("main", aliases=("revision",),
                                           help="Revision of the model repo (cached repos only).")
    huggingface_weight_revision: str = knob("main", help="Revision of the weights repo (cached repos only).")
    trust_remote_code: bool = knob(False, help="Allow custom modelling code from the repo.")
    device_specs: list[DeviceSpec] = knob(
        default_factory=lambda: parse_device_specs("default"), aliases=("devices",),
        help="'cpu', 'gpu', 'default', or several devices to split the model over (tensor parallel): 'gpu:0,1' "
             "(GPUs 0 and 1), 'cpu:0,1' (logical CPU devices, for testing).",
        flag=Flag(decls=("--devices",), default="default", show_default=True))
    force_download: bool = knob(False, help="Unsupported offline; must stay False.")
    rope_type: Optional[str] = knob(None, help="Override the RoPE type.")
    use_subgraphs: bool = knob(True, help="Build repeated layers as subgraphs.")
    data_parallel_degree: int = knob(1, ge=1, help="Number of data-parallel replicas.")
    _kv_cache_config: KVCacheConfig = field(default_factory=KVCacheConfig)
    _resolved: bool = False
    source_encoding: Optional[SupportedEncoding] = field(default=None, repr=False)
    """Set by ``resolve()`` when the weights are converted on load: the encoding in the files
    (``quantization_encoding`` is then what the model runs)."""

    def __post_init__(self) -> None:
        if isinstance(self.device_specs, (str, DeviceSpec)) or (
            isinstance(self.device_specs, (list, tuple)) and any(isinstance(d, str) for d in self.device_specs)
        ):
            self.device_specs = parse_device_specs(self.device_specs)
        super().__post_init__()
        if isinstance(self.weight_path, (str, Path)):
            self.weight_path = [Path(self.weight_path)]

    @property
    def kv_cache_config(self) -> KVCacheConfig:
        return self._kv_cache_config

    # -- resolution
    def resolve(self) -> None:
        """Locate the model, its weights and encoding; raise ValueError/FileNotFoundError
        with what is wrong and what was found."""
        if self.force_download:
            raise ValueError("force_download=True needs network access; libremax works offline only")
        self._locate_model_path()
        repo = self.huggingface_weight_repo
        available = self._available_encodings(repo)
        chosen, source = self._choose_encoding(repo, available)
        self.quantization_encoding = chosen
        self.source_encoding = source
        if not self.weight_path:
            self.weight_path = self._default_weight_files(repo, chosen, source, available)
        self._resolved = True

    def _locate_model_path(self) -> None:
        """``model_path`` as an absolute folder or GGUF file, or a repo id (HuggingFaceRepo checks the cache)."""
        mp = os.path.expanduser(self.model_path) if self.model_path else ""
        if not mp:
            if len(self.weight_path) == 1 and is_gguf_file(self.weight_path[0]):
                mp = str(self.weight_path[0])
            else:
                raise ValueError("model_path is required (a model folder, a GGUF file, or a cached repo id)")
        if os.path.isfile(mp):
            if not is_gguf_file(mp):
                raise ValueError(
                    f"model_path {mp!r} is a file but not a GGUF file; pass a model folder (config.json + weights) "
                    "or a .gguf file")
            self.model_path = os.path.abspath(mp)
            if not self.weight_path:
                self.weight_path = [Path(self.model_path)]
        elif os.path.isdir(mp):
            self.model_path = os.path.abspath(mp)
        elif mp.endswith(".gguf") or mp.startswith(("/", ".", "~")) or mp.count("/") != 1:
            # Not an 'org/model' repo id: a path that does not exist.
            raise FileNotFoundError(f"model_path {mp!r} does not exist")
        else:
            self.model_path = mp  # a repo id; HuggingFaceRepo validates it is in the local cache

    def _available_encodings(self, repo: HuggingFaceRepo) -> list:
        """The encodings of the given ``weight_path`` files (made absolute here), else of the repo's weights."""
        base = repo.local_path
        if self.weight_path:
            paths = []
            for w in self.weight_path:
                p = Path(w).expanduser()
                if not p.is_absolute():
                    p = base / p
                if not p.is_file():
                    raise FileNotFoundError(f"weight file {str(w)!r} not found (looked at {p})")
                paths.append(p.resolve())
            self.weight_path = paths
            fmts = {_format_of(p) for p in paths}
            if len(fmts) > 1:
                raise ValueError(f"weight files mix formats {sorted(f.value for f in fmts)}: {[str(p) for p in paths]}")
            available = list(dict.fromkeys(repo.encoding_for_file(p) for p in paths))
        else:
            if repo.single_file is None and not (base / "config.json").is_file():
                raise FileNotFoundError(
                    f"{base}: not a model folder: no config.json found (expected config.json and weights such as "
                    "model.safetensors, or pass a .gguf file)")
            if not repo.weight_files:
                raise FileNotFoundError(
                    f"{base}: no weight files found (*.safetensors, *.bin/*.pt/*.pth or *.gguf); "
                    f"files present: {sorted(os.listdir(base))[:20]}")
            available = repo.supported_encodings
        if not available:
            raise ValueError(f"{base}: could not determine the encoding of the weights")
        return available

    def _choose_encoding(self, repo: HuggingFaceRepo, available: list) -> tuple[Any, Any]:
        """``(encoding the model runs, encoding in the files when it is converted on load, else None)``."""
        requested = self.quantization_encoding
        if requested is None:
            return available[0], None
        if requested in available:
            return requested, None
        if (self.allow_safetensors_weights_fp32_bf6_bidirectional_cast and requested in _FLOAT_ENCODINGS
                and any(a in _FLOAT_ENCODINGS for a in available)
                and WeightsFormat.gguf not in {_format_of(Path(f)) for f in self._candidate_files(repo)}):
            return requested, None
        source = load_conversion_source(requested, available)
        if source is not None:
            return requested, source  # dequantised or quantised once at load (see load_conversion_source)
        hint = ""
        if requested in _FLOAT_ENCODINGS and any(a in _FLOAT_ENCODINGS for a in available):
            hint = " (set allow_safetensors_weights_fp32_bf6_bidirectional_cast=True to cast float32<->bfloat16)"
        also = load_conversion_targets(available)
        if also:
            hint += f"; they can also be converted on load to: {[a.value for a in also]}"
        raise ValueError(
            f"quantization_encoding {requested.value!r} is not contained in the weights of {self.model_path!r}; "
            f"they contain: {[a.value for a in available]}{hint}")

    @staticmethod
    def _default_weight_files(repo: HuggingFaceRepo, chosen: Any, source: Any, available: list) -> list[Path]:
        """The repo's files of ``chosen`` (or of ``source`` / the float files cast from): safetensors first,
        then GGUF (the first of several variants), then PyTorch."""
        by_fmt = repo.files_for_encoding(chosen)
        if not by_fmt and source is not None:
            by_fmt = repo.files_for_encoding(source)
        if not by_fmt and chosen in _FLOAT_ENCODINGS:  # cast case
            src = next(a for a in available if a in _FLOAT_ENCODINGS)
            by_fmt = repo.files_for_encoding(src)
        for fmt in (WeightsFormat.safetensors, WeightsFormat.gguf, WeightsFormat.pytorch):
            if fmt in by_fmt:
                files = by_fmt[fmt]
                if fmt is WeightsFormat.gguf and len(files) > 1:
                    files = files[:1]  # several GGUF variants of one encoding: the first, deterministically
                return [Path(p) for p in files]
        return []

    @staticmethod
    def _candidate_files(repo: HuggingFaceRepo) -> list[str]:
        return [f for files in repo.weight_files.values() for f in files]

    # -- derived
    @cached_property
    def huggingface_model_repo(self) -> HuggingFaceRepo:
        return HuggingFaceRepo(self.model_path, revision=self.huggingface_model_revision,
                               trust_remote_code=self.trust_remote_code)

    @cached_property
    def huggingface_weight_repo(self) -> HuggingFaceRepo:
        return HuggingFaceRepo(self.model_path, revision=self.huggingface_weight_revision,
                               trust_remote_code=self.trust_remote_code)

    @property
    def model_dir(self) -> Path:
        """The folder that holds the model's files."""
        return self.huggingface_model_repo.local_path

    @property
    def weights_format(self) -> WeightsFormat:
        if not self.weight_path:
            raise ValueError("no weight files resolved")
        return _format_of(Path(self.weight_path[0]))

    @property
    def gguf_file(self) -> Optional[Path]:
        """The GGUF weights file, if the weights are GGUF."""
        if self.weight_path and _format_of(Path(self.weight_path[0])) is WeightsFormat.gguf:
            return Path(self.weight_path[0])
        return None

    @cached_property
    def gguf_metadata(self) -> Optional[GGUFMetadata]:
        f = self.gguf_file
        return read_gguf_metadata(f) if f is not None else None

    @cached_property
    def huggingface_config(self) -> Any:
        """The ``transformers`` config: ``config.json`` of the model folder, or one built
        from the GGUF metadata when the folder has no ``config.json``."""
        repo = self.huggingface_model_repo
        if repo.single_file is None and (repo.local_path / "config.json").is_file():
            return load_huggingface_config(repo.local_path, trust_remote_code=self.trust_remote_code)
        if self.gguf_file is not None:
            return load_huggingface_config(self.gguf_file, trust_remote_code=self.trust_remote_code)
        raise FileNotFoundError(f"{repo.local_path}: no config.json and no GGUF weights to read a config from")

    @cached_property
    def generation_config(self) -> Any:
        if self.huggingface_model_repo.single_file is not None:
            return None
        return load_generation_config(self.model_dir)

    @property
    def architectures(self) -> list[str]:
        """Model class names (``config.json`` ``architectures``; GGUF architectures mapped)."""
        names = list(getattr(self.huggingface_config, "architectures", None) or [])
        if not names:  # a config saved without them: the model_type's causal-LM (else base) class
            names = model_type_classes(getattr(self.huggingface_config, "model_type", None))[:1]
        return names

    @property
    def rope_parameters(self) -> dict[str, Any]:
        """RoPE parameters from ``rope_theta``/``rope_scaling`` or ``rope_parameters``."""
        return get_rope_parameters(_text_config(self.huggingface_config))

    @property
    def rope_theta(self) -> float:
        return self.rope_parameters["rope_theta"]

    @property
    def max_position_embeddings(self) -> Optional[int]:
        return getattr(_text_config(self.huggingface_config), "max_position_embeddings", None)

    @property
    def graph_quantization_encoding(self) -> Any:
        return self.quantization_encoding.quantization_encoding if self.quantization_encoding else None

    @property
    def default_device_spec(self) -> DeviceSpec:
        return self.device_specs[0]

    def weights_size(self) -> int:
        """Total size in bytes of the weight files."""
        return sum(os.path.getsize(p) for p in self.weight_path)


def _text_config(cfg: Any) -> Any:
    return getattr(cfg, "text_config", None) or cfg


def _format_of(p: Path) -> WeightsFormat:
    s = p.name.lower()
    if s.endswith(".gguf"):
        return WeightsFormat.gguf
    if s.endswith(".safetensors"):
        return WeightsFormat.safetensors
    if s.endswith((".bin", ".pt", ".pth")):
        return WeightsFormat.pytorch
    raise ValueError(f"{p}: unknown weights format (expected .safetensors, .gguf, .bin/.pt/.pth)")


# --------------------------------------------------------------------------- pipeline config


MAX_BATCH_SIZE_DEFAULTS: dict[str, int] = {
    "text_generation": 16,
    "embeddings_generation": 64,
    "audio_generation": 8,
    "speech_token_generation": 8,
    "transcription": 8,
}
"""``max_batch_size`` when it is unset, by workload (``PipelineTask`` values, and ``transcription`` for
speech recognition): the one place these numbers live.  A decoder serves 16 requests per step; an
embedding model encodes 64 rows per batch (no KV cache, rows are cheap); speech models (Whisper windows,
CSM audio frames) 8.  :meth:`PipelineConfig.batch_size_for` reads it; both the KV cache's slots and the
scheduler's batch limit come from that one call."""


def batch_size_for(max_batch_size: Optional[int], task: Any) -> int:
    """``max_batch_size`` (a ``PipelineConfig.max_batch_size`` value), or the ``task`` workload's entry of
    :data:`MAX_BATCH_SIZE_DEFAULTS` when it is None (``task``: a ``PipelineTask``, its value, or
    ``"transcription"``)."""
    if max_batch_size is not None:
        return int(max_batch_size)
    key = str(getattr(task, "value", task))
    if key not in MAX_BATCH_SIZE_DEFAULTS:
        raise ValueError(f"no max_batch_size default for workload {key!r}; known: {sorted(MAX_BATCH_SIZE_DEFAULTS)}")
    return MAX_BATCH_SIZE_DEFAULTS[key]


@dataclass(frozen=True)
class _PipelineFields(_ConfigBase):
    ce_delay_ms: float = knob(0.0, help="Scheduler sleep before a prefill batch (TTS only, experimental).")
    chat_template: Optional[Path] = knob(
        None, help="A Jinja chat template file to use instead of the model's own (chat prompts, "
                   "/v1/chat/completions, /v1/tokenize with messages).",
        flag=Flag(path={"exists": True, "dir_okay": False}))
    custom_architectures: list[str] = knob(default_factory=list, help="Modules ('module' or 'path:module') "
                                                                      "exposing ARCHITECTURES to register.")
    enable_chunked_prefill: bool = knob(True, help="Split context encoding into chunks of prefill_chunk_size "
                                                   "tokens.")
    enable_echo: bool = knob(False, help="Compute prompt log probabilities (echo with logprobs, prompt_logprobs); "
                                         "the model then returns the logits of every prompt position.",
                             flag=Flag(is_flag=True, default=False))
    enable_in_flight_batching: bool = knob(False, help="Batch token generation together with context encoding.")
    enable_prioritize_first_decode: bool = knob(False, help="Run a decode batch right after each prefill batch "
                                                            "(TTS only).")
    hf_fallback: bool = knob(
        True, help="Run a causal LM whose architecture libremax has no native implementation of through Hugging "
                   "Face transformers (with a warning); --no-fallback makes it an error.",
        flag=Flag(decls=("--fallback/--no-fallback", "hf_fallback"), default=True, show_default=True))
    max_batch_size: Optional[int] = knob(
        None, ge=1, help=f"Max requests batched per step (default {MAX_BATCH_SIZE_DEFAULTS['text_generation']}).",
        flag=Flag())
    """None: the workload's entry of :data:`MAX_BATCH_SIZE_DEFAULTS` (:meth:`PipelineConfig.batch_size_for`)."""
    max_ce_batch_size: int = knob(192, ge=1, help="Maximum context-encoding batch size (capped by max_batch_size).")
    max_length: Optional[int] = knob(
        None, ge=1, aliases=("max_seq_len",),
        help="Max tokens per sequence, prompt + output (default: the model's context length).", flag=Flag())
    max_num_steps: int = knob(-1, help="Steps per multi-step decode (-1: platform default).")
    max_queue_size_tg: Optional[int] = knob(None, ge=1, help="Maximum requests in the decode queue (default: "
                                                             "max_batch_size).")
    min_batch_size_tg: Optional[int] = knob(None, ge=1, help="Soft floor of the decode batch size (TTS only).")
    num_threads: Optional[int] = knob(
        None, ge=1, help="CPU threads of the one pool torch and libremax's kernels share (default: "
                         "LIBREMAX_NUM_THREADS, else the physical cores).", flag=Flag())
    pdl_level: str = knob("0", help="Programmatic dependent launch level.")
    pipeline_role: PipelineRole = knob(PipelineRole.PrefillAndDecode,
                                       help="prefill_and_decode, prefill_only or decode_only.")
    pool_embeddings: bool = knob(True, help="Pool embedding outputs.")
    prefill_chunk_size: int = knob(8192, ge=1, help="Prompt tokens processed per step.", flag=Flag())
    use_experimental_kernels: str = knob("false", help="Use experimental kernels ('true'/'false').")
    draft_model_path: Optional[str] = knob(
        None, help="Speculative decoding: a small draft model with the same vocabulary.", flag=Flag())
    num_speculative_tokens: int = knob(3, help="Draft tokens proposed per step (default {default}).", flag=Flag())
    speculative_method: Optional[str] = knob(
        None, choices=("draft_model", "ngram", "mtp"),
        help="Speculative decoding's draft: draft_model (--draft-model-path), ngram (prompt lookup: the tokens that "
             "followed an earlier occurrence of the last tokens; no draft model) or mtp (the model's multi-token "
             "prediction layer: DeepSeek-V3).", flag=Flag())
    prompt_lookup_max: Optional[int] = knob(
        None, ge=1, help="ngram draft: longest suffix looked up, in tokens (default 5, or --prompt-lookup-min).",
        flag=Flag())
    prompt_lookup_min: Optional[int] = knob(
        None, ge=1, help="ngram draft: shortest suffix looked up, in tokens (default 5, or --prompt-lookup-max).",
        flag=Flag())
    allow_image_urls: bool = knob(
        False, help="Vision-language models: fetch http(s) image URLs (off: only data: URIs and local paths; a URL "
                    "is refused with a clear error).  Fetches use a 10 s timeout and a 32 MiB limit.",
        flag=Flag(is_flag=True, default=False))


_PIPELINE_FIELD_NAMES = _public_fields(_PipelineFields)
_NESTED = {
    "model_config": MAXModelConfig,
    "kv_cache_config": KVCacheConfig,
    "sampling_config": SamplingConfig,
    "profiling_config": ProfilingConfig,
    "lora_config": LoRAConfig,
}
_PER_REQUEST = ("max_new_tokens",)
"""Keywords that are per-request settings (``SamplingParams``), refused with a pointer there."""


def _kwarg_aliases() -> dict[str, str]:
    """``{alias: knob}`` from the knobs' declarations (``devices`` -> ``device_specs``, ...)."""
    out: dict[str, str] = {}
    for cls in (_PipelineFields, *_NESTED.values()):
        for name, (_, spec) in knobs_of(cls).items():
            out.update({a: name for a in spec.aliases})
    return out


_KWARG_ALIASES = _kwarg_aliases()


def find_knob(name: str) -> tuple[type, Any, Any]:
    """``(record class, dataclasses.Field, KnobSpec)`` of the knob ``name`` of ``PipelineConfig`` or one of its
    nested records (KeyError when there is none)."""
    for cls in (_PipelineFields, *_NESTED.values()):
        found = knobs_of(cls).get(name)
        if found is not None:
            return (cls, *found)
    raise KeyError(f"PipelineConfig has no option {name!r}")


class PipelineConfig(_PipelineFields):
    """Configuration for a pipeline; ``PipelineConfig(**kwargs)``.

    Own fields (the reference's): ``ce_delay_ms``, ``chat_template``,
    ``custom_architectures``, ``enable_chunked_prefill``, ``enable_echo``,
    ``enable_in_flight_batching``, ``enable_prioritize_first_decode``,
    ``max_batch_size``, ``max_ce_batch_size``, ``max_length``, ``max_num_steps``,
    ``max_queue_size_tg``, ``min_batch_size_tg``, ``pdl_level``, ``pipeline_role``,
    ``pool_embeddings``, ``prefill_chunk_size``, ``use_experimental_kernels``; libremax's
    ``hf_fallback`` (default True): a causal LM whose architecture has no native folder runs through
    transformers (one warning); False makes that the "unsupported architecture" error.
    Nested: ``model_config`` (:class:`MAXModelConfig`), ``kv_cache_config``,
    ``sampling_config``, ``profiling_config``, ``lora_config``; their fields may be
    passed flat (``model_path=..., quantization_encoding="q4_k", kv_cache_page_size=64,
    devices="cpu"``).  Aliases (declared on the knobs): ``devices`` for ``device_specs``, ``max_seq_len``
    for ``max_length``, ``weight_paths`` for ``weight_path``, ``encoding`` for ``quantization_encoding``,
    ``revision`` for ``huggingface_model_revision``, ``page_size`` for ``kv_cache_page_size``, and
    ``cache_dtype`` / ``kv_cache_format`` (MAX's names) for ``kv_cache_dtype`` (a DType or a name).
    """

    def __init__(self, **kwargs: Any) -> None:
        own: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {k: {} for k in _NESTED}
        given: dict[str, Any] = {}
        for raw_key, value in kwargs.items():
            key = raw_key.replace("-", "_")
            if key in _PER_REQUEST:
                raise ValueError(f"PipelineConfig: {raw_key!r} is a per-request setting (SamplingParams), "
                                 "not a pipeline option")
            key = _KWARG_ALIASES.get(key, key)
            if key in _NESTED:
                if not isinstance(value, _NESTED[key]):
                    raise TypeError(f"PipelineConfig: {key} must be a {_NESTED[key].__name__}, got "
                                    f"{type(value).__name__}")
                given[key] = value
                continue
            if key in _PIPELINE_FIELD_NAMES:
                own[key] = value
                continue
            for nk, ncls in _NESTED.items():
                if key in _public_fields(ncls):
                    nested[nk][key] = value
                    break
            else:
                raise ValueError(
                    f"PipelineConfig: unknown option {raw_key!r}. Valid options: {sorted(self.help())}")
        _PipelineFields.__init__(self, **own)
        kv = given.get("kv_cache_config") or KVCacheConfig(**nested["kv_cache_config"])
        if "model_config" in given:
            mc = given["model_config"]
            for k, v in nested["model_config"].items():
                setattr(mc, k, v)
            mc.__post_init__()
        else:
            mc = MAXModelConfig(**nested["model_config"])
        mc._kv_cache_config = kv
        _set = object.__setattr__  # the pipeline's own fields are a frozen record; these are its parts
        _set(self, "_model_config", mc)
        _set(self, "_sampling_config", given.get("sampling_config") or SamplingConfig(**nested["sampling_config"]))
        _set(self, "_profiling_config", given.get("profiling_config") or ProfilingConfig(**nested["profiling_config"]))
        _set(self, "_lora_config", given.get("lora_config") or LoRAConfig(**nested["lora_config"]))
        object.__setattr__(self, "_draft_model_config", None)
        self._check_speculative()
        object.__setattr__(self, "_chat_template_str", None)
        self.resolve()

    def _check_speculative(self) -> None:
        """Speculative decoding's options agree with each other; the draft model's config (draft_model)."""
        method = self.speculative_method  # one of its knob's choices (checked when the fields were set)
        if method == "draft_model" and not self.draft_model_path:
            raise ValueError("PipelineConfig: speculative_method 'draft_model' needs draft_model_path")
        if method in ("ngram", "mtp"):
            if self.draft_model_path:
                raise ValueError(f"PipelineConfig: speculative_method {method!r} needs no draft model; leave "
                                 "draft_model_path unset")
            if int(self.num_speculative_tokens) < 1:
                raise ValueError(f"PipelineConfig: num_speculative_tokens must be >= 1, got "
                                 f"{self.num_speculative_tokens}")
        if method == "ngram":
            from max.pipelines.lib.ngram_draft import prompt_lookup_bounds

            prompt_lookup_bounds(self.prompt_lookup_min, self.prompt_lookup_max)  # a clear error now
        if self.draft_model_path:
            if int(self.num_speculative_tokens) < 1:
                raise ValueError(f"PipelineConfig: num_speculative_tokens must be >= 1, got "
                                 f"{self.num_speculative_tokens}")
            object.__setattr__(self, "_draft_model_config", MAXModelConfig(
                model_path=str(self.draft_model_path), device_specs=self._model_config.device_specs))

    # -- nested configs
    @property
    def model_config(self) -> MAXModelConfig:
        return self._model_config

    @property
    def draft_model_config(self) -> Optional[MAXModelConfig]:
        return self._draft_model_config

    @property
    def sampling_config(self) -> SamplingConfig:
        return self._sampling_config

    @property
    def profiling_config(self) -> ProfilingConfig:
        return self._profiling_config

    @property
    def lora_config(self) -> Optional[LoRAConfig]:
        return self._lora_config if self._lora_config.enable_lora else None

    @property
    def kv_cache_config(self) -> KVCacheConfig:
        return self._model_config.kv_cache_config

    @property
    def graph_quantization_encoding(self) -> Any:
        """The CLI encoding as a ``max.graph.quantization.QuantizationEncoding`` (None for floats)."""
        return self._model_config.graph_quantization_encoding

    def __getattr__(self, name: str) -> Any:
        # Flat read access to nested fields (``config.model_path``, ``config.kv_cache_page_size``).
        if name.startswith("_"):
            raise AttributeError(name)
        for attr in ("_model_config", "_sampling_config", "_profiling_config", "_lora_config"):
            obj = self.__dict__.get(attr)
            if obj is not None and name in _public_fields(type(obj)):
                return getattr(obj, name)
        kv = self.__dict__.get("_model_config")
        if kv is not None and name in _public_fields(KVCacheConfig):
            return getattr(kv.kv_cache_config, name)
        raise AttributeError(f"'PipelineConfig' object has no attribute {name!r}")

    # -- resolution
    def resolve(self) -> None:
        """Validate every field and resolve the model (paths, weights, encoding, chat template)."""
        check_knobs(self, "PipelineConfig: ")
        if self.max_num_steps == 0 or self.max_num_steps < -1:
            raise ValueError(f"PipelineConfig: max_num_steps must be -1 or >= 1, got {self.max_num_steps}")
        if self.enable_echo and self.enable_chunked_prefill:
            # Echo needs the logits of every prompt token in one pass.
            logger.info("enable_echo: chunked prefill still allowed; echo log-probs are computed per chunk")
        self.custom_architecture_modules()  # a bad module is an error now; the registry registers them
        self._model_config.resolve()
        mpe = self._model_config.max_position_embeddings
        if self.max_length is not None and mpe is not None and self.max_length > mpe:
            raise ValueError(
                f"PipelineConfig: max_length ({self.max_length}) exceeds the model's max_position_embeddings ({mpe})")
        if self.chat_template is not None:
            p = Path(self.chat_template)
            if not p.is_file():
                raise FileNotFoundError(f"chat_template file not found: {p}")
            object.__setattr__(self, "_chat_template_str", p.read_text(encoding="utf-8"))

    def custom_architecture_modules(self) -> list[Any]:
        """The modules ``custom_architectures`` names (imported; ValueError for one without an ``ARCHITECTURES``
        list).  ``PipelineRegistry.resolve`` registers their architectures; the config never touches the
        registry."""
        mods = []
        for spec in self.custom_architectures:
            if ":" in spec:
                path, module = spec.rsplit(":", 1)
                if path not in sys.path:
                    sys.path.insert(0, path)
            else:
                module = spec
            mod = importlib.import_module(module)
            if getattr(mod, "ARCHITECTURES", None) is None:
                raise ValueError(f"custom architecture module {module!r} has no ARCHITECTURES list")
            mods.append(mod)
        return mods

    def retrieve_chat_template(self) -> Optional[str]:
        """The custom chat template read from ``chat_template`` (None when not set)."""
        return self._chat_template_str

    def batch_size_for(self, task: Any) -> int:
        """The batch limit of a ``task`` workload (a ``PipelineTask`` or its value, or ``"transcription"``):
        ``max_batch_size``, or that workload's entry of :data:`MAX_BATCH_SIZE_DEFAULTS` when it is unset.
        The KV cache's slots and the scheduler's limit both come from this call."""
        return batch_size_for(self.max_batch_size, task)

    @property
    def resolved_max_length(self) -> int:
        """``max_length``, or the model's ``max_position_embeddings`` when unset."""
        if self.max_length is not None:
            return self.max_length
        mpe = self._model_config.max_position_embeddings
        if mpe is None:
            raise ValueError("max_length is not set and the model config has no max_position_embeddings")
        return int(mpe)

    @staticmethod
    def help() -> dict[str, str]:
        """Every option PipelineConfig accepts and its description."""
        out = _PipelineFields.help()
        for ncls in _NESTED.values():
            out.update(ncls.help())
        return out

    def log_basic_config(self) -> None:
        mc = self._model_config
        logger.info(
            "Pipeline: model=%s weights=%s encoding=%s devices=%s max_batch_size=%s max_length=%s "
            "kv_page_size=%d device_memory_utilization=%.2f",
            mc.model_path, [str(p) for p in mc.weight_path],
            mc.quantization_encoding.value if mc.quantization_encoding else None,
            [f"{d.device_type}:{d.id}" for d in mc.device_specs], self.max_batch_size, self.max_length,
            self.kv_cache_config.kv_cache_page_size, self.kv_cache_config.device_memory_utilization)

    def log_pipeline_info(self) -> None:
        """Log the basic config and the checkpoint's architecture (``PipelineRegistry.resolve`` tells which
        registered architecture, and task, runs it)."""
        self.log_basic_config()
        logger.info("Architecture: %s cache_strategy=%s prefill_chunk_size=%d",
                    ", ".join(self._model_config.architectures) or "unknown",
                    self.kv_cache_config.cache_strategy.value, self.prefill_chunk_size)

    def __repr__(self) -> str:
        own = ", ".join(f"{k}={getattr(self, k)!r}" for k in _PIPELINE_FIELD_NAMES)
        return f"PipelineConfig({own}, model_config={self._model_config!r})"


@dataclass
class AudioGenerationConfig(_ConfigBase):
    """Text-to-speech settings (the audio decoder); other keywords go to ``PipelineConfig``
    (available as ``pipeline_config``)."""

    audio_decoder: str = knob("", help="The name of the audio decoder model architecture.")
    audio_decoder_weights: str = knob("", help="The path to the audio decoder weights file.")
    chunk_size: Optional[list[int]] = knob(None, help="Chunk sizes for streaming.")
    buffer: int = knob(0, ge=0, help="Previous speech tokens passed to the audio decoder each step.")
    block_causal: bool = knob(False, help="Whether prior buffered tokens attend to the current block.")
    prepend_prompt_speech_tokens: PrependPromptSpeechTokens = knob(PrependPromptSpeechTokens.NEVER,
                                                                   help="never, once or rolling.")
    prepend_prompt_speech_tokens_causal: bool = knob(False, help="Whether prompt speech tokens attend to the "
                                                                 "current block.")
    run_model_test_mode: bool = knob(False, help="Run the audio decoder in test mode.")
    prometheus_metrics_mode: PrometheusMetricsMode = knob(
        PrometheusMetricsMode.INSTRUMENT_ONLY, help="instrument_only, launch_server or launch_multiproc_server.")
    audio_decoder_config: dict[str, Any] = field(default_factory=dict)

    def __init__(self, audio_decoder: str, **kwargs: Any) -> None:
        """``audio_decoder`` and this record's other knobs by keyword; every other keyword goes to
        ``PipelineConfig`` (``pipeline_config``, None when there are none)."""
        self.audio_decoder = audio_decoder
        own = set(knobs_of(type(self))) - {"audio_decoder"}
        for name in own:
            setattr(self, name, kwargs.pop(name) if name in kwargs else default_of(type(self), name))
        self.audio_decoder_config = {}
        if isinstance(self.chunk_size, int):
            self.chunk_size = [self.chunk_size]
        self._coerce_fields()
        check_knobs(self)
        self.pipeline_config = PipelineConfig(**kwargs) if kwargs else None

    @classmethod
    def from_flags(cls, audio_flags: dict[str, str], **config_flags: Any) -> "AudioGenerationConfig":
        flags = dict(audio_flags)
        decoder = flags.pop("audio_decoder", "")
        if not decoder:
            raise ValueError("audio_decoder is required")
        chunk = flags.pop("chunk_size", None)
        if isinstance(chunk, str):
            chunk = [int(x) for x in chunk.split(",") if x.strip()]
        known = {f for f in _public_fields(cls)} - {"audio_decoder", "chunk_size"}
        audio_kw = {k: v for k, v in flags.items() if k in known}
        extra = {k: v for k, v in flags.items() if k not in known}
        cfg = cls(decoder, chunk_size=chunk, **audio_kw, **config_flags)
        cfg.audio_decoder_config = extra
        return cfg
