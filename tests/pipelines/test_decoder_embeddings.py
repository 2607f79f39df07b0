"""Decoder embedding models (Qwen3-Embedding style) through EmbeddingsPipeline against transformers' base
model on the same random weights: last-token (and mean) pooling, L2 normalisation, ragged batches."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from family_support import DIMS  # noqa: E402
from test_hf_utils import make_bpe_tokenizer  # noqa: E402

TEXTS = ["def forward(self, x):", "import os", "return the hidden states of every layer", "x"]


def _folder(tmp_path, causal: bool, pooling: str | None):
    tok = transformers.AutoTokenizer.from_pretrained(make_bpe_tokenizer())
    cfg = transformers.Qwen3Config(**DIMS, head_dim=16, vocab_size=len(tok), tie_word_embeddings=True)
    torch.manual_seed(0)
    cls = transformers.AutoModelForCausalLM if causal else transformers.AutoModel
    model = cls.from_config(cfg).eval().float()
    d = tmp_path / f"qwen3-emb-{causal}-{pooling}"
    model.save_pretrained(d)
    tok.save_pretrained(d)
    if pooling is not None:
        (d / "1_Pooling").mkdir()
        (d / "1_Pooling" / "config.json").write_text(json.dumps({f"pooling_mode_{pooling}": True}))
        (d / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    base = transformers.AutoModel.from_pretrained(d, dtype=torch.float32).eval()
    return d, base, tok


def _reference(base, tok, texts, pooling):
    out = []
    for t in texts:
        ids = tok(t)["input_ids"]
        with torch.no_grad():
            h = base(torch.tensor([ids])).last_hidden_state[0].double()
        v = h[-1] if pooling == "lasttoken" else h.mean(0)
        out.append((v / v.norm()).numpy())
    return np.stack(out)


@pytest.mark.parametrize("causal,pooling", [(False, None), (True, "lasttoken"), (True, "mean_tokens")])
def test_qwen3_embeddings_match_transformers(tmp_path, causal, pooling):
    from max.pipelines.lib.embeddings_pipeline import load_embeddings_pipeline

    d, base, tok = _folder(tmp_path, causal, pooling)
    pipe = load_embeddings_pipeline(str(d), max_batch_size=4)
    assert type(pipe.pipeline_model).__name__ == "Qwen3EmbeddingModel"
    vecs, n_tokens = pipe.encode_texts(TEXTS)
    ref = _reference(base, tok, TEXTS, "mean" if pooling == "mean_tokens" else "lasttoken")
    np.testing.assert_allclose(vecs, ref, rtol=0, atol=2e-5)
    assert n_tokens == sum(len(tok(t)["input_ids"]) for t in TEXTS)
    alone = np.stack([pipe.encode_texts([t])[0][0] for t in TEXTS])
    np.testing.assert_allclose(alone, vecs, atol=2e-5)
    mgr = pipe.pipeline_model.kv_manager
    assert mgr.num_free_pages == mgr.total_num_pages


def test_causal_lm_without_sentence_transformers_files_is_not_an_embedder(tmp_path):
    from max.pipelines.lib.embeddings_pipeline import load_embeddings_pipeline

    d, _, _ = _folder(tmp_path, True, None)
    with pytest.raises(ValueError, match="Qwen3ForCausalLM is a text-generation model"):
        load_embeddings_pipeline(str(d))
    _ = os


def test_mpnet_embeddings_match_transformers(tmp_path):
    """MPNet (relative-position buckets, positions after the padding index) mean-pooled and normalised."""
    from max.pipelines.lib.embeddings_pipeline import load_embeddings_pipeline

    tok = transformers.AutoTokenizer.from_pretrained(make_bpe_tokenizer())
    cfg = transformers.MPNetConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=96, max_position_embeddings=160, pad_token_id=tok.pad_token_id,
                                   relative_attention_num_buckets=32)
    torch.manual_seed(0)
    model = transformers.MPNetModel(cfg, add_pooling_layer=False).eval()
    d = tmp_path / "mpnet"
    model.save_pretrained(d)
    tok.save_pretrained(d)
    pipe = load_embeddings_pipeline(str(d), max_batch_size=4)
    long_text = " ".join(["attention is all you need"] * 10)  # ~140 tokens: the far relative buckets
    texts = TEXTS + [long_text]
    vecs, _ = pipe.encode_texts(texts)
    ref = []
    for t in texts:
        with torch.no_grad():
            h = model(torch.tensor([tok(t)["input_ids"]])).last_hidden_state[0].double().mean(0)
        ref.append((h / h.norm()).numpy())
    np.testing.assert_allclose(vecs, np.stack(ref), rtol=0, atol=2e-5)
