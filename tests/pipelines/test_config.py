"""PipelineConfig: path resolution, encodings, CLI-like kwargs, nested configs."""

import os
from pathlib import Path

import pytest
from test_hf_utils import make_gguf, make_hf_model_dir

from max.driver import DeviceSpec
from max.graph.quantization import QuantizationEncoding
from max.graph.weights import WeightsFormat
from max.nn.kv_cache import KVCacheStrategy
from max.pipelines import PipelineConfig, SupportedEncoding
from max.pipelines.lib.config import KVCacheConfig, MAXModelConfig, parse_device_specs


def test_hf_folder_resolves():
    d = make_hf_model_dir()
    c = PipelineConfig(model_path=d, devices="cpu")
    mc = c.model_config
    assert mc.quantization_encoding is SupportedEncoding.float32
    assert [p.name for p in mc.weight_path] == ["model.safetensors"]
    assert mc.weights_format is WeightsFormat.safetensors
    assert mc.architectures == ["LlamaForCausalLM"]
    assert mc.rope_theta == 50000.0
    assert mc.max_position_embeddings == 256
    assert c.graph_quantization_encoding is None
    assert c.resolved_max_length == 256
    assert mc.device_specs == [DeviceSpec.cpu()]


def test_gguf_file_resolves_and_validates_encoding():
    p = make_gguf("Q4_0")
    c = PipelineConfig(model_path=p, quantization_encoding="q4_0")
    assert c.model_config.quantization_encoding is SupportedEncoding.q4_0
    assert c.graph_quantization_encoding is QuantizationEncoding.Q4_0
    assert c.model_config.gguf_file == c.model_config.weight_path[0]
    assert c.model_config.architectures == ["LlamaForCausalLM"]
    assert c.model_config.rope_theta == 50000.0
    assert c.model_config.source_encoding is None  # runs as stored
    for bad in ("q4_k", "q6_k", "q8_0"):
        with pytest.raises(ValueError, match=r"not contained in the weights.*they contain: \['q4_0'\].*"
                                             r"converted on load to: \['float32', 'bfloat16', 'float16'\]"):
            PipelineConfig(model_path=p, quantization_encoding=bad)
    for deq in ("float32", "bfloat16"):  # a quantised GGUF may be dequantised once at load
        c = PipelineConfig(model_path=p, quantization_encoding=deq)
        assert c.model_config.quantization_encoding is SupportedEncoding(deq)
        assert c.model_config.source_encoding is SupportedEncoding.q4_0
        assert c.model_config.weight_path == [Path(p).resolve()]


def test_float_weights_may_be_quantized_on_load():
    d = make_hf_model_dir(dtype="float32")
    c = PipelineConfig(model_path=d, quantization_encoding="q8_0")
    assert c.model_config.quantization_encoding is SupportedEncoding.q8_0
    assert c.model_config.source_encoding is SupportedEncoding.float32
    with pytest.raises(ValueError, match=r"'q4_k' is not contained.*converted on load to: \['q4_0', 'q4_1', "
                                         r"'q5_0', 'q5_1', 'q8_0'\]"):
        PipelineConfig(model_path=d, quantization_encoding="q4_k")


def test_gguf_via_weight_path_in_folder(tmp_path):
    p = make_gguf("Q8_0")
    c = PipelineConfig(model_path=os.path.dirname(p), weight_path=[os.path.basename(p)])
    assert c.model_config.quantization_encoding is SupportedEncoding.q8_0
    assert c.model_config.weight_path[0].name == os.path.basename(p)


def test_float_encoding_mismatch_and_cast_flag():
    d = make_hf_model_dir(dtype="bfloat16")
    with pytest.raises(ValueError, match=r"they contain: \['bfloat16'\].*allow_safetensors"):
        PipelineConfig(model_path=d, quantization_encoding="float32")
    c = PipelineConfig(model_path=d, quantization_encoding="float32",
                       allow_safetensors_weights_fp32_bf6_bidirectional_cast="true")
    assert c.model_config.quantization_encoding is SupportedEncoding.float32
    assert [p.name for p in c.model_config.weight_path] == ["model.safetensors"]
    with pytest.raises(ValueError, match="not contained"):
        PipelineConfig(model_path=d, quantization_encoding="q4_k")


def test_bad_folders(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        PipelineConfig(model_path=str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(FileNotFoundError, match="no weight files"):
        PipelineConfig(model_path=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        PipelineConfig(model_path=str(tmp_path / "missing.gguf"))
    (tmp_path / "notgguf.bin2").write_text("x")
    with pytest.raises(ValueError, match="not a GGUF file"):
        PipelineConfig(model_path=str(tmp_path / "notgguf.bin2"))
    with pytest.raises(ValueError, match="model_path is required"):
        PipelineConfig()
    with pytest.raises(FileNotFoundError, match="weight file"):
        PipelineConfig(model_path=make_hf_model_dir(), weight_path=["nope.safetensors"])


def test_cli_like_kwargs_and_routing():
    d = make_hf_model_dir()
    c = PipelineConfig(**{
        "model-path": d, "max-length": "128", "max-batch-size": "4", "devices": "cpu",
        "kv-cache-page-size": "64", "device-memory-utilization": "0.5", "enable-prefix-caching": "true",
        "cache-strategy": "paged", "prefill-chunk-size": "32", "enable-chunked-prefill": "false",
        "quantization-encoding": "FP32", "max_seq_len": 100, "enable_penalties": "1",
    })
    assert c.max_length == 100 and c.max_batch_size == 4 and c.prefill_chunk_size == 32
    assert c.enable_chunked_prefill is False
    kv = c.kv_cache_config
    assert kv.kv_cache_page_size == 64 and kv.device_memory_utilization == 0.5 and kv.enable_prefix_caching
    assert kv.cache_strategy is KVCacheStrategy.PAGED
    assert c.model_config.kv_cache_config is kv
    assert c.sampling_config.enable_penalties is True
    assert c.kv_cache_page_size == 64 and c.model_path == d  # flat read access
    assert "quantization_encoding" in PipelineConfig.help() and "kv_cache_page_size" in PipelineConfig.help()


def test_validation_errors():
    d = make_hf_model_dir()
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        PipelineConfig(model_path=d, bogus=1)
    with pytest.raises(ValueError, match="max_length"):
        PipelineConfig(model_path=d, max_length=10_000)  # > max_position_embeddings 256
    with pytest.raises(ValueError, match="max_batch_size"):
        PipelineConfig(model_path=d, max_batch_size=0)
    with pytest.raises(ValueError, match="expected an int"):
        PipelineConfig(model_path=d, max_batch_size="four")
    with pytest.raises(ValueError, match="device_memory_utilization"):
        PipelineConfig(model_path=d, device_memory_utilization=1.5)
    with pytest.raises(ValueError, match="Unknown quantization encoding"):
        PipelineConfig(model_path=d, quantization_encoding="int2")
    with pytest.raises(ValueError, match="per-request"):
        PipelineConfig(model_path=d, max_new_tokens=5)


def test_nested_objects_and_chat_template(tmp_path):
    d = make_hf_model_dir()
    t = tmp_path / "tmpl.jinja"
    t.write_text("{{ messages[0]['content'] }}")
    c = PipelineConfig(model_config=MAXModelConfig(model_path=d, device_specs=[DeviceSpec.cpu()]),
                       kv_cache_config=KVCacheConfig(kv_cache_page_size=16), chat_template=str(t))
    assert c.kv_cache_config.kv_cache_page_size == 16
    assert c.retrieve_chat_template() == "{{ messages[0]['content'] }}"
    with pytest.raises(FileNotFoundError):
        PipelineConfig(model_path=d, chat_template=str(tmp_path / "missing.jinja"))


def test_device_parsing():
    assert parse_device_specs("cpu") == [DeviceSpec.cpu()]
    assert parse_device_specs("gpu:0,1") == [DeviceSpec.accelerator(0), DeviceSpec.accelerator(1)]
    with pytest.raises(ValueError):
        parse_device_specs("tpu")
