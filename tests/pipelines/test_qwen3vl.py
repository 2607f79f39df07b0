"""Qwen3-VL (``Qwen3VLForConditionalGeneration``) and Qwen3-VL-MoE against transformers on tiny random
checkpoints (``qwen3vl_support``: 4x4 patches, 2x2 merge, a 4x4 learned position table resampled per image,
DeepStack from vision blocks 0 and 1 into decoder layers 0 and 1, interleaved M-RoPE): the vision tower and
its DeepStack features on images of different sizes, prefill and decode logits for 0/1/2 images, greedy
tokens alone and batched with another image size, pages freed."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PIL")

import torch  # noqa: E402

from qwen3vl_support import hf_inputs_qwen3_vl, tiny_qwen3_vl  # noqa: E402
from vlm_support import check_greedy, check_steps, image_bytes  # noqa: E402

from max.interfaces import SamplingParams  # noqa: E402


def _llm(moe: bool):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, model, _ = tiny_qwen3_vl(moe)
    return d, model, LLM(PipelineConfig(model_path=d, max_length=320, max_batch_size=4, kv_cache_page_size=16))


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def qvl(request):
    return _llm(request.param)


def test_vision_tower_and_deepstack_match_transformers(qvl):
    d, model, llm = qvl
    pm = llm.pipeline.pipeline_model
    ctx = llm.make_context("x", SamplingParams(max_new_tokens=1),
                           images=[image_bytes(1, (40, 28)), image_bytes(2, (20, 50)), image_bytes(3, (64, 64))])
    grids = ctx.extra_model_args["image_grid_thw"]
    assert len({tuple(g) for g in grids.tolist()}) == 3
    ours = torch.cat(pm.encode([ctx])).double().numpy()
    with torch.no_grad():
        out = model.model.get_image_features(torch.from_numpy(np.concatenate(ctx.pixel_values)),
                                             torch.from_numpy(grids))
    ref = np.concatenate([torch.cat(list(out.pooler_output)).double().numpy()] +
                         [torch.cat(list(f)).double().numpy() for f in out.deepstack_features], axis=-1)
    assert ours.shape == ref.shape == (len(ctx.image_token_indices), 64 * 3)
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_prefill_and_decode_logits_match_transformers(qvl, n_images):
    d, model, llm = qvl
    images = [image_bytes(4, (40, 28)), image_bytes(5, (20, 50))][:n_images]
    ctx = llm.make_context("What is shown?", SamplingParams(max_new_tokens=8), images=images)
    check_steps(llm, ctx, model, hf_inputs_qwen3_vl)


def test_greedy_16_alone_and_batched_with_another_image_size(qvl):
    d, model, llm = qvl
    reqs = [("Describe it.", [image_bytes(6, (40, 28))]), ("What is this?", [image_bytes(7, (20, 50))])]
    check_greedy(llm, model, hf_inputs_qwen3_vl, reqs)


@pytest.mark.parametrize("name", ["Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration"])
def test_registered_with_the_vision_tokenizer(name):
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models
    from max.pipelines.lib.tokenizer import TextAndVisionTokenizer

    register_all_models()
    arch = PIPELINE_REGISTRY.architectures[name]
    assert issubclass(arch.tokenizer, TextAndVisionTokenizer) and arch.tokenizer.__name__ == "Qwen3VLTokenizer"
