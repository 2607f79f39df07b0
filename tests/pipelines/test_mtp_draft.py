"""DeepSeek-V3's multi-token prediction layer as the draft of speculative decoding
(``speculative_method="mtp"``), on a tiny random checkpoint with one MTP layer (``model.layers.2.*``
added to the file: transformers neither saves nor runs it).

(a) The MTP layer's math against a float64 torch reference written from the DeepSeek-V3 report
(``eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)])``, one decoder layer, shared head norm and head; the
decoder layer is transformers' ``DeepseekV3DecoderLayer`` on the same weights in float64), over two
cached chunks and batched; the target's returned hidden states equal transformers' final-norm output.
(b) Greedy output with the MTP draft identical to no draft, alone and batched; acceptance counted;
every page of both caches freed; clear errors for a checkpoint without an MTP layer."""

from __future__ import annotations

import copy
import functools
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nn"))

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from family_support import FAMILIES, DIMS, assert_close, hf_greedy  # noqa: E402
from test_hf_utils import make_bpe_tokenizer  # noqa: E402

N = DIMS["num_hidden_layers"]  # the MTP layer is checkpoint layer N


def _rand_(t, std=0.3):
    with torch.no_grad():
        t.normal_(0, std)


@functools.lru_cache(maxsize=None)
def tiny_mtp() -> tuple[str, str, object, object, dict]:
    """``(dir with MTP, dir without, hf model, hf model whose layer N is the MTP decoder layer, the MTP's
    own float64 tensors by name)``."""
    from safetensors.torch import load_file, save_file

    make_config, tweak = FAMILIES["deepseek_v3"]
    tok = transformers.AutoTokenizer.from_pretrained(make_bpe_tokenizer())
    ids = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id)
    cfg = make_config({**DIMS, **ids})
    cfg.num_nextn_predict_layers = 1
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval().float()
    tweak(model)
    _damp(model)
    # the MTP's decoder layer: layer N (MoE: N >= first_k_dense_replace) of a model one layer deeper
    src_cfg = copy.deepcopy(cfg)
    src_cfg.num_hidden_layers = N + 1
    torch.manual_seed(1)
    src = transformers.AutoModelForCausalLM.from_config(src_cfg).eval().float()
    tweak(src)
    _damp(src)
    base = tempfile.mkdtemp(prefix="libremax-mtp-")
    src.save_pretrained(os.path.join(base, "src"))
    saved = load_file(os.path.join(base, "src", "model.safetensors"))
    layer = {k: v for k, v in saved.items() if k.startswith(f"model.layers.{N}.")}
    H, V = cfg.hidden_size, cfg.vocab_size
    g = torch.Generator().manual_seed(2)
    # the draft sees mostly the next token's embedding and its head is close to lm_head: it predicts the
    # token after next about as the (damped, nearly bigram) target predicts the next one, so drafts are
    # accepted; every part still contributes
    rnd = lambda *shape, std: torch.randn(*shape, generator=g) * std  # noqa: E731
    own = {"enorm.weight": 1.0 + rnd(H, std=0.05), "hnorm.weight": 1.0 + rnd(H, std=0.3),
           "eh_proj.weight": torch.cat([torch.eye(H) + rnd(H, H, std=0.02), rnd(H, H, std=0.05)], 1),
           "shared_head.norm.weight": 1.0 + rnd(H, std=0.05),
           "shared_head.head.weight": model.lm_head.weight.detach() + rnd(V, H, std=0.02)}
    with_mtp, without = os.path.join(base, "mtp"), os.path.join(base, "plain")
    for d in (with_mtp, without):
        model.save_pretrained(d)
        tok.save_pretrained(d)
    f = os.path.join(with_mtp, "model.safetensors")
    state = load_file(f)
    state.update(layer)  # embed_tokens left out: the main model's
    state.update({f"model.layers.{N}.{k}": v.contiguous() for k, v in own.items()})
    save_file(state, f, metadata={"format": "pt"})
    assert json.load(open(os.path.join(with_mtp, "config.json"))).get("num_nextn_predict_layers") == 1
    return with_mtp, without, model, src, {k: v.double() for k, v in own.items()}


def _damp(model, factor: float = 0.1) -> None:
    """Scale the attention and MLP output projections down: the residual stream stays close to the token
    embedding (a nearly bigram model whose greedy text the MTP layer can predict)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "o_proj" in name or "down_proj" in name:
                p.mul_(factor)


def _f64(model):
    m = copy.deepcopy(model).double()
    m.config._experts_implementation = "eager"  # the grouped matmul has no float64
    return m


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def mtp_reference(model, src, own: dict, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Float64 MTP logits and normed outputs at positions 0 .. len(tokens) - 2 (position i reads the
    main model's final-norm hidden state h_i and token t_{i+1})."""
    m64 = _f64(model)
    layer = copy.deepcopy(src.model.layers[N]).double()
    layer.self_attn.config._attn_implementation = "eager"
    layer.mlp.experts.config._experts_implementation = "eager"  # the grouped matmul has no float64
    eps = model.config.rms_norm_eps
    with torch.no_grad():
        t = torch.tensor([tokens])
        h = m64.model(t).last_hidden_state[0, :-1]  # [L-1, H]: after the final norm
        e = m64.model.embed_tokens(t[0, 1:])
        x = torch.cat([_rms(e, own["enorm.weight"], eps), _rms(h, own["hnorm.weight"], eps)], -1)
        x = x @ own["eh_proj.weight"].T
        L = x.shape[0]
        pos = torch.arange(L)[None]
        cos_sin = m64.model.rotary_emb(x[None], pos)
        mask = torch.full((L, L), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        out = layer(x[None], attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
        out = out[0] if isinstance(out, tuple) else out
        o = _rms(out[0], own["shared_head.norm.weight"], eps)
        return (o @ own["shared_head.head.weight"].T).numpy(), o.numpy()


def _llm(path, **kw):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    return LLM(PipelineConfig(model_path=path, max_length=128, max_batch_size=4, kv_cache_page_size=16,
                              device_specs="cpu", **kw))


@functools.lru_cache(maxsize=None)
def mtp_llm():
    d = tiny_mtp()[0]
    # prompts in chunks of 4 tokens: the hidden states of every chunk reach the draft
    return _llm(d, speculative_method="mtp", num_speculative_tokens=3, prefill_chunk_size=4)


PROMPTS = {"a": [5, 9, 14, 3, 27, 8, 11, 40, 2, 17, 6, 33, 21], "b": [7, 1, 19, 25, 4, 12, 30, 9]}


def test_mtp_layer_matches_float64_reference():
    from test_kv_cache_context import FakeContext

    _, _, model, src, own = tiny_mtp()
    draft = mtp_llm().pipeline.pipeline_model.mtp_draft
    mgr = draft.kv_manager
    refs, hiddens = {}, {}
    for rid, toks in PROMPTS.items():
        refs[rid] = mtp_reference(model, src, own, toks)
        with torch.no_grad():  # the MTP input: the main model's final-norm hidden state (float64 -> float32)
            hiddens[rid] = _f64(model).model(torch.tensor([toks])).last_hidden_state[0, :-1].float()
    ctxs = {rid: FakeContext(rid, toks[1:]) for rid, toks in PROMPTS.items()}
    for rid in ctxs:
        mgr.claim(rid)
    try:
        # request a alone, its first 5 positions; then a's rest and all of b in one batch (a reads its cache)
        a, b = ctxs["a"], ctxs["b"]
        a.set_token_indices(active_idx=5)
        logits, out = draft.run([a], hiddens["a"][:5])
        assert_close(logits[0].numpy(), refs["a"][0][4], "a position 4")
        assert_close(out[0].numpy(), refs["a"][1][4], "a position 4 normed output")
        a.set_token_indices(start_idx=5, active_idx=a.end_idx)
        logits, out = draft.run([a, b], torch.cat([hiddens["a"][5:], hiddens["b"]]))
        for row, rid in enumerate(("a", "b")):
            assert_close(logits[row].numpy(), refs[rid][0][-1], f"{rid} last position")
            assert_close(out[row].numpy(), refs[rid][1][-1], f"{rid} last normed output")
    finally:
        for rid in ctxs:
            mgr.release(rid)
    assert mgr.num_free_pages == mgr.total_num_pages


def test_target_returns_final_norm_hidden_states():
    from test_kv_cache_context import FakeContext

    model = tiny_mtp()[2]
    pm = mtp_llm().pipeline.pipeline_model
    mgr = pm.kv_manager
    ctxs = [FakeContext(rid, toks) for rid, toks in PROMPTS.items()]
    for c in ctxs:
        mgr.claim(c.request_id)
    try:
        pm.execute(pm.prepare_initial_token_inputs(ctxs, mgr.fetch(ctxs)))
        assert [r[0] for r in pm.last_rows] == ["a", "b"]
        got = pm.last_hidden.float().numpy()
        with torch.no_grad():
            want = np.concatenate([model.model(torch.tensor([t])).last_hidden_state[0].double().numpy()
                                   for t in PROMPTS.values()])
        assert_close(got, want, "hidden states")
    finally:
        for c in ctxs:
            mgr.release(c.request_id)


def test_greedy_with_mtp_draft_is_token_identical():
    from max.interfaces import SamplingParams

    model = tiny_mtp()[2]
    spec = mtp_llm()
    assert type(spec.pipeline).__name__ == "SpeculativeDecodingTextGenerationPipeline"
    tok = spec.pipeline.tokenizer.delegate
    prompts = ["hello world the", "the cat sat on the mat"]
    p = SamplingParams(top_k=1, max_new_tokens=12, ignore_eos=True)
    ids = [tok(q)["input_ids"] for q in prompts]
    assert len(ids[1]) > 4  # prefilled in chunks
    want = [tok.decode(hf_greedy(model, i, 12), skip_special_tokens=True) for i in ids]
    assert spec.generate(prompts[:1], max_new_tokens=12, sampling_params=p, use_tqdm=False) == want[:1]
    assert spec.generate(prompts, max_new_tokens=12, sampling_params=p, use_tqdm=False) == want
    m = spec.pipeline.metrics
    assert m.rounds > 0 and m.draft_tokens_proposed >= m.rounds and m.draft_tokens_accepted > 0
    assert m.tokens_generated >= m.rounds + m.draft_tokens_accepted
    assert 0.0 <= m.acceptance_rate <= 1.0
    # a sampled request (drafts accepted by rejection sampling against the MTP layer's distribution) in the
    # batch: the greedy ones are unchanged
    sampled = SamplingParams(temperature=0.9, top_k=-1, seed=3, max_new_tokens=12, ignore_eos=True)
    ctxs = [spec.make_context(q, p) for q in prompts] + [spec.make_context("a b c d", sampled)]
    toks: dict = {c.request_id: [] for c in ctxs}
    for c in ctxs:
        spec.scheduler.submit(c, lambda o: toks[o.request_id].extend(o.tokens))
    spec.scheduler.run_until_idle()
    got = [toks[c.request_id] for c in ctxs]
    assert len(got[-1]) == 12
    assert [tok.decode(g, skip_special_tokens=True) for g in got[:-1]] == want
    for mgr in spec.pipeline.kv_managers:
        assert mgr.num_free_pages == mgr.total_num_pages
    assert len(spec.pipeline.kv_managers) == 2


def test_checkpoint_without_mtp_layer_is_a_clear_error():
    from max.pipelines import PipelineConfig

    with_mtp, without = tiny_mtp()[:2]
    with pytest.raises(ValueError, match="multi-token prediction"):
        _llm(without, speculative_method="mtp")
    with pytest.raises(ValueError, match="needs no draft model"):
        PipelineConfig(model_path=with_mtp, speculative_method="mtp", draft_model_path=with_mtp)
