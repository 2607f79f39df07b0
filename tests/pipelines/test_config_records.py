"""The configuration records (issue 39 item 1): every knob declared once (default, type, help, validation,
aliases, flag), the CLI flags built from those declarations, one default per workload for ``max_batch_size``
(shared by the KV cache's slots and the scheduler's limit), ``kv_cache_dtype`` as the one KV-dtype knob, and
no import circle between ``lib/config.py`` and the registry."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import click
import pytest
from test_hf_utils import make_gguf, make_hf_model_dir

from max.dtype import DType
from max.interfaces import PipelineTask
from max.nn.kv_cache.cache_params import KV_CACHE_DTYPES
from max.pipelines import PipelineConfig
from max.pipelines.lib import config as config_mod
from max.pipelines.lib.config import (
    MAX_BATCH_SIZE_DEFAULTS,
    KVCacheConfig,
    LoRAConfig,
    MAXModelConfig,
    SamplingConfig,
    batch_size_for,
    find_knob,
)
from max.pipelines.lib.knobs import knobs_of
from test_hf_fallback import gpt2_dir  # noqa: F401 - the fixture

SRC = Path(config_mod.__file__).resolve().parents[3]  # .../src
LIB = SRC / "max" / "pipelines" / "lib"


# --------------------------------------------------------------------------- declarations


def test_every_field_of_every_record_is_a_knob_with_help():
    for cls in (config_mod._PipelineFields, MAXModelConfig, KVCacheConfig, SamplingConfig, LoRAConfig,
                config_mod.ProfilingConfig):
        public = [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_") and f.name != "source_encoding"]
        knobs = knobs_of(cls)
        assert public == list(knobs), cls.__name__
        assert all(spec.help.strip() for _, spec in knobs.values()), cls.__name__
    helps = PipelineConfig.help()
    assert helps["kv_cache_dtype"] == find_knob("kv_cache_dtype")[2].help
    assert "{default}" not in " ".join(helps.values())
    assert "(default 0.9)" in helps["device_memory_utilization"]  # formatted from the field's default


def test_records_are_frozen_and_validate_from_their_declarations():
    kv = KVCacheConfig(kv_cache_page_size=16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        kv.kv_cache_page_size = 32  # type: ignore[misc]
    assert dataclasses.replace(kv, enable_prefix_caching=True).kv_cache_page_size == 16
    with pytest.raises(ValueError, match=r"kv_cache_page_size must be >= 1, got 0"):
        KVCacheConfig(kv_cache_page_size=0)
    with pytest.raises(ValueError, match=r"device_memory_utilization must be in \(0, 1\], got 0"):
        KVCacheConfig(device_memory_utilization=0)
    with pytest.raises(ValueError, match="gpu_profiling must be one of off, on, detailed; got 'loud'"):
        config_mod.ProfilingConfig(gpu_profiling="loud")
    with pytest.raises(ValueError, match="kv_cache_memory must be >= 1"):
        KVCacheConfig(kv_cache_memory=0)


def test_kwargs_routing_aliases_and_validation_come_from_the_knobs():
    d = make_hf_model_dir()
    c = PipelineConfig(model_path=d, devices="cpu", page_size=32, max_seq_len=64, encoding="float32")
    assert c.kv_cache_config.kv_cache_page_size == 32 and c.max_length == 64
    assert c.model_config.quantization_encoding.value == "float32"
    assert config_mod._KWARG_ALIASES["devices"] == "device_specs"
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.max_batch_size = 3  # the pipeline's own fields are a frozen record too
    with pytest.raises(ValueError, match="speculative_method must be one of draft_model, ngram, mtp; got 'magic'"):
        PipelineConfig(model_path=d, speculative_method="magic")
    with pytest.raises(ValueError, match="max_queue_size_tg must be >= 1, got 0"):
        PipelineConfig(model_path=d, max_queue_size_tg=0)


# --------------------------------------------------------------------------- kv_cache_dtype: one knob


@pytest.mark.parametrize("alias", ["cache_dtype", "kv_cache_format", "kv_cache_dtype"])
def test_cache_dtype_aliases_are_the_one_kv_cache_dtype_knob(alias):
    d = make_hf_model_dir()
    c = PipelineConfig(model_path=d, devices="cpu", **{alias: "int8"})
    assert c.kv_cache_config.kv_cache_dtype == "int8" and c.kv_cache_config.cache_dtype is DType.int8
    c = PipelineConfig(model_path=d, devices="cpu", cache_dtype=DType.float16)  # MAX passes a DType
    assert c.kv_cache_config.kv_cache_dtype == "float16" and c.kv_cache_config.cache_dtype is DType.float16
    assert PipelineConfig(model_path=d, devices="cpu").kv_cache_config.cache_dtype is None  # auto
    with pytest.raises(ValueError, match="not a KV cache dtype"):
        PipelineConfig(model_path=d, cache_dtype=DType.int32)
    assert KVCacheConfig(cache_dtype=DType.bfloat16).kv_cache_dtype == "bfloat16"  # on the record itself too
    assert KVCacheConfig(kv_cache_format="int8").cache_dtype is DType.int8
    with pytest.raises(TypeError, match="'cache_dtype' is an alias of 'kv_cache_dtype'"):
        KVCacheConfig(cache_dtype="int8", kv_cache_dtype="int8")


def test_kv_cache_dtype_choices_are_written_once():
    assert find_knob("kv_cache_dtype")[2].choices == ("auto", *KV_CACHE_DTYPES)
    from max.entrypoints.cli import knob_option

    @knob_option("kv_cache_dtype")
    def f() -> None: ...

    (param,) = f.__click_params__
    assert isinstance(param.type, click.Choice) and tuple(param.type.choices) == ("auto", *KV_CACHE_DTYPES)
    # no second list of the choices anywhere in the sources
    hits = [p for p in SRC.rglob("*.py") if re.search(r"""["']fp8_e4m3["']\s*,\s*["']float32["']""", p.read_text())]
    assert hits == [], hits


def test_refusals_name_the_family_and_the_option():
    kv = KVCacheConfig(kv_cache_dtype="int8")
    with pytest.raises(NotImplementedError, match=r"Whisper: kv_cache_dtype 'int8' is not supported .*use auto, "
                                                  r"float32, bfloat16, float16"):
        kv.refuse_kv_cache_dtype("Whisper", allowed=(DType.float32, DType.bfloat16, DType.float16))
    KVCacheConfig(kv_cache_dtype="bfloat16").refuse_kv_cache_dtype("Whisper", allowed=(DType.bfloat16,))
    KVCacheConfig().refuse_kv_cache_dtype("X")  # auto is always fine
    spill = KVCacheConfig(enable_prefix_caching=True, enable_kvcache_swapping_to_host=True)
    with pytest.raises(NotImplementedError, match="CSM: enable_kvcache_swapping_to_host"):
        spill.refuse_swapping("CSM")


def test_transformers_fallback_refuses_a_kv_cache_dtype_it_cannot_store(gpt2_dir, monkeypatch):
    from max.entrypoints.llm import LLM
    from max.pipelines.lib.registry import PIPELINE_REGISTRY

    monkeypatch.setattr(PIPELINE_REGISTRY, "_fallbacks", {})  # leave the registry's warn-once state as it was
    d = str(gpt2_dir[0])  # a tiny GPT-2: no native folder, runs through transformers
    with pytest.raises(NotImplementedError, match=r"transformers fallback.*kv_cache_dtype 'float16'"):
        LLM(PipelineConfig(model_path=d, devices="cpu", kv_cache_dtype="float16", max_length=64))
    llm = LLM(PipelineConfig(model_path=d, devices="cpu", kv_cache_dtype="float32", max_length=64))  # its own dtype
    assert llm.scheduler.max_batch_size == llm.pipeline.pipeline_model.kv_manager.max_batch_size


# --------------------------------------------------------------------------- max_batch_size


def test_max_batch_size_defaults_live_next_to_the_field():
    assert batch_size_for(None, PipelineTask.TEXT_GENERATION) == MAX_BATCH_SIZE_DEFAULTS["text_generation"]
    assert batch_size_for(None, "embeddings_generation") == MAX_BATCH_SIZE_DEFAULTS["embeddings_generation"]
    assert batch_size_for(None, "transcription") == MAX_BATCH_SIZE_DEFAULTS["transcription"]
    assert batch_size_for(3, "transcription") == 3
    with pytest.raises(ValueError, match="no max_batch_size default for workload 'painting'"):
        batch_size_for(None, "painting")
    assert f"(default {MAX_BATCH_SIZE_DEFAULTS['text_generation']})" in find_knob("max_batch_size")[2].help


def test_no_literal_max_batch_size_default_outside_its_field():
    pattern = re.compile(r"max_batch_size\W{0,3}\s*or\s*\d|max_batch_size\s*:\s*int\s*=\s*\d|default_max_batch"
                         r"|DEFAULT_MAX_BATCH|max_batch_size\"\)\s*or\s*\d")
    hits = [f"{p.relative_to(SRC)}:{i}" for p in SRC.rglob("*.py") for i, line in
            enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == [], hits


def test_scheduler_limit_and_kv_slots_come_from_the_same_field(tiny_llm):
    llm, d = tiny_llm
    from max.pipelines.lib.registry import PIPELINE_REGISTRY

    slots = llm.pipeline.pipeline_model.kv_manager.max_batch_size
    resolved = PIPELINE_REGISTRY.resolve(llm.pipeline_config)
    assert llm.scheduler.max_batch_size == slots == resolved.max_batch_size == MAX_BATCH_SIZE_DEFAULTS[
        "text_generation"]
    assert resolved.task is PipelineTask.TEXT_GENERATION


@pytest.fixture(scope="module")
def tiny_llm():
    from family_support import tiny_family
    from max.entrypoints.llm import LLM

    d, _, _ = tiny_family("llama")
    return LLM(PipelineConfig(model_path=d, devices="cpu", max_length=64, kv_cache_page_size=16)), d


# --------------------------------------------------------------------------- no import circle


def _imported_lib_modules(path: Path) -> set[str]:
    """Every ``max.pipelines.lib.*`` module a file imports, at top level or inside functions (TYPE_CHECKING
    imports are not run and are left out)."""
    out: set[str] = set()
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("max.pipelines.lib."):
            out.add(node.module.split(".")[3])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[3] for a in node.names if a.name.startswith("max.pipelines.lib."))
    return out


def test_config_never_imports_the_registry():
    seen, todo = set(), ["config"]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        f = LIB / f"{mod}.py"
        if f.is_file():
            todo.extend(_imported_lib_modules(f))
    assert "registry" not in seen, sorted(seen)
    assert "tokenizer" not in seen, sorted(seen)


def test_gguf_config_reads_through_the_registry_translator_without_importing_it():
    p = make_gguf("Q8_0")
    c = PipelineConfig(model_path=p, devices="cpu")
    assert type(c.model_config.huggingface_config).__name__ == "PlainConfig"  # the native translation
    assert c.model_config.architectures == ["LlamaForCausalLM"]
