"""Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``) against transformers on a tiny random checkpoint
(``vlm_support``; 4x4 patches, 2x2 merge, 16-pixel windows, one full-attention block): the vision
transformer (2-D RoPE, window attention, patch merger) on images of different sizes, prefill and decode
logits with M-RoPE positions for 0/1/2 images, greedy tokens alone and batched with another image size."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PIL")

import torch  # noqa: E402

from vlm_support import (  # noqa: E402
    check_greedy,
    check_steps,
    hf_inputs_qwen2_5_vl,
    image_bytes,
    tiny_qwen2_5_vl,
    with_llm,
)

from max.interfaces import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def qvl():
    return with_llm(tiny_qwen2_5_vl, 256)


_hf_inputs = hf_inputs_qwen2_5_vl


def test_vision_transformer_matches_transformers(qvl):
    d, model, llm = qvl
    pm = llm.pipeline.pipeline_model
    # 40x28 -> an 8x10 patch grid: 4x5 merged tokens in 2x2-token windows (partial windows at the edges)
    ctx = llm.make_context("x", SamplingParams(max_new_tokens=1),
                           images=[image_bytes(1, (40, 28)), image_bytes(2, (20, 50)), image_bytes(3, (64, 64))])
    grids = ctx.extra_model_args["image_grid_thw"]
    assert len({tuple(g) for g in grids.tolist()}) == 3
    ours = torch.cat(pm.encode([ctx])).double().numpy()
    with torch.no_grad():
        ref = model.model.get_image_features(torch.from_numpy(np.concatenate(ctx.pixel_values)),
                                             torch.from_numpy(grids)).pooler_output
    ref = torch.cat(list(ref)).double().numpy() if isinstance(ref, (list, tuple)) else ref.double().numpy()
    assert ours.shape == ref.shape == (len(ctx.image_token_indices), 64)
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_prefill_and_decode_logits_match_transformers(qvl, n_images):
    d, model, llm = qvl
    images = [image_bytes(4, (40, 28)), image_bytes(5, (20, 50))][:n_images]
    ctx = llm.make_context("What is shown?", SamplingParams(max_new_tokens=8), images=images)
    check_steps(llm, ctx, model, _hf_inputs)


def test_greedy_16_alone_and_batched_with_another_image_size(qvl):
    d, model, llm = qvl
    reqs = [("Describe it.", [image_bytes(6, (40, 28))]), ("What is this?", [image_bytes(7, (20, 50))])]
    check_greedy(llm, model, _hf_inputs, reqs)


def test_registered_with_the_vision_tokenizer():
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    register_all_models()
    arch = PIPELINE_REGISTRY.architectures["Qwen2_5_VLForConditionalGeneration"]
    from max.pipelines.lib.tokenizer import TextAndVisionTokenizer

    assert issubclass(arch.tokenizer, TextAndVisionTokenizer) and arch.tokenizer.__name__ == "Qwen2VLTokenizer"
