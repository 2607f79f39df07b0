"""Cross-encoders (rerankers): ``BertForSequenceClassification`` and ``XLMRobertaForSequenceClassification``
on the BERT encoder, checked against Hugging Face transformers on the same tiny random weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lm_support import make_tiny_cross_encoder

from max.pipelines.lib.embeddings_pipeline import load_embeddings_pipeline

QUERY = "the cat sat on the mat"
DOCS = ["a dog sat on a mat", "hello world", "good morning sun", "the cat was on the mat with a dog and a cat",
        "it is"]


def _reference(path: str, pairs: list[tuple[str, str]], roberta: bool) -> np.ndarray:
    import transformers

    cls = (transformers.XLMRobertaForSequenceClassification if roberta else
           transformers.BertForSequenceClassification)
    model = cls.from_pretrained(path, torch_dtype=torch.float64).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    enc = tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits.numpy()
    if logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits[:, 0]))
    return np.exp(logits[:, 1]) / np.exp(logits).sum(axis=1)


@pytest.mark.parametrize("kind,num_labels", [("bert", 1), ("bert", 2), ("xlm-roberta", 1)])
def test_scores_match_transformers(tmp_path, kind, num_labels):
    path = make_tiny_cross_encoder(str(tmp_path), kind, num_labels)
    pipe = load_embeddings_pipeline(path, devices="cpu", max_batch_size=3)  # padded batches of several lengths
    assert pipe.cross_encoder
    pairs = [(QUERY, d) for d in DOCS] + [("hello", "world")]
    scores, n_tokens = pipe.score_pairs(pairs)
    ref = _reference(path, pairs, kind == "xlm-roberta")
    np.testing.assert_allclose(scores, ref, rtol=0, atol=2e-5)
    assert np.ptp(ref) > 1e-3  # the pairs are told apart (not a constant)
    alone = np.array([pipe.score_pairs([p])[0][0] for p in pairs[:2]])
    np.testing.assert_allclose(alone, scores[:2], rtol=0, atol=1e-6)  # batching changes nothing
    assert n_tokens > 2 * len(pairs)
    with pytest.raises(ValueError, match="cross-encoder"):
        pipe.encode_texts(["hello"])
    with pytest.raises(ValueError, match="more than this model's maximum input length"):
        pipe.score_pairs([(QUERY, " ".join(["cat"] * 70))])
    with pytest.raises(TypeError, match="two strings"):
        pipe.score_pairs([(QUERY,)])


def test_three_labels_are_refused(tmp_path):
    path = make_tiny_cross_encoder(str(tmp_path), "bert", 3)
    with pytest.raises(ValueError, match="1 label .* or 2"):
        load_embeddings_pipeline(path, devices="cpu")
