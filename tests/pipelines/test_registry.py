"""PipelineRegistry / SupportedArchitecture / register_all_models."""

import importlib.util

import pytest
from test_hf_utils import make_gguf, make_hf_model_dir

from max.graph.weights import WeightsFormat
from max.interfaces import PipelineTask
from max.nn.kv_cache import KVCacheStrategy
from max.pipelines import (
    PipelineConfig,
    PipelineRegistry,
    SupportedArchitecture,
    SupportedEncoding,
    TextTokenizer,
    register_all_models,
)


class DummyModel:
    pass


class DummyPipeline:
    def __init__(self, pipeline_config, pipeline_model, eos_token_id, weight_adapters, tokenizer):
        self.args = (pipeline_config, pipeline_model, eos_token_id, weight_adapters, tokenizer)


def arch(name="LlamaForCausalLM", **kw):
    args = dict(name=name, example_repo_ids=["x/y"], default_encoding="float32",
                supported_encodings={"float32": [KVCacheStrategy.PAGED], "q8_0": ["paged"], "q4_0": ["paged"]},
                pipeline_model=DummyModel, task=PipelineTask.TEXT_GENERATION, tokenizer=TextTokenizer,
                default_weights_format=WeightsFormat.safetensors)
    args.update(kw)
    return SupportedArchitecture(**args)


def test_register_and_lookup_hf_folder():
    reg = PipelineRegistry([arch()])
    cfg = PipelineConfig(model_path=make_hf_model_dir(), devices="cpu")
    a = reg.retrieve_architecture(cfg.model_config.huggingface_weight_repo)
    assert a is not None and a.name == "LlamaForCausalLM"
    assert a.tokenizer_cls is TextTokenizer
    assert reg.retrieve_pipeline_task(cfg) is PipelineTask.TEXT_GENERATION
    tok = reg.retrieve_tokenizer(cfg)
    assert isinstance(tok, TextTokenizer) and tok.max_length == 256
    with pytest.raises(ValueError, match="already registered"):
        reg.register(arch())
    reg.register(arch(), allow_override=True)


def test_lookup_by_gguf_architecture():
    reg = PipelineRegistry([arch()])
    cfg = PipelineConfig(model_path=make_gguf("Q8_0"), devices="cpu")
    assert reg.retrieve_architecture(cfg.model_config.huggingface_weight_repo).name == "LlamaForCausalLM"
    tok = reg.retrieve_tokenizer(cfg)
    assert tok.eos == tok.delegate.convert_tokens_to_ids("</s>")


def test_unknown_architecture_lists_supported():
    reg = PipelineRegistry([arch(name="Qwen2ForCausalLM")])
    cfg = PipelineConfig(model_path=make_hf_model_dir(), devices="cpu")
    assert reg.retrieve_architecture(cfg.model_config.huggingface_weight_repo) is None
    with pytest.raises(ValueError, match=r"LlamaForCausalLM.*supported architectures: \['Qwen2ForCausalLM'\]"):
        reg.retrieve_pipeline_task(cfg)
    with pytest.raises(ValueError, match="Qwen2ForCausalLM"):
        reg.retrieve_tokenizer(cfg)
    with pytest.raises(ValueError, match="not registered"):
        reg.retrieve_tokenizer(cfg, override_architecture="Nope")


def test_retrieve_factory_builds_pipeline(monkeypatch):
    import max.pipelines.lib.registry as registry

    monkeypatch.setattr(registry, "get_pipeline_for_task", lambda task, cfg: DummyPipeline)
    reg = PipelineRegistry([arch()])
    cfg = PipelineConfig(model_path=make_hf_model_dir(), devices="cpu")
    tok, pipe = reg.retrieve(cfg)
    assert pipe.args[0] is cfg and pipe.args[1] is DummyModel and pipe.args[2] == tok.eos and pipe.args[4] is tok


def test_supported_architecture_validation():
    with pytest.raises(ValueError, match="default_encoding"):
        arch(default_encoding="q4_k")
    a = arch()
    assert a.default_encoding is SupportedEncoding.float32
    assert set(a.supported_encodings) == {SupportedEncoding.float32, SupportedEncoding.q8_0, SupportedEncoding.q4_0}


def test_hf_config_and_tokenizer_cache():
    reg = PipelineRegistry([])
    cfg = PipelineConfig(model_path=make_hf_model_dir(), devices="cpu")
    repo = cfg.model_config.huggingface_model_repo
    assert reg.get_active_huggingface_config(repo) is reg.get_active_huggingface_config(repo)
    assert reg.get_active_tokenizer(repo) is reg.get_active_tokenizer(repo)
    reg.reset()
    assert reg.architectures == {}


def test_register_all_models_is_tolerant():
    exists = importlib.util.find_spec("max.pipelines.architectures") is not None
    assert register_all_models() is exists


def test_config_without_architectures_uses_model_type():
    reg = PipelineRegistry([arch()])
    cfg = PipelineConfig(model_path=make_hf_model_dir(name="noarch"), devices="cpu")
    assert cfg.model_config.architectures == ["LlamaForCausalLM"]
    assert reg.retrieve_pipeline_task(cfg) is PipelineTask.TEXT_GENERATION
