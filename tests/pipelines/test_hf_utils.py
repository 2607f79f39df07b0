"""hf_utils (offline repos, encodings, configs) + shared builders of tiny local artifacts.

The ``make_*`` helpers below are imported by the other tests in this folder.
"""

import functools
import glob
import json
import os
import tempfile

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from max.graph.weights import WeightsFormat  # noqa: E402
from max.pipelines.lib import hf_utils  # noqa: E402
from max.pipelines.lib.hf_utils import (  # noqa: E402
    HuggingFaceRepo,
    RepoType,
    SupportedEncoding,
    generate_local_model_path,
    get_rope_parameters,
    get_rope_theta,
    load_generation_config,
    load_huggingface_config,
    try_to_load_from_cache,
    validate_hf_repo_access,
)

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<pad>"]


@functools.lru_cache(maxsize=None)
def _root() -> str:
    return tempfile.mkdtemp(prefix="libremax-pipelines-")


@functools.lru_cache(maxsize=None)
def make_bpe_tokenizer() -> str:
    """A byte-level BPE (vocab 512) trained on stdlib sources; returns its folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))[:15]
    text = [open(f, encoding="utf-8", errors="ignore").read() for f in files]
    text.append("Ünïcödé ñ 日本語 한국어 🤖 Ωμέγα Привет")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    bpe.train_from_iterator(text, trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL, show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  chat_template=CHAT_TEMPLATE)
    d = os.path.join(_root(), "tokenizer")
    tok.save_pretrained(d)
    return d


def _tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(make_bpe_tokenizer())


def llama_config(vocab: int = 512, **kw):
    from transformers import LlamaConfig

    t = _tok()
    args = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, rope_theta=50000.0, tie_word_embeddings=False,
                bos_token_id=t.bos_token_id, eos_token_id=t.eos_token_id, pad_token_id=t.pad_token_id)
    args.update(kw)
    return LlamaConfig(**args)


@functools.lru_cache(maxsize=None)
def make_hf_model_dir(name: str = "llama", dtype: str = "float32", weights: str = "safetensors",
                      with_tokenizer: bool = True, generation_eos: tuple = ()) -> str:
    """A folder with config.json, random weights (a few tensors) and the tiny tokenizer."""
    from safetensors.torch import save_file

    d = os.path.join(_root(), f"{name}-{dtype}-{weights}-{with_tokenizer}-{len(generation_eos)}")
    os.makedirs(d, exist_ok=True)
    cfg = llama_config(architectures=["LlamaForCausalLM"] if name == "llama" else None)
    cfg.save_pretrained(d)
    tdt = getattr(torch, dtype)
    sd = {"model.embed_tokens.weight": torch.randn(512, 64).to(tdt), "model.norm.weight": torch.ones(64, dtype=tdt)}
    if weights == "safetensors":
        save_file(sd, os.path.join(d, "model.safetensors"))
    elif weights == "bin":
        torch.save(sd, os.path.join(d, "pytorch_model.bin"))
    if with_tokenizer:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(make_bpe_tokenizer()).save_pretrained(d)
    if generation_eos:
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump({"eos_token_id": list(generation_eos), "bos_token_id": 3}, f)
    return d


@functools.lru_cache(maxsize=None)
def make_gguf(qtype: str = "Q8_0", with_tokenizer: bool = True, add_bos: bool = False, arch: str = "llama",
              tie: bool = True, chat_template: bool = True) -> str:
    """A tiny GGUF file (llama layout, vocab 512) with an optional byte-level BPE vocabulary."""
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFWriter, quants

    q = T[qtype]
    path = os.path.join(_root(), f"tiny-{arch}-{qtype}-{with_tokenizer}-{add_bos}-{tie}-{chat_template}.gguf")
    cfg = llama_config()
    w = GGUFWriter(path, arch)
    w.add_name("tiny")
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(50000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(512)
    w.add_rope_dimension_count(16)
    w.add_file_type({"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8}.get(qtype, 7))
    if with_tokenizer:
        t = _tok()
        tj = json.loads(t.backend_tokenizer.to_str())
        tokens = [k for k, _ in sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])]
        special = {a["content"] for a in tj["added_tokens"]}
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types([3 if x in special else 1 for x in tokens])
        w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
        w.add_bos_token_id(t.bos_token_id)
        w.add_eos_token_id(t.eos_token_id)
        w.add_pad_token_id(t.pad_token_id)
        w.add_add_bos_token(add_bos)
        if chat_template:
            w.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(0)

    def put(name, a):
        if a.ndim == 2 and q not in (T.F32,):
            w.add_tensor(name, quants.quantize(a, q), raw_dtype=q)
        else:
            w.add_tensor(name, a.astype(np.float32))

    put("token_embd.weight", rng.standard_normal((512, 64)).astype(np.float32))
    put("blk.0.attn_q.weight", rng.standard_normal((64, 64)).astype(np.float32))
    put("output_norm.weight", np.ones(64, np.float32))
    if not tie:
        put("output.weight", rng.standard_normal((512, 64)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    del gguf, cfg
    return path


# --------------------------------------------------------------------------- tests


def test_local_repo_weight_files_and_encodings():
    d = make_hf_model_dir(dtype="bfloat16")
    r = HuggingFaceRepo(d)
    assert r.repo_type is RepoType.local
    assert r.weight_files == {WeightsFormat.safetensors: ["model.safetensors"]}
    assert r.supported_encodings == [SupportedEncoding.bfloat16]
    assert r.files_for_encoding(SupportedEncoding.bfloat16)[WeightsFormat.safetensors][0].name == "model.safetensors"
    assert r.files_for_encoding(SupportedEncoding.float32) == {}
    assert r.file_exists("config.json") and not r.file_exists("nope.json")
    assert r.size_of("model.safetensors") > 0 and r.size_of("nope") is None
    assert "config.json" in [s.rfilename for s in r.info.siblings]


def test_pytorch_bin_encoding_from_config():
    d = make_hf_model_dir(weights="bin")
    r = HuggingFaceRepo(d)
    assert r.weight_files == {WeightsFormat.pytorch: ["pytorch_model.bin"]}
    assert r.supported_encodings == [SupportedEncoding.float32]


def test_gguf_file_repo():
    p = make_gguf("Q4_0")
    r = HuggingFaceRepo(p)
    assert r.single_file is not None and r.weight_files == {WeightsFormat.gguf: [os.path.basename(p)]}
    assert r.supported_encodings == [SupportedEncoding.q4_0]
    assert r.encoding_for_file(p) is SupportedEncoding.q4_0


def test_encoding_parse():
    assert SupportedEncoding.parse("Q4_K") is SupportedEncoding.q4_k
    assert SupportedEncoding.parse("bf16") is SupportedEncoding.bfloat16
    assert SupportedEncoding.parse("q4_k_m") is SupportedEncoding.q4_k
    from max.graph.quantization import QuantizationEncoding
    assert SupportedEncoding.q6_k.quantization_encoding is QuantizationEncoding.Q6_K
    assert SupportedEncoding.float32.quantization_encoding is None
    with pytest.raises(ValueError, match="Unknown quantization encoding"):
        SupportedEncoding.parse("int3")


def test_cache_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError):
        generate_local_model_path("org/model", "main")
    with pytest.raises(ValueError, match="not available offline"):
        validate_hf_repo_access("org/model", "main")
    snap = tmp_path / "models--org--model" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (tmp_path / "models--org--model" / "refs").mkdir()
    (tmp_path / "models--org--model" / "refs" / "main").write_text("abc123")
    (snap / "config.json").write_text("{}")
    assert generate_local_model_path("org/model", "abc123") == str(snap)
    assert generate_local_model_path("org/model", "main") == str(snap)
    validate_hf_repo_access("org/model", "main")
    assert try_to_load_from_cache("org/model", "config.json", "main") == str(snap / "config.json")
    assert try_to_load_from_cache("org/model", "missing.json", "main") is None
    with pytest.raises(ValueError, match="Cached revisions"):
        validate_hf_repo_access("org/model", "other")
    r = HuggingFaceRepo("org/model")
    assert r.repo_type is RepoType.online and r.local_path == snap


def test_missing_path_errors():
    with pytest.raises(ValueError, match="does not exist"):
        validate_hf_repo_access("/definitely/not/here.gguf", "main")


def test_rope_theta_both_layouts():
    assert get_rope_theta({"rope_theta": 123.0}) == 123.0
    assert get_rope_theta({"rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}) == 5e5
    per_type = {"rope_parameters": {"sliding_attention": {"rope_theta": 1e4, "rope_type": "default"},
                                    "full_attention": {"rope_theta": 1e6, "rope_type": "linear", "factor": 8.0}}}
    rp = get_rope_parameters(per_type)
    assert rp["rope_theta"] == 1e6 and rp["rope_type"] == "linear" and rp["factor"] == 8.0
    legacy = {"rope_theta": 5e5, "rope_scaling": {"type": "llama3", "factor": 8.0}}
    assert get_rope_parameters(legacy)["rope_type"] == "llama3"
    assert get_rope_theta({}) == 10000.0
    cfg = load_huggingface_config(make_hf_model_dir())
    assert get_rope_theta(cfg) == 50000.0  # transformers 5 stores it in rope_parameters


def test_gguf_config_matches_transformers():
    from transformers import AutoConfig

    p = make_gguf("Q8_0", tie=False)
    mine = load_huggingface_config(p)
    ref = AutoConfig.from_pretrained(os.path.dirname(p), gguf_file=os.path.basename(p))
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "max_position_embeddings", "vocab_size", "head_dim", "tie_word_embeddings", "bos_token_id",
              "eos_token_id"):
        assert getattr(mine, k) == getattr(ref, k), k
    assert get_rope_theta(mine) == get_rope_theta(ref) == 50000.0
    assert abs(mine.rms_norm_eps - ref.rms_norm_eps) < 1e-9
    assert mine.architectures == ["LlamaForCausalLM"]


def test_generation_config():
    d = make_hf_model_dir(generation_eos=(4, 2))
    g = load_generation_config(d)
    assert list(g.eos_token_id) == [4, 2]
    assert hf_utils.eos_token_ids_from_configs(g, {"eos_token_id": 7}, None) == {2, 4, 7}
    assert load_generation_config(make_hf_model_dir()) is None


def test_download_weight_files_offline():
    d = make_hf_model_dir()
    assert [p.name for p in hf_utils.download_weight_files(d, ["model.safetensors"])] == ["model.safetensors"]
    with pytest.raises(FileNotFoundError):
        hf_utils.download_weight_files(d, ["model-00002.safetensors"])
    with pytest.raises(ValueError, match="network"):
        hf_utils.download_weight_files(d, ["model.safetensors"], force_download=True)
