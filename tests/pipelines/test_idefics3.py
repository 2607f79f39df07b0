"""Idefics3 (``Idefics3ForConditionalGeneration``, SmolVLM's architecture) against transformers on a tiny
random checkpoint (``vlm_support``; 32-pixel tiles of 8x8 patches, pixel shuffle 2, the real
``Idefics3Processor`` splitting each image into up to 2x2 tiles plus a global one): SigLIP + connector
output per tile, prefill and decode logits for 0/1/2 images, greedy tokens alone and batched."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PIL")

import torch  # noqa: E402

from vlm_support import (  # noqa: E402
    check_greedy,
    check_steps,
    hf_inputs_idefics3,
    image_bytes,
    tiny_idefics3,
    with_llm,
)

from max.interfaces import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def idf():
    return with_llm(tiny_idefics3, 512)


_hf_inputs = hf_inputs_idefics3


def test_tiles_through_siglip_and_connector_match_transformers(idf):
    d, model, llm = idf
    pm = llm.pipeline.pipeline_model
    ctx = llm.make_context("x", SamplingParams(max_new_tokens=1),
                           images=[image_bytes(1, (40, 28)), image_bytes(2, (20, 50))])
    assert len(ctx.images) == 8  # 2x2 tiles + global, 2x1 tiles + global: one placeholder span per tile
    ours = torch.cat(pm.encode([ctx])).double().numpy()
    with torch.no_grad():
        ref = model.model.get_image_features(torch.from_numpy(np.stack(ctx.pixel_values))[None]).pooler_output
    ref = torch.cat(list(ref)).double().numpy() if isinstance(ref, (list, tuple)) else ref.double().numpy()
    assert ours.shape == ref.shape == (8 * 4, 64)
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_prefill_and_decode_logits_match_transformers(idf, n_images):
    d, model, llm = idf
    images = [image_bytes(4, (40, 28)), image_bytes(5, (20, 50))][:n_images]
    ctx = llm.make_context("What is shown?", SamplingParams(max_new_tokens=8), images=images)
    check_steps(llm, ctx, model, _hf_inputs)


def test_greedy_16_alone_and_batched(idf):
    d, model, llm = idf
    reqs = [("Describe it.", [image_bytes(6, (40, 28))]), ("What is this?", [image_bytes(7, (20, 50))])]
    check_greedy(llm, model, _hf_inputs, reqs)
