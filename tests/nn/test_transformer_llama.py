"""The Llama-family decoder (AttentionWithRope + TransformerBlock + Transformer over the paged KV cache)
against Hugging Face transformers on the same random weights: prefill and decode, ragged batches."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from max.driver import CPU, Buffer  # noqa: E402
from max.dtype import DType  # noqa: E402
from max.engine import InferenceSession  # noqa: E402
from max.graph import DeviceRef  # noqa: E402
from max.nn.kv_cache import PagedKVCacheManager  # noqa: E402
from max.pipelines.architectures.common.layers import build_decoder  # noqa: E402
from max.pipelines.architectures.common.model import build_graph, kv_params_for  # noqa: E402
from max.pipelines.architectures.common.weights import WeightFactory  # noqa: E402
from test_kv_cache_context import FakeContext  # noqa: E402

VOCAB = 96


def _hf_model(kind: str):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**common, rope_theta=10000.0, tie_word_embeddings=False)
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(**common, rope_theta=1e6, tie_word_embeddings=True)
    elif kind == "qwen3":
        cfg = transformers.Qwen3Config(**common, head_dim=16, rope_theta=1e6, tie_word_embeddings=True)
    else:
        cfg = transformers.MistralConfig(**common, rope_theta=10000.0, sliding_window=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(cfg).eval().float()
    if kind == "qwen2":  # make the q/k/v biases matter
        with torch.no_grad():
            for layer in m.model.layers:
                for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    p.bias.normal_(0, 0.5)
    return m


def _weights(hf) -> dict:
    sd = {k.removeprefix("model."): v.detach().float().numpy() for k, v in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:  # the lm_head shares the embedding's table
        sd.pop("lm_head.weight", None)
    return sd


class _Runner:
    def __init__(self, hf, page_size=16):
        from max.pipelines import PIPELINE_REGISTRY, register_all_models

        register_all_models()
        arch = PIPELINE_REGISTRY.architectures[type(hf).__name__]
        self.cfg = arch.pipeline_model.config_from_hf(hf.config.to_dict())
        dev = DeviceRef.CPU()
        kvp = kv_params_for(self.cfg, DType.float32, page_size=page_size, enable_prefix_caching=True)
        model = build_decoder(self.cfg, WeightFactory(DType.float32, dev), kvp, max_seq_len=256)
        self.mgr = PagedKVCacheManager(kvp, max_batch_size=8, max_seq_len=256, num_layers=self.cfg.num_hidden_layers,
                                       devices=[CPU()], total_num_pages=64)
        graph = build_graph(model, self.mgr.input_symbols()[0], dev)
        weights = _weights(hf)
        model.load_state_dict(weights, strict=True)
        self.model = InferenceSession().load(graph, weights_registry=model.state_dict())

    def step(self, ctxs):
        kv = self.mgr.fetch(ctxs)[0]
        toks = [c.next_tokens for c in ctxs]
        offsets = np.cumsum([0] + [len(t) for t in toks]).astype(np.uint32)
        out = self.model.execute(Buffer.from_numpy(np.concatenate(toks).astype(np.int64)),
                                 Buffer.from_numpy(offsets), Buffer.from_numpy(np.array([1], np.int64)), *kv)
        return out[0].to_numpy()


def _hf_next_logits(hf, seq):
    with torch.no_grad():
        return hf(torch.tensor([seq])).logits[0, -1].double().numpy()


def _close(ours, ref):
    span = ref.max() - ref.min()
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-4 * span)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral"])
def test_prefill_and_decode_match_transformers(kind):
    hf = _hf_model(kind)
    r = _Runner(hf)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, VOCAB, n).tolist() for n in (7, 20, 1)]  # ragged batch, crosses a page
    ctxs = [FakeContext(f"r{i}", p) for i, p in enumerate(prompts)]
    for c in ctxs:
        r.mgr.claim(c.request_id)
    seqs = [list(p) for p in prompts]
    for step in range(4):
        logits = r.step(ctxs)
        assert logits.shape == (len(ctxs), VOCAB) and logits.dtype == np.float32
        for b, c in enumerate(ctxs):
            _close(logits[b], _hf_next_logits(hf, seqs[b]))
            tok = int(np.argmax(logits[b]))
            seqs[b].append(tok)
            c.update(tok) if hasattr(c, "update") else _advance(c, tok)
        r.mgr.step(ctxs)
    for c in ctxs:
        r.mgr.release(c.request_id)
    r.mgr.check_invariants() if hasattr(r.mgr, "check_invariants") else None


def _advance(ctx, tok):
    ctx.tokens[ctx.end_idx] = tok
    ctx.bump_token_indices(start_idx=ctx.active_idx - ctx.start_idx, active_idx=1, end_idx=1)


def test_batched_equals_alone_and_prefix_cache_reuse():
    hf = _hf_model("llama")
    rng = np.random.default_rng(1)
    shared = rng.integers(0, VOCAB, 40).tolist()
    a, b = shared + [1, 2, 3], shared + [4, 5]
    alone = []
    for p in (a, b):
        r = _Runner(hf)
        c = FakeContext("x", p)
        r.mgr.claim("x")
        alone.append(r.step([c])[0])
    r = _Runner(hf)
    ca, cb = FakeContext("a", a), FakeContext("b", b)
    r.mgr.claim("a")
    out_a = r.step([ca])[0]
    r.mgr.step([ca])
    r.mgr.claim("b")
    out_b = r.step([cb])[0]  # its first 32 tokens (2 full pages) come from the prefix cache
    assert cb.start_idx >= 32 or r.mgr.prefix_cache_hits if hasattr(r.mgr, "prefix_cache_hits") else True
    _close(out_a, alone[0])
    _close(out_b, alone[1])
