"""Hugging Face repositories, offline.

Everything here works without network access: a "repo" is either a local folder (or a
single GGUF file) or a repo id already present in the local Hugging Face cache
(``$HF_HUB_CACHE``, by default ``~/.cache/huggingface/hub``).  Nothing is downloaded;
a repo that is neither local nor cached raises a clear error saying so.

Besides the reference's names (``HuggingFaceRepo``, ``generate_local_model_path``,
``validate_hf_repo_access``, ``try_to_load_from_cache``, ``download_weight_files``),
this module has the helpers the pipeline needs: ``load_huggingface_config`` (HF
folders and GGUF files; a GGUF file of a native architecture gives a :class:`PlainConfig`, without
importing transformers), ``load_generation_config``, ``get_rope_theta`` /
``get_rope_parameters`` (reads transformers-4 ``rope_theta`` and transformers-5
``rope_parameters``), and ``safetensors_dtypes``.
"""

from __future__ import annotations

import copy
import enum
import json
import os
import struct
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional

from max.graph.quantization import formats
from max.graph.weights import WeightsFormat
from max.pipelines.lib.gguf_utils import GGUFMetadata, is_gguf_file, read_gguf_metadata

# --------------------------------------------------------------------------- cache


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache folder (honours ``HF_HUB_CACHE`` / ``HF_HOME``)."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(env).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def _repo_cache_dir(repo_id: str, repo_type: str = "model") -> Path:
    return hf_hub_cache() / f"{repo_type}s--{repo_id.replace('/', '--')}"


def generate_local_model_path(repo_id: str, revision: str) -> str:
    """The snapshot folder of ``repo_id`` at ``revision`` in the local HF cache:
    ``~/.cache/huggingface/hub/models--{org}--{model}/snapshots/{revision}``.

    ``revision`` may be a commit hash or a branch/tag name recorded under ``refs/``.
    Raises FileNotFoundError if that snapshot is not in the cache.
    """
    if os.path.isdir(repo_id):
        return os.path.abspath(repo_id)
    base = _repo_cache_dir(repo_id)
    rev = revision or "main"
    ref = base / "refs" / rev
    if ref.is_file():
        rev = ref.read_text().strip()
    path = base / "snapshots" / rev
    if not path.is_dir():
        raise FileNotFoundError(
            f"Model path does not exist locally: {path} (repo {repo_id!r}, revision {revision!r} is not in the "
            f"Hugging Face cache {hf_hub_cache()}; libremax does not download models)"
        )
    return str(path)


def _cached_revisions(repo_id: str) -> list[str]:
    snaps = _repo_cache_dir(repo_id) / "snapshots"
    return sorted(p.name for p in snaps.iterdir()) if snaps.is_dir() else []


def validate_hf_repo_access(repo_id: str, revision: str) -> None:
    """Raise ValueError with a readable message unless ``repo_id`` can be used offline:
    an existing local path, or a repo whose ``revision`` is in the local HF cache."""
    if not isinstance(repo_id, str) or not repo_id:
        raise ValueError(f"Invalid model repository {repo_id!r}: expected a local path or an 'org/model' repo id")
    if os.path.exists(repo_id):
        return
    if repo_id.endswith(".gguf") or repo_id.startswith(("/", "./", "../", "~")):
        raise ValueError(f"Model path {repo_id!r} does not exist")
    try:
        generate_local_model_path(repo_id, revision)
    except FileNotFoundError:
        have = _cached_revisions(repo_id)
        hint = f" Cached revisions: {have}." if have else ""
        raise ValueError(
            f"Repository {repo_id!r} (revision {revision!r}) is not available offline: it is neither a local "
            f"path nor in the Hugging Face cache ({hf_hub_cache()}).{hint} Pass the path of a local model folder "
            "or GGUF file, or populate the cache (e.g. `huggingface-cli download`) on a machine with network access."
        ) from None


def try_to_load_from_cache(repo_id: str, filename: str, revision: str) -> str | Any | None:
    """Local path of ``filename`` in ``repo_id`` (local folder or HF cache), or None.

    The repo itself must be accessible (``validate_hf_repo_access``), else ValueError.
    """
    validate_hf_repo_access(repo_id, revision)
    if os.path.isdir(repo_id):
        p = os.path.join(repo_id, filename)
        return p if os.path.isfile(p) else None
    root = generate_local_model_path(repo_id, revision)
    p = os.path.join(root, filename)
    return p if os.path.isfile(p) else None


def download_weight_files(
    huggingface_model_id: str,
    filenames: list[str],
    revision: Optional[str] = None,
    force_download: bool = False,
    max_workers: int = 8,
) -> list[Path]:
    """Local paths of ``filenames`` (relative to the repo root).

    Offline: files are taken from a local folder or the HF cache.  A missing file, or
    ``force_download=True``, raises FileNotFoundError / ValueError (nothing is fetched).
    """
    if force_download:
        raise ValueError("download_weight_files: force_download=True needs network access, which libremax never uses")
    out = []
    for name in filenames:
        if os.path.isabs(name) and os.path.isfile(name):
            out.append(Path(name))
            continue
        p = try_to_load_from_cache(huggingface_model_id, name, revision or "main")
        if p is None:
            raise FileNotFoundError(
                f"Weight file {name!r} of {huggingface_model_id!r} is not available locally (no download offline)"
            )
        out.append(Path(p))
    return out


# --------------------------------------------------------------------------- encodings


class _Encoding(str, enum.Enum):
    """Weight encodings a pipeline can run (CLI ``--quantization-encoding``).

    The reference names ``float32``, ``bfloat16``, ``q4_k``, ``q4_0``, ``q6_k``,
    ``float8_e4m3fn`` and ``gptq``; ``float16``, ``q4_1``, ``q5_0``, ``q5_1``, ``q5_k``,
    ``q8_0``, ``q2_k`` and ``q3_k`` are libremax extensions matching the GGML block kinds
    ``max.graph`` supports.  The members are the user names of the format table
    (:data:`max.graph.quantization.formats.FORMATS`), in its order.
    """

    @classmethod
    def parse(cls, value: "str | SupportedEncoding") -> "SupportedEncoding":
        """From an enum, a value (``"q4_k"``) or a spelling like ``"Q4_K"`` / ``"bf16"`` / ``"fp32"``."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, str):
            raise TypeError(f"quantization encoding must be a str, got {type(value).__name__}")
        v = value.strip().lower().replace("-", "_")
        v = _ALIASES.get(v, v)
        try:
            return cls(v)
        except ValueError:
            raise ValueError(
                f"Unknown quantization encoding {value!r}; expected one of {[e.value for e in cls]}"
            ) from None

    @property
    def is_quantized(self) -> bool:
        return not formats.by_name(self.value).is_float

    @property
    def is_gguf(self) -> bool:
        """Whether weights in this encoding come from GGUF files (GGML block formats)."""
        return self.is_quantized and self is not SupportedEncoding.gptq

    @property
    def dtype(self) -> Any:
        """The ``max.dtype.DType`` of the weights (``uint8`` for GGML blocks)."""
        from max.dtype import DType

        return {
            SupportedEncoding.float32: DType.float32,
            SupportedEncoding.bfloat16: DType.bfloat16,
            SupportedEncoding.float16: DType.float16,
            SupportedEncoding.float8_e4m3fn: DType.float8_e4m3fn,
        }.get(self, DType.uint8)

    @property
    def cache_dtype(self) -> Any:
        """The KV cache dtype used with this encoding (float32 for GGML blocks, as in MAX)."""
        from max.dtype import DType

        if self in (SupportedEncoding.bfloat16, SupportedEncoding.float8_e4m3fn, SupportedEncoding.gptq):
            return DType.bfloat16
        if self is SupportedEncoding.float16:
            return DType.float16
        return DType.float32

    @property
    def quantization_encoding(self) -> Any:
        """The ``max.graph.quantization.QuantizationEncoding`` (None for float encodings)."""
        from max.graph.quantization import QuantizationEncoding

        if not self.is_quantized:
            return None
        return QuantizationEncoding[self.value.upper()]

    @property
    def ggml_type(self) -> Optional[str]:
        """The GGML tensor type name (``"Q4_K"``, ``"F32"``, ...) this encoding is stored as."""
        return _ENC_TO_GGML.get(self)



SupportedEncoding = _Encoding(  # type: ignore[call-overload]
    "SupportedEncoding", [(n, n) for n in formats.encoding_names()], module=__name__, qualname="SupportedEncoding")
SupportedEncoding.__doc__ = _Encoding.__doc__

_ALIASES = {
    "fp32": "float32", "f32": "float32", "bf16": "bfloat16", "fp16": "float16", "f16": "float16", "half": "float16",
    "fp8": "float8_e4m3fn", "float8": "float8_e4m3fn",
    "q4_k_m": "q4_k", "q4_k_s": "q4_k", "q5_k_m": "q5_k", "q5_k_s": "q5_k", "q3_k_s": "q3_k", "q3_k_m": "q3_k",
    "q3_k_l": "q3_k",
}
_ENC_TO_GGML = {SupportedEncoding(f.user_name): f.name for f in formats.FORMATS
                if f.loadable and f.ggml_id is not None}
_GGML_TO_ENC = {v: k for k, v in _ENC_TO_GGML.items()}

_SAFETENSORS_DTYPE_TO_ENC = {
    "F32": SupportedEncoding.float32, "BF16": SupportedEncoding.bfloat16, "F16": SupportedEncoding.float16,
    "F8_E4M3": SupportedEncoding.float8_e4m3fn,
}
_TORCH_DTYPE_TO_ENC = {
    "float32": SupportedEncoding.float32, "float": SupportedEncoding.float32, "bfloat16": SupportedEncoding.bfloat16,
    "float16": SupportedEncoding.float16, "half": SupportedEncoding.float16,
}


def safetensors_dtypes(path: str | os.PathLike) -> dict[str, int]:
    """``{safetensors dtype: number of tensors}`` from the file's JSON header (no data read)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000:
            raise ValueError(f"{path}: not a safetensors file (header length {n})")
        header = json.loads(f.read(n))
    counts: dict[str, int] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        counts[info["dtype"]] = counts.get(info["dtype"], 0) + 1
    return counts


def gguf_encoding(meta: GGUFMetadata) -> Optional[SupportedEncoding]:
    """The encoding that describes a GGUF file (its ``general.file_type`` / dominant type)."""
    t = meta.primary_type
    return _GGML_TO_ENC.get(t) if t else None


# --------------------------------------------------------------------------- repos


class RepoType(str, enum.Enum):
    """Where a repo lives: ``online`` (a hub repo id, served from the local cache) or ``local``."""

    online = "online"
    local = "local"


_NON_WEIGHT_BIN = ("training_args", "optimizer", "scheduler", "rng_state", "scaler")


@dataclass
class HuggingFaceRepo:
    """A Hugging Face model repo: a local folder, a single GGUF file, or a repo id
    resolved (offline) in the local HF cache."""

    repo_id: str
    """The HuggingFace repo id. While it's called repo_id, it can be a HF remote or
    local path altogether."""
    revision: str = "main"
    """The revision to use for the repo."""
    trust_remote_code: bool = False
    """Whether to trust remote code."""
    repo_type: Optional[RepoType] = None
    """The type of repo. This is inferred from the repo_id."""

    def __post_init__(self) -> None:
        self.repo_id = os.fspath(self.repo_id)
        if self.repo_type is None:
            self.repo_type = RepoType.local if os.path.exists(os.path.expanduser(self.repo_id)) else RepoType.online
        else:
            self.repo_type = RepoType(self.repo_type)
        if self.repo_type is RepoType.local:
            self.repo_id = os.path.expanduser(self.repo_id)
        else:
            validate_hf_repo_access(self.repo_id, self.revision)

    # -- locations
    @cached_property
    def local_path(self) -> Path:
        """The folder holding the repo's files (a GGUF file's own folder for a file repo)."""
        if self.repo_type is RepoType.local:
            p = Path(self.repo_id).resolve()
            return p.parent if p.is_file() else p
        return Path(generate_local_model_path(self.repo_id, self.revision))

    @property
    def single_file(self) -> Optional[Path]:
        """The file, when the repo is a single weights file (a GGUF path)."""
        p = Path(self.repo_id)
        return p.resolve() if self.repo_type is RepoType.local and p.is_file() else None

    def _all_files(self) -> list[str]:
        if self.single_file is not None:
            return [self.single_file.name]
        root = self.local_path
        out = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for fn in sorted(filenames):
                out.append(os.path.relpath(os.path.join(dirpath, fn), root))
        return out

    def file_exists(self, filename: str) -> bool:
        return (self.local_path / filename).is_file()

    def size_of(self, filename: str) -> int | None:
        p = self.local_path / filename
        return p.stat().st_size if p.is_file() else None

    @property
    def info(self) -> Any:
        """A minimal offline stand-in for ``huggingface_hub.ModelInfo``: ``id``, ``sha``
        (the snapshot revision for cached repos) and ``siblings`` (file names)."""
        sha = self.local_path.name if self.repo_type is RepoType.online else None
        return SimpleNamespace(id=self.repo_id, sha=sha,
                               siblings=[SimpleNamespace(rfilename=f) for f in self._all_files()])

    # -- weights
    @cached_property
    def weight_files(self) -> dict[WeightsFormat, list[str]]:
        """Weight files by format (paths relative to :attr:`local_path`)."""
        out: dict[WeightsFormat, list[str]] = {}
        for f in self._all_files():
            low = f.lower()
            base = os.path.basename(low)
            if low.endswith(".safetensors"):
                fmt = WeightsFormat.safetensors
            elif low.endswith(".gguf"):
                fmt = WeightsFormat.gguf
            elif low.endswith((".bin", ".pt", ".pth")) and not base.startswith(_NON_WEIGHT_BIN):
                fmt = WeightsFormat.pytorch
            else:
                continue
            out.setdefault(fmt, []).append(f)
        return out

    @property
    def formats_available(self) -> list[WeightsFormat]:
        return list(self.weight_files.keys())

    @cached_property
    def _config_dtype(self) -> Optional[SupportedEncoding]:
        p = self.local_path / "config.json"
        if self.single_file is not None or not p.is_file():
            return None
        try:
            cfg = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        d = cfg.get("dtype") or cfg.get("torch_dtype") or (cfg.get("text_config") or {}).get("dtype")
        qc = cfg.get("quantization_config") or _legacy_quantize_config(self.local_path) or {}
        if str(qc.get("quant_method", "")).lower() in ("gptq", "awq"):
            return SupportedEncoding.gptq
        return _TORCH_DTYPE_TO_ENC.get(str(d).replace("torch.", "")) if d else None

    def encoding_for_file(self, file: str | Path) -> SupportedEncoding:
        """The encoding of one weights file: GGUF metadata, safetensors header dtypes
        (the most common floating dtype), or ``config.json``'s dtype for PyTorch files."""
        p = Path(file)
        if not p.is_absolute():
            p = self.local_path / p
        name = p.name.lower()
        if name.endswith(".gguf"):
            enc = gguf_encoding(read_gguf_metadata(p))
            if enc is None:
                raise ValueError(f"{p}: GGUF file with tensor types {dict(read_gguf_metadata(p).tensor_type_counts)} "
                                 f"has no supported encoding; libremax reads GGUF tensors of types "
                                 f"{sorted(set(_ENC_TO_GGML.values()))}")
            return enc
        if name.endswith(".safetensors"):
            if self._config_dtype is SupportedEncoding.gptq:
                return SupportedEncoding.gptq
            counts = safetensors_dtypes(p)
            floats = {k: v for k, v in counts.items() if k in _SAFETENSORS_DTYPE_TO_ENC}
            if not floats:
                raise ValueError(f"{p}: no floating-point tensors (dtypes {counts}); cannot tell its encoding")
            return _SAFETENSORS_DTYPE_TO_ENC[max(floats, key=lambda k: floats[k])]
        if name.endswith((".bin", ".pt", ".pth")):
            return self._config_dtype or SupportedEncoding.float32
        raise ValueError(f"{p}: not a weights file (.safetensors, .gguf, .bin/.pt/.pth)")

    @cached_property
    def _encodings_by_file(self) -> dict[str, SupportedEncoding]:
        out = {}
        for files in self.weight_files.values():
            for f in files:
                out[f] = self.encoding_for_file(f)
        return out

    @property
    def supported_encodings(self) -> list[SupportedEncoding]:
        """Encodings the repo's weight files contain (in first-seen order)."""
        return list(dict.fromkeys(self._encodings_by_file.values()))

    def files_for_encoding(
        self, encoding: SupportedEncoding, weights_format: Optional[WeightsFormat] = None
    ) -> dict[WeightsFormat, list[Path]]:
        """Weight files holding ``encoding``, by format (absolute paths)."""
        encoding = SupportedEncoding.parse(encoding)
        out: dict[WeightsFormat, list[Path]] = {}
        for fmt, files in self.weight_files.items():
            if weights_format is not None and fmt != weights_format:
                continue
            sel = [self.local_path / f for f in files if self._encodings_by_file[f] == encoding]
            if sel:
                out[fmt] = sel
        return out

    def __hash__(self) -> int:
        return hash((self.repo_id, self.revision, self.trust_remote_code, self.repo_type))


# --------------------------------------------------------------------------- configs


def get_rope_parameters(config: Any) -> dict[str, Any]:
    """The RoPE parameters of a transformers config or config dict, read from either
    layout: transformers 5 ``rope_parameters`` (``{"rope_theta", "rope_type", ...}``,
    possibly one dict per attention type, e.g. Gemma3's ``full_attention``) or
    transformers 4 / hub ``rope_theta`` + ``rope_scaling``.

    Returns a flat dict with at least ``rope_theta`` and ``rope_type`` (for per-layer-type
    parameters: those of ``full_attention``, or the first entry).
    """
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    rp = get("rope_parameters")
    out: dict[str, Any] = {}
    if isinstance(rp, dict) and rp:
        if "rope_theta" in rp or "rope_type" in rp:
            out.update(rp)
        else:  # per attention type
            sub = rp.get("full_attention") or next((v for v in rp.values() if isinstance(v, dict)), {})
            out.update(sub)
    scaling = get("rope_scaling")
    if isinstance(scaling, dict):
        for k, v in scaling.items():
            out.setdefault(k, v)
        if "type" in scaling:
            out.setdefault("rope_type", scaling["type"])
    theta = get("rope_theta")
    if theta is not None and "rope_theta" not in out:
        out["rope_theta"] = theta
    out.setdefault("rope_theta", 10000.0)
    out.setdefault("rope_type", "default")
    out["rope_theta"] = float(out["rope_theta"])
    return out


def get_rope_theta(config: Any) -> float:
    """``rope_theta`` from ``rope_theta`` (transformers 4 / hub files) or
    ``rope_parameters`` (transformers 5); 10000.0 when neither is set."""
    return get_rope_parameters(config)["rope_theta"]


class PlainConfig(SimpleNamespace):
    """A model config as plain attributes, in the shape of a ``transformers`` config (``cfg.hidden_size``,
    ``cfg.get(key, default)``, ``cfg.to_dict()``): what a GGUF file of a native architecture reads as
    (its family's translation fills in the config class's defaults), so loading it needs no transformers."""

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the fields (``transformers.PretrainedConfig.to_dict`` returns a fresh dict too)."""
        return copy.deepcopy(vars(self))

    def get(self, key: str, default: Any = None) -> Any:
        return vars(self).get(key, default)


def model_type_classes(model_type: Optional[str]) -> list[str]:
    """Model class names for a ``model_type`` (configs saved without ``architectures``): its causal-LM and
    base-model classes from transformers' auto maps, in that order."""
    if not model_type:
        return []
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    return [c for c in (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type), MODEL_MAPPING_NAMES.get(model_type)) if c]


_GGUF_CONFIG_TRANSLATOR: list[Optional[Callable[[GGUFMetadata], Optional[dict]]]] = [None]


def set_gguf_config_translator(translate: Optional[Callable[[GGUFMetadata], Optional[dict]]]) -> None:
    """Install the GGUF metadata -> Hugging Face config dict translation :func:`load_huggingface_config` uses
    (the registry installs ``registry.hf_config_dict_from_gguf`` when it is imported, which importing
    ``max.pipelines.lib`` always does; this module never imports the registry)."""
    _GGUF_CONFIG_TRANSLATOR[0] = translate


def load_huggingface_config(path: str | os.PathLike, *, revision: Optional[str] = None,
                            trust_remote_code: bool = False) -> Any:
    """The config of a model folder, cached repo id or GGUF file (a ``transformers`` config, or a
    :class:`PlainConfig` for a GGUF file of a native architecture).

    For a GGUF file of an architecture with a native folder the config is built from the file's
    metadata by that folder's translation, which fills in the transformers config class's defaults
    itself (milliseconds, no transformers import; see ``registry.hf_config_dict_from_gguf``); other
    architectures go through ``AutoConfig.from_pretrained(dir, gguf_file=...)`` (seconds).
    """
    p = os.fspath(path)
    if os.path.isfile(p) and is_gguf_file(p):
        translate = _GGUF_CONFIG_TRANSLATOR[0]
        d = translate(read_gguf_metadata(p)) if translate is not None else None
        if d is not None:
            return PlainConfig(**d)
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(os.path.dirname(os.path.abspath(p)), gguf_file=os.path.basename(p),
                                          trust_remote_code=trust_remote_code)
    from transformers import AutoConfig

    if os.path.isdir(p):
        if not os.path.isfile(os.path.join(p, "config.json")):
            raise FileNotFoundError(f"{p}: no config.json in the model folder")
        return _with_quantize_config(AutoConfig.from_pretrained(p, trust_remote_code=trust_remote_code), p)
    local = generate_local_model_path(p, revision or "main")
    return _with_quantize_config(AutoConfig.from_pretrained(local, trust_remote_code=trust_remote_code), local)


def _legacy_quantize_config(folder: str | os.PathLike) -> Optional[dict]:
    """Older AutoGPTQ folders keep their GPTQ parameters in ``quantize_config.json`` (no
    ``quantization_config`` in config.json): those, as a ``quantization_config`` dict."""
    q = Path(folder) / "quantize_config.json"
    if not q.is_file():
        return None
    try:
        d = json.loads(q.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return {"quant_method": "gptq", **d} if isinstance(d, dict) and "bits" in d else None


def _with_quantize_config(cfg: Any, folder: str | os.PathLike) -> Any:
    if getattr(cfg, "quantization_config", None) is None:
        legacy = _legacy_quantize_config(folder)
        if legacy is not None:
            cfg.quantization_config = legacy
    return cfg


def load_generation_config(path: str | os.PathLike) -> Optional[Any]:
    """``transformers.GenerationConfig`` of a model folder (``generation_config.json``), or None."""
    from transformers import GenerationConfig

    p = Path(path)
    if p.is_file():
        p = p.parent
    if not (p / "generation_config.json").is_file():
        return None
    return GenerationConfig.from_pretrained(str(p))


def eos_token_ids_from_configs(*configs: Any) -> set[int]:
    """The union of ``eos_token_id`` (an int or a list) over configs / generation configs."""
    out: set[int] = set()
    for c in configs:
        if c is None:
            continue
        v = c.get("eos_token_id") if isinstance(c, dict) else getattr(c, "eos_token_id", None)
        if v is None:
            continue
        if isinstance(v, int):
            out.add(v)
        else:
            out.update(int(x) for x in v)
    return out
