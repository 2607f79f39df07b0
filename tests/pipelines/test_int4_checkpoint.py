"""GPTQ / AWQ int4 safetensors checkpoints (the Hugging Face layouts: ``qweight`` / ``qzeros`` / ``scales``
(/ ``g_idx``, act-order too) with ``quantization_config`` in config.json) load with every projection kept as int4 blocks
(Q4_0 when symmetric, Q4_1 otherwise, run by the native kernels: no float copy) and generate
token-identically to transformers running the same dequantised weights ``s * (q - z)``.

The checkpoints are written here by a quantiser of this test's own (round to nearest per group), packed
as AutoGPTQ (qweight ``[K/8, N]``, zeros stored minus one) and AutoAWQ GEMM (``[K, N/8]``, interleaved
nibble order 0 2 4 6 1 3 5 7) pack them."""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from family_support import hf_greedy, tiny_family
from max.engine import native
from max.interfaces import SamplingParams, TextGenerationRequest

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def _pack(codes: np.ndarray, axis: int, order=range(8)) -> np.ndarray:
    """int codes 0..15 -> int32 words, 8 consecutive codes along ``axis`` per word, code ``order[i]`` of
    each run of 8 in bits ``4 i``."""
    c = np.moveaxis(codes.astype(np.uint64), axis, -1)
    c = c.reshape(*c.shape[:-1], -1, 8)
    words = sum(c[..., o] << np.uint64(4 * i) for i, o in enumerate(order))
    return np.moveaxis(words.astype(np.uint32).view(np.int32), -1, axis)


def _quantise(w: np.ndarray, group: int, sym: bool):
    """W [N, K] -> codes q [K, N], zeros z [K/G, N], float16 scales s [K/G, N]; and s * (q - z) as [N, K]."""
    n, k = w.shape
    g = k if group == -1 else group
    wt = w.T.reshape(k // g, g, n)
    if sym:
        s = (np.abs(wt).max(axis=1) / 7.5).astype(np.float16)
        z = np.full(s.shape, 8, np.int64)
    else:
        lo, hi = wt.min(axis=1), wt.max(axis=1)
        s = ((hi - lo) / 15).astype(np.float16)
        z = np.clip(np.round(-lo / s.astype(np.float32)), 1, 15).astype(np.int64)
    sf = s.astype(np.float32)
    q = np.clip(np.round(wt / sf[:, None]) + z[:, None], 0, 15).astype(np.int64)
    deq = (sf[:, None] * (q - z[:, None]).astype(np.float32)).reshape(k, n).T
    return q.reshape(k, n), z, s, np.ascontiguousarray(deq)


def _int4_copy(method: str, group: int, sym: bool, act_order: bool = False):
    """The tiny Llama with its projections quantised (``act_order``: GPTQ's desc_act, the inputs quantised
    in a random order, groups following it, g_idx naming each input's group)."""
    d, model, tok = tiny_family("llama")
    sd = load_file(os.path.join(d, "model.safetensors"))
    out, deq = {}, {}
    rng = np.random.default_rng(5)
    for key, v in sd.items():
        if v.dim() == 2 and any(p in key for p in PROJ):
            name = key[: -len(".weight")]
            w = v.float().numpy()
            k = w.shape[1]
            perm = rng.permutation(k) if act_order else np.arange(k)
            qp, z, s, dqp = _quantise(w[:, perm], group, sym)  # quantised in perm's order
            q, dq = np.empty_like(qp), np.empty_like(dqp)
            q[perm], dq[:, perm] = qp, dqp
            if method == "gptq":
                out[f"{name}.qweight"] = torch.from_numpy(np.ascontiguousarray(_pack(q, 0)))
                out[f"{name}.qzeros"] = torch.from_numpy(np.ascontiguousarray(_pack(z - 1, 1)))  # AutoGPTQ stores z - 1
                gs = k if group == -1 else group
                g_idx = np.empty(k, np.int32)
                g_idx[perm] = np.arange(k) // gs
                out[f"{name}.g_idx"] = torch.from_numpy(g_idx)
            else:
                out[f"{name}.qweight"] = torch.from_numpy(np.ascontiguousarray(_pack(q, 1, AWQ_ORDER)))
                out[f"{name}.qzeros"] = torch.from_numpy(np.ascontiguousarray(_pack(z, 1, AWQ_ORDER)))
            out[f"{name}.scales"] = torch.from_numpy(np.ascontiguousarray(s))
            deq[key] = torch.from_numpy(dq)
        else:
            out[key] = v
    folder = tempfile.mkdtemp(prefix=f"libremax-{method}-")
    save_file(out, os.path.join(folder, "model.safetensors"))
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["quantization_config"] = (
        {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order, "sym": sym,
         "checkpoint_format": "gptq"} if method == "gptq" else
        {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"})
    json.dump(cfg, open(os.path.join(folder, "config.json"), "w"))
    tok.save_pretrained(folder)
    ref = type(model)(model.config).eval()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if n in deq:
                p.copy_(deq[n])
    return folder, ref, tok


@pytest.mark.parametrize("method,group,sym,kind", [("gptq", 64, True, "Q4_0"), ("gptq", 32, False, "Q4_1"),
                                                    ("awq", -1, False, "Q4_1")])
def test_repacked_blocks_hold_the_checkpoint_values(method, group, sym, kind):
    """GPTQ / AWQ groups -> GGML blocks: the codec's dequantisation of the blocks is s * (q - z) (Q4_0:
    exactly; Q4_1: up to the float16 rounding of m = -s*z, |s z| 2**-11 at most)."""
    from max.graph.quantization.codec import dequantize
    from max.graph.quantization.gptq import int4_config, to_ggml_blocks, unpack_gptq

    w = np.random.default_rng(1).normal(size=(48, 128)).astype(np.float32)
    q, z, s, dq = _quantise(w, group, sym)
    if method == "gptq":
        qw, qz = _pack(q, 0), _pack(z - 1, 1)
    else:
        qw, qz = _pack(q, 1, AWQ_ORDER), _pack(z, 1, AWQ_ORDER)
    cfg = int4_config({"quant_method": method, "bits": 4, "group_size": group})
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (qw, qz, s)]
    codes, zeros, scales = unpack_gptq(*t, cfg)
    assert (codes.numpy() == q.T).all() and (zeros.numpy() == z.T).all()
    got_kind, blocks = to_ggml_blocks(codes, zeros, scales)
    assert got_kind == kind and list(blocks.shape) == [48, 128 // 32 * (18 if kind == "Q4_0" else 20)]
    err = np.abs(dequantize(blocks, kind).numpy() - dq)
    g = 128 if group == -1 else group
    bound = 0.0 if kind == "Q4_0" else np.repeat((s.astype(np.float32) * z).T, g, axis=1) * 2.0 ** -11 + 1e-6
    assert (err <= bound).all()


def test_unsupported_int4_variants_are_named():
    from max.graph.quantization.gptq import int4_config, unpack_gptq

    for qc, words in [({"quant_method": "gptq", "bits": 8, "group_size": 128}, "8-bit"),
                      ({"quant_method": "gptq", "bits": 4, "group_size": 48}, "group_size 48"),
                      ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"},
                       "marlin"),
                      ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "gemv")]:
        with pytest.raises(ValueError, match=words):
            int4_config(qc)
    cfg = int4_config({"quant_method": "gptq", "bits": 4, "group_size": 32})
    qw = torch.zeros(8, 16, dtype=torch.int32)
    uneven = torch.tensor([0] * 40 + [1] * 24, dtype=torch.int32)
    with pytest.raises(ValueError, match="does not put 32 inputs in each"):
        unpack_gptq(qw, torch.zeros(2, 2, dtype=torch.int32), torch.ones(2, 16, dtype=torch.float16), cfg, uneven)


def _hf_logits(ref, ids) -> np.ndarray:
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0].double().numpy()


CASES = [("gptq", 32, True, "Q4_0", True), ("gptq", -1, False, "Q4_1", False), ("awq", 32, False, "Q4_1", False)]


@pytest.mark.skipif(native.lib() is None, reason="native kernels unavailable")
@pytest.mark.parametrize("method,group,sym,kind,act_order", CASES)
def test_int4_checkpoint_generates_like_transformers(method, group, sym, kind, act_order, monkeypatch):
    """Exact mode (float32 activations times the int4 tiles): the tokens of transformers on s * (q - z),
    and its logits to 1e-5 of their range (Q4_0) or 5e-3 (Q4_1: the float16 rounding of -s*z); the default mode
    (8-bit activation codes, as llama.cpp runs int4) stays within what the GGUF kinds are held to."""
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig
    from max.pipelines.lib.teacher_forcing import teacher_forced_logits

    folder, ref, tok = _int4_copy(method, group, sym, act_order)
    ids = tok("def forward(self, x): return x * 2 + 1")["input_ids"]
    want = _hf_logits(ref, ids)
    span = float(want.max() - want.min())
    got = teacher_forced_logits(folder, ids)
    assert np.abs(got - want).max() <= 0.05 * span
    monkeypatch.setenv("LIBREMAX_QMATMUL", "exact")
    got = teacher_forced_logits(folder, ids)
    # Q4_0 holds s * (q - 8) exactly; Q4_1's float16 m = -s*z is off by up to |s z| 2**-11 per block
    tol = (1e-5 if kind == "Q4_0" else 5e-3) * span
    assert np.abs(got - want).max() <= tol
    monkeypatch.delenv("LIBREMAX_QMATMUL")
    got = teacher_forced_logits(folder, ids, "float32")  # --quantization-encoding float32: dequantised at load
    assert np.abs(got - want).max() <= tol
    monkeypatch.setenv("LIBREMAX_QMATMUL", "exact")

    llm = LLM(PipelineConfig(model_path=folder, max_length=128, max_batch_size=2, kv_cache_page_size=16))
    pm = llm.pipeline.pipeline_model
    # every projection stays int4 blocks (packed uint8 for the native kernels): no float copy of one
    proj_shapes = {tuple(p.shape) for n, p in ref.named_parameters() if any(q in n for q in PROJ)}
    consts = [c for c in pm.model._consts if isinstance(c, torch.Tensor)]
    assert not [tuple(c.shape) for c in consts if c.is_floating_point() and tuple(c.shape) in proj_shapes]
    assert sum(c.dtype == torch.uint8 for c in consts) >= 7 * ref.config.num_hidden_layers
    block_bytes = {"Q4_0": 18, "Q4_1": 20}[kind]  # the packed layout keeps the blocks' bytes
    want_bytes = sum(p.numel() // 32 * block_bytes for n, p in ref.named_parameters() if any(q in n for q in PROJ))
    assert sum(c.numel() for c in consts if c.dtype == torch.uint8) == want_bytes
    if act_order:  # each projection gathers its inputs in its groups' order
        assert sum(nd.op == "gather" for nd in pm.model._prog.nodes) >= 7 * ref.config.num_hidden_layers
    prompts = ["def forward(self, x):", "import os"]
    sp = SamplingParams(top_k=1, max_new_tokens=10)
    outs = llm.pipeline.generate([TextGenerationRequest(request_id=f"g{i}", model_name=method, prompt=p,
                                                        sampling_params=sp) for i, p in enumerate(prompts)])
    assert [o.tokens for o in outs] == [hf_greedy(ref, tok(p)["input_ids"], 10) for p in prompts]


def test_unsupported_checkpoint_fails_at_load_naming_it():
    """A 3-bit GPTQ config fails at load with the variant named."""
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    folder, _, _ = _int4_copy("gptq", 32, True)
    path = os.path.join(folder, "config.json")
    cfg = json.load(open(path))
    cfg["quantization_config"]["bits"] = 3
    json.dump(cfg, open(path, "w"))
    with pytest.raises(ValueError, match="3-bit weights are not supported"):
        LLM(PipelineConfig(model_path=folder, max_length=64, max_batch_size=1))


def test_legacy_quantize_config_json(monkeypatch):
    """Older AutoGPTQ folders: GPTQ parameters in quantize_config.json, none in config.json."""
    from max.pipelines.lib.teacher_forcing import teacher_forced_logits

    folder, ref, tok = _int4_copy("gptq", 32, True)
    path = os.path.join(folder, "config.json")
    cfg = json.load(open(path))
    qc = cfg.pop("quantization_config")
    json.dump(cfg, open(path, "w"))
    legacy = {k: v for k, v in qc.items() if k != "quant_method"}
    json.dump(legacy, open(os.path.join(folder, "quantize_config.json"), "w"))
    monkeypatch.setenv("LIBREMAX_QMATMUL", "exact")
    ids = tok("import os")["input_ids"]
    want = _hf_logits(ref, ids)
    got = teacher_forced_logits(folder, ids)
    assert np.abs(got - want).max() <= 1e-5 * float(want.max() - want.min())
