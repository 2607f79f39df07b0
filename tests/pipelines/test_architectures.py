"""The architecture folders and what they share: discovery, the one GGUF -> config translation, the
weight factory (every checkpoint weight of every family goes through it), the dtype policy, and the
loader's errors."""

from __future__ import annotations

import importlib
import os
import pkgutil

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from family_support import FAMILIES, tiny_family  # noqa: E402

from max.dtype import DType  # noqa: E402
from max.graph import DeviceRef  # noqa: E402


def test_every_folder_registers_its_architectures():
    import max.pipelines.architectures as pkg
    from max.pipelines import PIPELINE_REGISTRY, register_all_models

    register_all_models()
    folders = [m.name for m in pkgutil.iter_modules(pkg.__path__) if m.ispkg and m.name != "common"]
    assert {"llama3", "mistral", "qwen2", "qwen3", "bert"} <= set(folders)
    components = {"mimi"}  # a folder other architectures use (CSM's audio codec): no architecture of its own
    for name in folders:
        archs = importlib.import_module(f"{pkg.__name__}.{name}").ARCHITECTURES
        assert archs or name in components, name
        for a in archs:
            assert PIPELINE_REGISTRY.architectures[a.name] is a


def _write_gguf(path, arch: str, with_optional: bool) -> str:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_vocab_size(32)
    if with_optional:
        w.add_context_length(512)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(5e5)
    w.add_tensor("token_embd.weight", np.zeros((32, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("with_optional", [True, False])
def test_gguf_translation_agrees_with_transformers(tmp_path, arch, with_optional):
    """Keys a file lacks take the config class's defaults, exactly as transformers reads the file
    (no second set of defaults: llama gets 1e-6 / 2048, qwen2 1e-6 / 32768)."""
    from transformers import AutoConfig

    from max.pipelines.lib.hf_utils import get_rope_theta, load_huggingface_config

    p = _write_gguf(tmp_path / f"{arch}.gguf", arch, with_optional)
    mine = load_huggingface_config(p)
    ref = AutoConfig.from_pretrained(str(tmp_path), gguf_file=os.path.basename(p))
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "max_position_embeddings", "vocab_size", "rms_norm_eps", "model_type"):
        assert getattr(mine, k) == getattr(ref, k), k
    assert get_rope_theta(mine) == get_rope_theta(ref)
    if with_optional:
        assert (mine.max_position_embeddings, get_rope_theta(mine)) == (512, 5e5)
        assert mine.rms_norm_eps == pytest.approx(1e-5)


def test_gguf_architecture_map_is_built_from_the_folders():
    from max.pipelines.lib.registry import gguf_architectures

    m = gguf_architectures()
    assert sorted(a.name for a in m["llama"]) == ["LlamaForCausalLM", "MixtralForCausalLM"]
    assert [a.name for a in m["qwen2"]] == ["Qwen2ForCausalLM"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_checkpoint_weight_comes_from_the_factory(family):
    from max.nn import Embedding, Linear
    from max.nn.layer import recursive_named_layers
    from max.pipelines import PIPELINE_REGISTRY, register_all_models
    from max.pipelines.architectures.common.model import kv_params_for
    from max.pipelines.architectures.common.weights import WeightFactory

    register_all_models()
    _, hf, _ = tiny_family(family)
    cls = PIPELINE_REGISTRY.architectures[type(hf).__name__].pipeline_model
    cfg = cls.config_from_hf(hf.config.to_dict())
    factory = WeightFactory(DType.float32, DeviceRef.CPU())
    module = cls.build_module(cfg, factory, kv_params_for(cfg, DType.float32), 64)
    made = {id(m) for m in factory.created.values()}
    for path, layer in recursive_named_layers(module):
        if isinstance(layer, (Linear, Embedding)):
            assert id(layer) in made, f"{family}: {path} was not made by the weight factory"
            assert factory.created[path] is layer
    from max.graph.weights import WeightsFormat, load_weights

    d, _, _ = tiny_family(family)
    adapted = cls.weight_adapters[WeightsFormat.safetensors](dict(load_weights([f"{d}/model.safetensors"]).items()))
    assert set(module.raw_state_dict()) == set(adapted)


def test_compute_dtype_policy():
    """The backend policy (max.engine.backend) decides weight storage and compute dtype; the
    families' helpers ask it."""
    from max.engine import backend
    from max.pipelines.architectures.common.weights import compute_dtype, keeps_quantized, storage_dtype
    from max.pipelines.lib.hf_utils import SupportedEncoding as E

    cpu, gpu = DeviceRef.CPU(), DeviceRef.GPU()
    try:
        # with the native CPU kernels: float32 compute; half-precision and GGML weights stay as they are
        backend.use(backend.BackendPolicy(native=True, isa="avx2"))
        assert compute_dtype(E.bfloat16, cpu) == DType.float32 and storage_dtype(E.bfloat16, cpu) == DType.bfloat16
        assert storage_dtype(E.float16, cpu) == DType.float16 and storage_dtype(E.float32, cpu) == DType.float32
        assert keeps_quantized(E.q4_k, cpu) and not keeps_quantized(E.q4_k, gpu)
        assert not keeps_quantized(E.bfloat16, cpu)
        # without them (no C compiler): the dequantise/widen-at-load policy
        backend.use(backend.BackendPolicy(native=False, isa=None))
        assert not keeps_quantized(E.q4_k, cpu)
        for bf16_cpu, want in ((False, DType.float32), (True, DType.bfloat16)):
            backend.use(backend.BackendPolicy(native=False, isa=None, cpu_bf16=bf16_cpu))
            assert compute_dtype(E.bfloat16, cpu) == want == storage_dtype(E.bfloat16, cpu)
        assert compute_dtype(E.float32, cpu) == DType.float32
        assert compute_dtype(E.float16, cpu) == DType.float32
        assert compute_dtype(E.q4_k, cpu) == DType.float32
        assert compute_dtype(E.q4_k, gpu) == DType.bfloat16
        assert compute_dtype(E.float16, gpu) == DType.float16
    finally:
        backend.use(None)
    assert compute_dtype(E.bfloat16, gpu) == DType.bfloat16


def test_loader_names_missing_and_unused_tensors():
    from max.nn import Module
    from max.pipelines.architectures.common.weights import WeightFactory, load_weights_into

    f = WeightFactory(DType.float32, DeviceRef.CPU())
    m = Module()
    m.proj = f.linear("proj", 4, 3)
    with pytest.raises(ValueError, match=r"no tensor for \['proj.weight'\].*does not use: \['extra'\]"):
        load_weights_into(m, {"extra": np.zeros(3, np.float32)}, "Tiny")
    with pytest.raises(ValueError, match=r"'proj.weight' has shape \[4, 3\], the model expects \[3, 4\]"):
        load_weights_into(m, {"proj.weight": np.zeros((4, 3), np.float32)}, "Tiny")
    load_weights_into(m, {"proj.weight": np.ones((3, 4), np.float64)}, "Tiny")  # cast to the model's dtype
    assert m.state_dict()["proj.weight"].dtype == DType.float32  # a Buffer (MAX 26.7)


def test_factory_rejects_a_module_not_placed_at_its_name():
    from max.nn import Module
    from max.pipelines.architectures.common.weights import WeightFactory

    f = WeightFactory(DType.float32, DeviceRef.CPU())
    m = Module()
    m.other = f.linear("proj", 4, 3)
    with pytest.raises(RuntimeError, match="proj"):
        f.check_paths(m)


def test_mla_cache_holds_only_the_latent():
    """DeepSeek-V2's paged cache stores kv_lora_rank + qk_rope_head_dim values per token and layer (split
    across the K and V planes), not per-head keys and values."""
    from family_support import family_llm

    llm = family_llm("deepseek_v2")
    pm = llm.pipeline.pipeline_model
    e = pm.config.extra
    assert pm.kv_params.bytes_per_token(1) == (e["kv_lora_rank"] + e["qk_rope_head_dim"]) * 4
