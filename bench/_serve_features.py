"""The serving-feature benchmarks of ``bench/serve.py`` (in-process, through the shared scheduler):

* structured output: tokens/s of JSON-schema-constrained vs free requests at batch 1 and 16;
* speculative decoding at batch 1 (greedy): speed-up and acceptance for SmolLM2 with (a) itself as the
  draft (100 % acceptance: the ceiling this engine reaches for ``k`` drafts) and (b) its first 6 layers
  as the draft (no offline pair of a real small model with SmolLM2's vocabulary exists), plus the tiny
  random pair of the tests;
* LoRA: batch 16 with 4 rank-16 adapters (round robin) vs the same LoRA-enabled model without adapters
  vs a model built without LoRA.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

import numpy as np

SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 20, "maxItems": 20}
N_TOKENS = 32
PROMPTS = [f"Write one sentence about the number {i}:" for i in range(16)]


def _llm(path: str, **kw: Any) -> Any:
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    return LLM(PipelineConfig(model_path=path, max_length=512, max_batch_size=16, device_specs="cpu", **kw))


def _run(llm: Any, prompts: list[str], params: Any, response_format: Any = None, models: Any = None) -> tuple[int, float]:
    """``(tokens generated, seconds)`` for ``prompts`` submitted together."""
    import asyncio

    from max.interfaces import TextGenerationRequest

    ctxs = []
    for i, p in enumerate(prompts):
        req = TextGenerationRequest(request_id=f"b{i}-{time.monotonic_ns()}", prompt=p, sampling_params=params,
                                    model_name=(models[i % len(models)] if models else "base"),
                                    response_format=response_format)
        ctxs.append(asyncio.run(llm.tokenizer.new_context(req)))
    n = [0]

    def cb(out: Any) -> None:
        n[0] += len(out.tokens)

    t = time.perf_counter()
    for c in ctxs:
        llm.scheduler.submit(c, cb)
    llm.scheduler.run_until_idle()
    return n[0], time.perf_counter() - t


def structured(model_path: str) -> list[tuple]:
    from max.interfaces import SamplingParams

    llm = _llm(model_path)
    free = SamplingParams(top_k=1, max_new_tokens=N_TOKENS, ignore_eos=True)
    cons = SamplingParams(top_k=1, max_new_tokens=N_TOKENS + 16)
    rf = {"type": "json_schema", "json_schema": {"name": "digits", "schema": SCHEMA}}
    _run(llm, PROMPTS[:2], free)  # warm-up
    _run(llm, PROMPTS[:2], cons, rf)
    rows = []
    for b in (1, 16):
        nf, tf = _run(llm, PROMPTS[:b], free)
        nc, tc = _run(llm, PROMPTS[:b], cons, rf)
        rows.append((b, f"{nf / tf:.1f}", f"{nc / tc:.1f}", f"{(nc / tc) / (nf / tf):.2f}x",
                     f"{(tc / nc - tf / nf) * 1e3:+.2f} ms"))
    return rows


def truncated_gguf(src: str, dst: str, n_layers: int) -> str:
    """A copy of a GGUF decoder keeping its first ``n_layers`` blocks (tensors copied as stored)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        val = n_layers if name == f"{arch}.block_count" else f.contents()
        sub = f.types[1] if f.types[0] == GGUFValueType.ARRAY and len(f.types) > 1 else None
        w.add_key_value(name, val, f.types[0], sub_type=sub)
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n_layers:
            continue
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def speculative(model_path: str, tiny_pair: tuple[str, str] | None, k: int = 3) -> list[tuple]:
    from max.interfaces import SamplingParams

    p = SamplingParams(top_k=1, max_new_tokens=N_TOKENS, ignore_eos=True)
    prompt = ["The capital of France is"]
    tmp = tempfile.mkdtemp()
    pairs = [("SmolLM2 / itself", model_path, model_path),
             ("SmolLM2 / its first 6 layers", model_path,
              truncated_gguf(model_path, os.path.join(tmp, "draft6.gguf"), 6))]
    if tiny_pair:
        pairs.append(("tiny random 2-layer / 1-layer", *tiny_pair))
    rows = []
    for label, target, draft in pairs:
        base = _llm(target)
        _run(base, prompt, SamplingParams(top_k=1, max_new_tokens=4))
        nb, tb = _run(base, prompt, p)
        del base
        spec = _llm(target, draft_model_path=draft, num_speculative_tokens=k)
        _run(spec, prompt, SamplingParams(top_k=1, max_new_tokens=4))
        m = spec.pipeline.metrics
        m.draft_tokens_proposed = m.draft_tokens_accepted = m.rounds = m.tokens_generated = 0
        ns, ts = _run(spec, prompt, p)
        rows.append((label, k, f"{nb / tb:.1f}", f"{ns / ts:.1f}", f"{(ns / ts) / (nb / tb):.2f}x",
                     f"{m.acceptance_rate:.1%}", f"{m.tokens_per_round:.2f}"))
        del spec
    return rows


def make_adapters(model_path: str, out: str, n: int = 4, rank: int = 16) -> list[str]:
    """``n`` random PEFT-format LoRA folders (q/k/v/o/gate/up/down, rank ``rank``) for the model."""
    from safetensors.numpy import save_file

    from max.pipelines import PipelineConfig

    cfg = PipelineConfig(model_path=model_path, device_specs="cpu").model_config.huggingface_config
    h = cfg.hidden_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    inter = cfg.intermediate_size
    dims = {"self_attn.q_proj": (h, h), "self_attn.k_proj": (h, kv), "self_attn.v_proj": (h, kv),
            "self_attn.o_proj": (h, h), "mlp.gate_proj": (h, inter), "mlp.up_proj": (h, inter),
            "mlp.down_proj": (inter, h)}
    rng = np.random.default_rng(0)
    paths = []
    for a in range(n):
        d = os.path.join(out, f"adapter{a}")
        os.makedirs(d, exist_ok=True)
        tensors = {}
        for layer in range(cfg.num_hidden_layers):
            for mod, (i, o) in dims.items():
                key = f"base_model.model.model.layers.{layer}.{mod}"
                tensors[f"{key}.lora_A.weight"] = rng.normal(0, 0.02, (rank, i)).astype(np.float32)
                tensors[f"{key}.lora_B.weight"] = rng.normal(0, 0.02, (o, rank)).astype(np.float32)
        save_file(tensors, os.path.join(d, "adapter_model.safetensors"))
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": [
                m.split(".")[1] for m in dims]}, f)
        paths.append(f"a{a}={d}")
    return paths


def lora(model_path: str) -> list[tuple]:
    from max.interfaces import SamplingParams

    p = SamplingParams(top_k=1, max_new_tokens=N_TOKENS, ignore_eos=True)
    paths = make_adapters(model_path, tempfile.mkdtemp())
    plain = _llm(model_path)
    _run(plain, PROMPTS[:2], SamplingParams(top_k=1, max_new_tokens=4))
    n0, t0 = _run(plain, PROMPTS, p)
    del plain
    with_lora = _llm(model_path, enable_lora=True, lora_paths=paths, max_num_loras=4, max_lora_rank=16)
    _run(with_lora, PROMPTS[:2], SamplingParams(top_k=1, max_new_tokens=4))
    n1, t1 = _run(with_lora, PROMPTS, p)
    n2, t2 = _run(with_lora, PROMPTS, p, models=["a0", "a1", "a2", "a3"])
    base = n0 / t0
    return [("model built without LoRA", f"{base:.1f}", "1.00x"),
            ("LoRA-enabled model, no adapter", f"{n1 / t1:.1f}", f"{(n1 / t1) / base:.2f}x"),
            ("4 adapters (rank 16, all 7 projections), round robin", f"{n2 / t2:.1f}", f"{(n2 / t2) / base:.2f}x")]
