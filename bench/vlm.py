"""Vision-language generation side by side: libremax beside Hugging Face transformers on the same
random-weight checkpoints (Gemma 3 multimodal, Qwen2.5-VL, Idefics3, Mistral 3, InternVL, Llama 4, Qwen3-VL and
Qwen3-VL-MoE at small sizes, built here with transformers' own config classes: a 4-layer 512-wide text decoder, a
4-layer 384-wide vision tower on 224-pixel images).

For each family and engine, in its own process (so peak RSS is its own), one request with one image and a
short prompt, greedy: time to first token (image encoding + prefill), time per output token over
``--new-tokens`` tokens, tokens/s, peak RSS.  Both engines get the same token ids and pixels (libremax's
tokenizer makes them) and the same thread count.  Printed as a table with transformers / libremax ratios
(> 1: libremax faster).

Run: .venv/bin/python bench/vlm.py [--families gemma3,qwen2_5vl,idefics3,mistral3,internvl,llama4,qwen3vl,qwen3vl_moe]
     [--new-tokens 32] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from _common import peak_rss_mib, table  # noqa: E402

PROMPT = "Describe the picture in detail."
TEXT = (("hidden_size", 512), ("intermediate_size", 1024), ("num_hidden_layers", 4), ("num_attention_heads", 8),
        ("num_key_value_heads", 4), ("max_position_embeddings", 2048))
SIGLIP = (("hidden_size", 384), ("intermediate_size", 768), ("num_hidden_layers", 4), ("num_attention_heads", 6),
          ("image_size", 224), ("patch_size", 14))
FAMILIES = {
    # 16x16 patches pooled to 8x8 = 64 image tokens
    "gemma3": ("tiny_gemma3_vlm", dict(text_kw=TEXT + (("head_dim", 64), ("query_pre_attn_scalar", 64),
                                                         ("sliding_window", 512), ("layer_types", (
                                                             "sliding_attention",) * 3 + ("full_attention",))),
                                       vision_kw=SIGLIP, mm_tokens=64),
               "hf_inputs_gemma3", "Gemma3ForConditionalGeneration"),
    # 224x224 -> 16x16 patches of 14, merged 2x2 = 64 image tokens; 112-pixel windows
    "qwen2_5vl": ("tiny_qwen2_5_vl", dict(
        text_kw=TEXT + (("rope_parameters", (("rope_type", "default"), ("rope_theta", 1e6),
                                             ("mrope_section", (8, 12, 12)))),),
        vision_kw=(("depth", 4), ("hidden_size", 384), ("intermediate_size", 768), ("num_heads", 6),
                   ("out_hidden_size", 512), ("patch_size", 14), ("window_size", 112), ("fullatt_block_indexes", (3,))),
        max_pixels=224 * 224), "hf_inputs_qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
    # 224-pixel tiles of 16x16 patches, pixel shuffle 2 = 64 tokens per tile; up to 2x2 tiles + a global view
    "idefics3": ("tiny_idefics3", dict(text_kw=TEXT, vision_kw=SIGLIP), "hf_inputs_idefics3",
                 "Idefics3ForConditionalGeneration"),
    # 320x240 resized to 224x168: 16x12 patches of 14, merged 2x2 = 8x6 = 48 image tokens (+ 6 row breaks/end)
    "mistral3": ("tiny_mistral3", dict(text_kw=TEXT + (("head_dim", 64),), vision_kw=(
        ("hidden_size", 384), ("intermediate_size", 768), ("num_hidden_layers", 4), ("num_attention_heads", 6),
        ("head_dim", 64), ("patch_size", 14), ("image_size", 224)), longest_edge=224), "hf_inputs_mistral3",
                 "Mistral3ForConditionalGeneration"),
    # InternViT on 224-pixel tiles of 16x16 patches, pixel shuffle 2 = 64 tokens per tile; up to 4 tiles + thumbnail
    "internvl": ("tiny_internvl", dict(text_kw=TEXT, vision_kw=SIGLIP),
                 "hf_inputs_internvl", "InternVLForConditionalGeneration"),
    # Llama 4: 224-pixel tiles of 16x16 patches, pixel shuffle 2 = 64 tokens per tile; up to 4 tiles + a global view;
    # the text decoder's MoE layers (4 experts, top-1) on every second layer
    "llama4": ("tiny_llama4_vlm", dict(
        text_kw=TEXT + (("head_dim", 64), ("intermediate_size_mlp", 1024), ("attention_chunk_size", 2048),
                        ("no_rope_layers", (1, 1, 1, 0))),
        vision_kw=(("hidden_size", 384), ("intermediate_size", 1536), ("num_hidden_layers", 4),
                   ("num_attention_heads", 6), ("image_size", 224), ("patch_size", 14), ("vision_output_dim", 512),
                   ("projector_input_dim", 512), ("projector_output_dim", 512))),
               "hf_inputs_llama4", "Llama4ForConditionalGeneration"),
}
REFERENCES = {"llama4": "Llama4Reference"}
"""Families whose transformers model is called through a ``vlm_support`` wrapper (a transformers defect)."""
# Qwen3-VL (and its MoE text decoder): 224x224 -> 16x16 patches of 14, merged 2x2 = 64 image tokens; a 16x16
# learned position table; DeepStack from vision blocks 1 and 2 (builders in tests/qwen3vl_support.py)
QWEN3VL_TEXT = TEXT + (("head_dim", 64), ("rope_parameters", (("rope_type", "default"), ("rope_theta", 5e6),
                                                              ("mrope_section", (8, 12, 12)),
                                                              ("mrope_interleaved", True))))
QWEN3VL_VISION = (("depth", 4), ("hidden_size", 384), ("intermediate_size", 768), ("num_heads", 6),
                  ("out_hidden_size", 512), ("patch_size", 14), ("num_position_embeddings", 256),
                  ("deepstack_visual_indexes", (1, 2)))
FAMILIES.update({
    "qwen3vl": ("qwen3vl_support.tiny_qwen3_vl", dict(text_kw=QWEN3VL_TEXT, vision_kw=QWEN3VL_VISION,
                                                      max_pixels=224 * 224),
                "qwen3vl_support.hf_inputs_qwen3_vl", "Qwen3VLForConditionalGeneration"),
    # 8 experts of 256, top 2, on layers 0, 2 and 3
    "qwen3vl_moe": ("qwen3vl_support.tiny_qwen3_vl", dict(
        moe=True, text_kw=QWEN3VL_TEXT + (("num_experts", 8), ("moe_intermediate_size", 256)),
        vision_kw=QWEN3VL_VISION, max_pixels=224 * 224),
        "qwen3vl_support.hf_inputs_qwen3_vl", "Qwen3VLMoeForConditionalGeneration"),
})


def _support(name: str):  # noqa: ANN202
    """A function of the tests' support modules: ``fn`` (``vlm_support``) or ``module.fn``."""
    import importlib

    module, _, fn = name.rpartition(".")
    return getattr(importlib.import_module(module or "vlm_support"), fn)


def build(family: str) -> str:
    fn, kw, _, _ = FAMILIES[family]
    return _support(fn)(**kw)[0]


def image() -> bytes:
    import vlm_support

    return vlm_support.image_bytes(1, (320, 240))


def peak_rss_mb() -> float:
    return peak_rss_mib()


# ------------------------------------------------------------------------------------------- workers
def _context(folder: str, n: int):  # noqa: ANN202
    from max.entrypoints.llm import LLM
    from max.interfaces import SamplingParams
    from max.pipelines import PipelineConfig

    t0 = time.perf_counter()
    llm = LLM(PipelineConfig(model_path=folder, max_length=1024, max_batch_size=1))
    load = time.perf_counter() - t0
    params = SamplingParams(top_k=1, max_new_tokens=n, ignore_eos=True)
    return llm, load, lambda: llm.make_context(PROMPT, params, images=[image()])


def run_libremax(folder: str, n: int) -> dict:
    llm, load, make = _context(folder, n)

    def once() -> tuple[float, float]:
        ctx = make()
        stamps: list[float] = []
        t = time.perf_counter()
        llm.scheduler.submit(ctx, lambda o: stamps.extend([time.perf_counter()] * len(o.tokens)))
        llm.scheduler.run_until_idle()
        return stamps[0] - t, (stamps[-1] - stamps[0]) / (len(stamps) - 1)

    once()  # warm-up
    runs = [once() for _ in range(3)]
    ttft, tpot = min(r[0] for r in runs), min(r[1] for r in runs)
    return {"load_s": load, "ttft_s": ttft, "tpot_s": tpot, "peak_rss_mb": peak_rss_mb(),
            "prompt_tokens": int(make().active_length)}


def run_transformers(folder: str, family: str, n: int) -> dict:
    import torch
    import transformers

    from max.entrypoints.llm import make_context
    from max.interfaces import SamplingParams
    from max.pipelines import PipelineConfig
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    _, _, inputs_fn, cls = FAMILIES[family]
    register_all_models()  # the same token ids and pixels as libremax's (its tokenizer alone: no model loaded)
    cfg = PipelineConfig(model_path=folder, max_length=1024, max_batch_size=1)
    ctx = make_context(PIPELINE_REGISTRY.retrieve_tokenizer(cfg), cfg, PROMPT, SamplingParams(max_new_tokens=n),
                       images=[image()])
    t0 = time.perf_counter()
    model = getattr(transformers, cls).from_pretrained(folder, dtype=torch.float32).eval()
    load = time.perf_counter() - t0
    if family in REFERENCES:
        model = _support(REFERENCES[family])(model)
    kw = _support(inputs_fn)(model, ctx, ctx.prompt_tokens.tolist())

    def gen(k: int) -> float:
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(**kw, max_new_tokens=k, do_sample=False, eos_token_id=None, pad_token_id=0)
        return time.perf_counter() - t

    gen(2)
    first = min(gen(1) for _ in range(3))
    total = min(gen(n) for _ in range(2))
    return {"load_s": load, "ttft_s": first, "tpot_s": (total - first) / (n - 1), "peak_rss_mb": peak_rss_mb()}


def worker(engine: str, family: str, folder: str, n: int, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    os.environ["LIBREMAX_NUM_THREADS"] = str(threads)
    res = run_libremax(folder, n) if engine == "libremax" else run_transformers(folder, family, n)
    print("RESULT " + json.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--worker", nargs=3, metavar=("ENGINE", "FAMILY", "FOLDER"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(*a.worker, a.new_tokens, a.threads)
        return
    rows = []
    for family in a.families.split(","):
        folder = build(family)
        res = {}
        for engine in ("libremax", "transformers"):
            out = subprocess.run([sys.executable, __file__, "--worker", engine, family, folder, "--new-tokens",
                                  str(a.new_tokens), "--threads", str(a.threads)], capture_output=True, text=True)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                raise SystemExit(f"{engine} {family} failed:\n{out.stderr[-3000:]}")
            res[engine] = json.loads(line[7:])
        lm, hf = res["libremax"], res["transformers"]
        rows.append((family, lm["prompt_tokens"], f"{lm['ttft_s'] * 1e3:.1f}", f"{hf['ttft_s'] * 1e3:.1f}",
                     f"{hf['ttft_s'] / lm['ttft_s']:.2f}x", f"{lm['tpot_s'] * 1e3:.2f}", f"{hf['tpot_s'] * 1e3:.2f}",
                     f"{hf['tpot_s'] / lm['tpot_s']:.2f}x", f"{lm['peak_rss_mb']:.0f}", f"{hf['peak_rss_mb']:.0f}"))
    table(f"One image + prompt, greedy {a.new_tokens} tokens, {a.threads} threads (ratio: transformers / libremax)",
          rows, ("family", "prompt tok", "TTFT ms", "HF TTFT ms", "ratio", "TPOT ms", "HF TPOT ms", "ratio",
                 "RSS MB", "HF RSS MB"))


if __name__ == "__main__":
    main()
