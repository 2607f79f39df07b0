"""Model registry: ``SupportedArchitecture``, ``PipelineRegistry`` and ``PIPELINE_REGISTRY``.

An architecture is looked up by the model's Hugging Face class name: the first entry
of ``config.json``'s ``architectures`` or, for GGUF files, the class of the config that the
registered architecture for its ``general.architecture`` translates from the file's metadata
(:func:`gguf_architectures` is the one GGUF-name map; :func:`hf_config_dict_from_gguf` the
translation).
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from max.graph.quantization import formats
from max.graph.weights import WeightsFormat
from max.interfaces import PipelineTask
from max.nn.kv_cache import KVCacheStrategy
from max.pipelines.lib.config import batch_size_for
from max.pipelines.lib.hf_utils import HuggingFaceRepo, SupportedEncoding, load_huggingface_config, \
    model_type_classes, set_gguf_config_translator

if TYPE_CHECKING:  # pragma: no cover
    from max.pipelines.lib.config import PipelineConfig

logger = logging.getLogger("max.pipelines")

WeightsAdapter = Callable[..., dict[str, Any]]
"""Converts a checkpoint's state dict (``dict[str, WeightData]``) to the names/layout the
``pipeline_model`` expects."""


class RopeType(str, enum.Enum):
    none = "none"
    normal = "normal"
    neox = "neox"
    longrope = "longrope"
    yarn = "yarn"


@dataclass
class SupportedArchitecture:
    """A model architecture the pipelines can run.

    ``name`` must equal the Hugging Face model class name (``LlamaForCausalLM``).
    ``supported_encodings`` maps each encoding to the KV cache strategies it works
    with; ``tokenizer`` is a callable (usually a class) returning a
    ``PipelineTokenizer``.
    """

    name: str
    example_repo_ids: list[str]
    default_encoding: SupportedEncoding
    supported_encodings: dict[SupportedEncoding, list[KVCacheStrategy]]
    pipeline_model: type
    task: PipelineTask
    tokenizer: Callable[..., Any]
    default_weights_format: WeightsFormat
    rope_type: RopeType = RopeType.none
    weight_adapters: Optional[dict[WeightsFormat, WeightsAdapter]] = None
    multi_gpu_supported: bool = False
    prefix_caching_supported: bool = True
    gguf_architectures: list[str] = field(default_factory=list)
    """libremax extension: the GGUF ``general.architecture`` names this architecture loads
    (e.g. ``["llama"]``)."""
    config_from_gguf: Optional[Callable[[Any], Optional[dict]]] = None
    """libremax extension: GGUF metadata -> the Hugging Face config dict (with ``model_type`` and
    ``architectures``), or None when the file is not this architecture's (e.g. a ``llama`` file
    with experts is Mixtral's)."""
    transcription_pipeline: Optional[Callable[..., Any]] = None
    """libremax extension: for an architecture that transcribes speech (Whisper), ``(pipeline_config) ->``
    its speech-recognition pipeline (``transcribe(list[TranscriptionRequest])``, ``check(request)``; see
    :mod:`max.pipelines.lib.transcription`); :meth:`PipelineRegistry.retrieve_transcriber` builds it."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("SupportedArchitecture: name must be a non-empty str (the HF model class name)")
        self.default_encoding = SupportedEncoding.parse(self.default_encoding)
        self.supported_encodings = {SupportedEncoding.parse(k): [KVCacheStrategy(s) for s in v]
                                    for k, v in self.supported_encodings.items()}
        if self.default_encoding not in self.supported_encodings:
            raise ValueError(f"SupportedArchitecture {self.name}: default_encoding {self.default_encoding.value!r} "
                             f"is not in supported_encodings {[e.value for e in self.supported_encodings]}")
        self.task = PipelineTask(self.task)
        self.default_weights_format = WeightsFormat(self.default_weights_format)
        self.rope_type = RopeType(self.rope_type)

    @property
    def tokenizer_cls(self) -> type:
        if isinstance(self.tokenizer, type):
            return self.tokenizer
        return type(self.tokenizer)


@dataclass(frozen=True)
class ResolvedArchitecture:
    """What :meth:`PipelineRegistry.resolve` decided for a config: the architecture that runs its checkpoint,
    that architecture's task, and the batch limit (``PipelineConfig.max_batch_size``, or the default of the
    family's workload: the KV cache's slots and the scheduler's limit)."""

    architecture: SupportedArchitecture
    task: PipelineTask
    max_batch_size: int


class PipelineRegistry:
    """Registered architectures, looked up by the model's HF class name."""

    def __init__(self, architectures: list[SupportedArchitecture], *, hf_fallback: bool = False) -> None:
        self.architectures: dict[str, SupportedArchitecture] = {}
        self.hf_fallback = hf_fallback
        """libremax extension: run causal LMs without a registered architecture through transformers
        (when ``PipelineConfig.hf_fallback`` allows it); the built-in registry does."""
        self._fallbacks: dict[str, SupportedArchitecture] = {}
        self._cached_huggingface_configs: dict[HuggingFaceRepo, Any] = {}
        self._cached_huggingface_tokenizers: dict[HuggingFaceRepo, Any] = {}
        for arch in architectures:
            self.register(arch)

    def register(self, architecture: SupportedArchitecture, *, allow_override: bool = False) -> None:
        """Add an architecture; ValueError if its name is taken (unless ``allow_override``)."""
        if not isinstance(architecture, SupportedArchitecture):
            raise TypeError(f"register: expected a SupportedArchitecture, got {type(architecture).__name__}")
        if architecture.name in self.architectures and not allow_override:
            raise ValueError(f"architecture {architecture.name!r} is already registered "
                             "(pass allow_override=True to replace it)")
        self.architectures[architecture.name] = architecture

    def reset(self) -> None:
        self.architectures.clear()
        self._cached_huggingface_configs.clear()
        self._cached_huggingface_tokenizers.clear()

    # -- HF artefacts (cached)
    def get_active_huggingface_config(self, huggingface_repo: HuggingFaceRepo) -> Any:
        """Cached ``transformers`` config of the repo (``config.json`` or GGUF metadata)."""
        if huggingface_repo not in self._cached_huggingface_configs:
            src = huggingface_repo.single_file or huggingface_repo.local_path
            if huggingface_repo.single_file is None and not (huggingface_repo.local_path / "config.json").is_file():
                gguf = huggingface_repo.weight_files.get(WeightsFormat.gguf)
                if gguf:
                    src = huggingface_repo.local_path / gguf[0]
            self._cached_huggingface_configs[huggingface_repo] = load_huggingface_config(
                src, trust_remote_code=huggingface_repo.trust_remote_code)
        return self._cached_huggingface_configs[huggingface_repo]

    def get_active_tokenizer(self, huggingface_repo: HuggingFaceRepo) -> Any:
        """Cached ``transformers`` tokenizer of the repo (fast GGUF path for GGUF files)."""
        if huggingface_repo not in self._cached_huggingface_tokenizers:
            from max.pipelines.lib.tokenizer import load_hf_tokenizer

            src = huggingface_repo.single_file or huggingface_repo.local_path
            self._cached_huggingface_tokenizers[huggingface_repo] = load_hf_tokenizer(
                src, trust_remote_code=huggingface_repo.trust_remote_code)
        return self._cached_huggingface_tokenizers[huggingface_repo]

    # -- lookup
    def _names_for(self, huggingface_repo: HuggingFaceRepo) -> list[str]:
        names: list[str] = []
        single = huggingface_repo.single_file
        if single is not None or not (huggingface_repo.local_path / "config.json").is_file():
            from max.pipelines.lib.gguf_utils import read_gguf_metadata

            files = [single] if single is not None else [
                huggingface_repo.local_path / f for f in huggingface_repo.weight_files.get(WeightsFormat.gguf, [])]
            for f in files[:1]:
                meta = read_gguf_metadata(f)
                d = hf_config_dict_from_gguf(meta)
                if d is not None:
                    names.extend(d.get("architectures") or [])
                names.extend(arch.name for arch in self.architectures.values()
                             if meta.architecture in arch.gguf_architectures and arch.name not in names)
                if not names:  # no native translation: ask transformers (fallback architectures)
                    try:
                        names.extend(getattr(self.get_active_huggingface_config(huggingface_repo), "architectures",
                                             None) or [])
                    except Exception:  # noqa: BLE001 - transformers does not know it either
                        names.append(f"GGUF architecture {meta.architecture!r}")
        else:
            cfg = self.get_active_huggingface_config(huggingface_repo)
            names.extend(getattr(cfg, "architectures", None) or [])
            if not names:  # configs saved without ``architectures``: the model_type's classes
                names.extend(classes_for_model_type(getattr(cfg, "model_type", None), self))
            if _is_sentence_transformers(huggingface_repo.local_path):
                # an embedding model saved with its LM class name (Qwen3-Embedding): its base model first
                names[:0] = [n[: -len("ForCausalLM")] + "Model" for n in names if n.endswith("ForCausalLM")]
        return names

    def retrieve_architecture(self, huggingface_repo: HuggingFaceRepo) -> Optional[SupportedArchitecture]:
        """The registered architecture for the repo, or None."""
        for n in self._names_for(huggingface_repo):
            if n in self.architectures:
                return self.architectures[n]
        return None

    def resolve(self, pipeline_config: "PipelineConfig", override_architecture: Optional[str] = None
                ) -> "ResolvedArchitecture":
        """Resolution's second half, in one place (the first, locating the model's files, ran when the config
        was made): register the config's ``custom_architectures``, pick the architecture of its checkpoint
        (a registered one, else the transformers fallback when ``hf_fallback`` allows), and return the
        decision as a :class:`ResolvedArchitecture`.  ValueError when no architecture runs the model."""
        custom = getattr(pipeline_config, "custom_architecture_modules", None)
        for module in custom() if custom is not None else []:
            for arch in module.ARCHITECTURES:
                self.register(arch, allow_override=True)
        mc = pipeline_config.model_config
        arch = self.pick(mc.huggingface_weight_repo, hf_fallback=bool(getattr(pipeline_config, "hf_fallback", True)),
                         model_path=str(mc.model_path), override_architecture=override_architecture)
        return ResolvedArchitecture(
            architecture=arch, task=arch.task,
            max_batch_size=batch_size_for(getattr(pipeline_config, "max_batch_size", None),
                                          getattr(arch.pipeline_model, "batch_workload", arch.task)))

    def _require(self, pipeline_config: "PipelineConfig", override_architecture: Optional[str] = None
                 ) -> SupportedArchitecture:
        return self.resolve(pipeline_config, override_architecture).architecture

    def pick(self, repo: HuggingFaceRepo, *, hf_fallback: bool = True, model_path: str = "",
             override_architecture: Optional[str] = None) -> SupportedArchitecture:
        """The architecture that runs the checkpoint of ``repo`` (plain values in, no config read): the
        registered one named by its config, else (``hf_fallback``) the transformers fallback; ValueError
        naming what the checkpoint declares otherwise."""
        if override_architecture is not None:
            if override_architecture in self._fallbacks:
                return self._fallbacks[override_architecture]
            if override_architecture not in self.architectures:
                raise ValueError(f"architecture {override_architecture!r} is not registered; supported: "
                                 f"{sorted(self.architectures)}")
            return self.architectures[override_architecture]
        arch = self.retrieve_architecture(repo)
        if arch is None:
            names = self._names_for(repo)
            fallback = self._fallback_for(hf_fallback, names)
            if fallback is not None:
                return fallback
            hint = ""
            if self.hf_fallback and any(_fallback_class(n) is not None for n in names):
                hint = (" (transformers could run it: remove --no-fallback / leave PipelineConfig.hf_fallback "
                        "at True)")
            raise ValueError(
                f"No supported architecture for {model_path or str(repo.local_path)!r} (model declares "
                f"{names or 'no architecture'}); supported architectures: {sorted(self.architectures) or 'none'}"
                + ("" if self.architectures else " (call register_all_models() to register the built-in ones)")
                + hint)
        why = self._native_refusal(arch, repo)
        if why is not None:  # a variant the native family does not run (yet): transformers may
            fallback = self._fallback_for(hf_fallback, [arch.name], why)
            if fallback is not None:
                return fallback
        return arch

    def _native_refusal(self, arch: SupportedArchitecture, repo: HuggingFaceRepo) -> Optional[str]:
        """Why the native ``arch`` cannot run this checkpoint's config, when its pipeline model says so
        (``unsupported_reason(hf_config_dict)``; families without that hook run every config they load)."""
        check = getattr(arch.pipeline_model, "unsupported_reason", None)
        if check is None:
            return None
        cfg = self.get_active_huggingface_config(repo)
        return check(cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg))

    def _fallback_for(self, allowed: bool, names: list[str], why: Optional[str] = None
                      ) -> Optional[SupportedArchitecture]:
        """The transformers fallback architecture for a causal LM transformers knows (warns once per name;
        ``allowed``: the config's ``hf_fallback``; ``why``: the native architecture's reason for not running
        this checkpoint)."""
        if not self.hf_fallback or not allowed:
            return None
        for n in names:
            if _fallback_class(n) is None:
                continue
            if n not in self._fallbacks:
                from max.pipelines.lib.hf_fallback import HFFallbackModel
                from max.pipelines.lib.tokenizer import TextTokenizer

                logger.warning("%s: running it through Hugging Face transformers (no paged KV cache; slower). "
                               "Pass --no-fallback (hf_fallback=False) to make this an error.",
                               f"{n} has no native libremax architecture" if why is None else why)
                self._fallbacks[n] = SupportedArchitecture(
                    name=n, example_repo_ids=[], default_encoding="float32",
                    supported_encodings={e: [KVCacheStrategy.MODEL_DEFAULT] for e in
                                         formats.encoding_names(ggml_only=True)},
                    pipeline_model=HFFallbackModel, task=PipelineTask.TEXT_GENERATION, tokenizer=TextTokenizer,
                    default_weights_format=WeightsFormat.safetensors, prefix_caching_supported=False)
            return self._fallbacks[n]
        return None

    def retrieve_pipeline_task(self, pipeline_config: "PipelineConfig") -> PipelineTask:
        """The task of the model's architecture; ValueError if none matches."""
        return self._require(pipeline_config).task

    def transcribes(self, pipeline_config: "PipelineConfig") -> bool:
        """Whether the model of ``pipeline_config`` is a speech-recognition model (its registered architecture
        has a ``transcription_pipeline``)."""
        arch = self.retrieve_architecture(pipeline_config.model_config.huggingface_weight_repo)
        return arch is not None and arch.transcription_pipeline is not None

    def retrieve_transcriber(self, pipeline_config: "PipelineConfig") -> Any:
        """The speech-recognition pipeline of the model of ``pipeline_config``; ValueError naming the
        architecture when the model does not transcribe speech."""
        arch = self._require(pipeline_config)
        if arch.transcription_pipeline is None:
            raise ValueError(f"{pipeline_config.model_config.model_path}: architecture {arch.name} does not "
                             "transcribe speech (a speech recognition model such as Whisper does)")
        return arch.transcription_pipeline(pipeline_config)

    def retrieve_tokenizer(self, pipeline_config: "PipelineConfig", override_architecture: Optional[str] = None
                           ) -> Any:
        """A ``PipelineTokenizer`` for the config; ValueError if no architecture matches."""
        arch = self._require(pipeline_config, override_architecture)
        mc = pipeline_config.model_config
        source = mc.gguf_file if (mc.gguf_file is not None and not (mc.model_dir / "tokenizer.json").is_file()
                                  and not (mc.model_dir / "tokenizer_config.json").is_file()) else mc.model_dir
        return arch.tokenizer(
            str(source),
            revision=mc.huggingface_model_revision,
            max_length=pipeline_config.max_length,
            trust_remote_code=mc.trust_remote_code,
            pipeline_config=pipeline_config,
            chat_template=pipeline_config.retrieve_chat_template(),
        )

    def retrieve_factory(self, pipeline_config: "PipelineConfig", task: PipelineTask = PipelineTask.TEXT_GENERATION,
                         override_architecture: Optional[str] = None) -> tuple[Any, Callable[[], Any]]:
        """``(tokenizer, factory)``; ``factory()`` builds the pipeline for ``task``."""
        arch = self._require(pipeline_config, override_architecture)
        if arch.task != PipelineTask(task):
            raise ValueError(f"architecture {arch.name} serves task {arch.task.value!r}, not {PipelineTask(task).value!r}")
        tokenizer = self.retrieve_tokenizer(pipeline_config, override_architecture=arch.name)
        own = getattr(arch.pipeline_model, "pipeline_class", None)  # a model that brings its own pipeline (CSM)
        pipeline_cls = own() if callable(own) else get_pipeline_for_task(arch.task, pipeline_config)

        def factory() -> Any:
            return pipeline_cls(
                pipeline_config=pipeline_config,
                pipeline_model=arch.pipeline_model,
                eos_token_id=tokenizer.eos,
                weight_adapters=arch.weight_adapters or {},
                tokenizer=tokenizer,
            )

        return tokenizer, factory

    def retrieve(self, pipeline_config: "PipelineConfig", task: PipelineTask = PipelineTask.TEXT_GENERATION,
                 override_architecture: Optional[str] = None) -> tuple[Any, Any]:
        """``(tokenizer, pipeline)`` for the config."""
        tokenizer, factory = self.retrieve_factory(pipeline_config, task, override_architecture)
        return tokenizer, factory()


def get_pipeline_for_task(task: PipelineTask, pipeline_config: "PipelineConfig") -> type:
    """The pipeline class for ``task`` (imported lazily from ``max.pipelines.lib``)."""
    task = PipelineTask(task)
    targets = {
        PipelineTask.TEXT_GENERATION: ("max.pipelines.lib.pipeline", "TextGenerationPipeline"),
        PipelineTask.EMBEDDINGS_GENERATION: ("max.pipelines.lib.embeddings_pipeline", "EmbeddingsPipeline"),
        PipelineTask.AUDIO_GENERATION: ("max.pipelines.lib.audio_generator_pipeline", "AudioGeneratorPipeline"),
        PipelineTask.SPEECH_TOKEN_GENERATION: ("max.pipelines.lib.speech_token_pipeline",
                                               "SpeechTokenGenerationPipeline"),
    }
    if task not in targets:
        raise ValueError(f"no pipeline implementation for task {task.value!r}")
    module, name = targets[task]
    speculative = pipeline_config.draft_model_config is not None or \
        getattr(pipeline_config, "speculative_method", None) in ("ngram", "mtp")
    if speculative and task is PipelineTask.TEXT_GENERATION:
        module, name = "max.pipelines.lib.speculative_decoding", "SpeculativeDecodingTextGenerationPipeline"
    return getattr(importlib.import_module(module), name)


def _fallback_class(name: str) -> Any:
    from max.pipelines.lib.hf_fallback import fallback_class

    return fallback_class(name)


def _is_sentence_transformers(folder: Any) -> bool:
    """Whether a model folder is a sentence-transformers embedding model (``modules.json`` with a Pooling)."""
    import json
    from pathlib import Path

    p = Path(folder) / "modules.json"
    try:
        return p.is_file() and any(str(m.get("type", "")).endswith("Pooling") for m in json.loads(p.read_text()))
    except (OSError, ValueError, AttributeError):
        return False


def gguf_architectures() -> dict[str, list[SupportedArchitecture]]:
    """The one GGUF-name map: ``general.architecture`` -> the built-in (and other registered)
    architectures that load it (several when the name is shared, e.g. ``llama`` for Llama and
    Mixtral files)."""
    register_all_models()
    out: dict[str, list[SupportedArchitecture]] = {}
    for arch in PIPELINE_REGISTRY.architectures.values():
        for name in arch.gguf_architectures:
            out.setdefault(name, []).append(arch)
    return out


def hf_config_dict_from_gguf(meta: Any) -> Optional[dict]:
    """The Hugging Face config dict of a GGUF file, from the registered architecture whose
    ``config_from_gguf`` accepts it; None when no architecture translates this file."""
    for arch in gguf_architectures().get(meta.architecture or "", []):
        if arch.config_from_gguf is not None:
            d = arch.config_from_gguf(meta)
            if d is not None:
                return dict(d)
    return None


def classes_for_model_type(model_type: Optional[str], registry: Optional["PipelineRegistry"] = None) -> list[str]:
    """Model class names for a ``model_type`` (configs saved without ``architectures``): its causal-LM
    and base-model classes from transformers' auto maps, the ones registered in ``registry``
    (default: the built-in registry) first."""
    cands = model_type_classes(model_type)
    if not cands:
        return []
    if registry is None:
        register_all_models()
        registry = PIPELINE_REGISTRY
    return sorted(cands, key=lambda c: c not in registry.architectures)


set_gguf_config_translator(hf_config_dict_from_gguf)  # hf_utils reads GGUF configs through it, never importing us

PIPELINE_REGISTRY = PipelineRegistry([], hf_fallback=True)
"""The shared registry the built-in architectures register into."""

ARCHITECTURES_PACKAGE = "max.pipelines.architectures"


def register_all_models() -> bool:
    """Import ``max.pipelines.architectures`` so the built-in architectures register in
    :data:`PIPELINE_REGISTRY`, calling its ``register_all_models()`` when it has one.

    The package is optional while it is being written: this returns False (and
    registers nothing) when ``importlib.util.find_spec`` does not find it.  Import
    errors *inside* an existing package propagate.
    """
    global _ALL_REGISTERED
    if _ALL_REGISTERED:
        return True
    if importlib.util.find_spec(ARCHITECTURES_PACKAGE) is None:
        logger.debug("%s not found; no built-in architectures registered", ARCHITECTURES_PACKAGE)
        return False
    mod = importlib.import_module(ARCHITECTURES_PACKAGE)
    fn = getattr(mod, "register_all_models", None)
    if callable(fn) and fn is not register_all_models:
        fn()
    _ALL_REGISTERED = True
    return True


_ALL_REGISTERED = False
