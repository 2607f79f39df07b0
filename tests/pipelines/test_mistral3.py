"""Mistral 3 (``Mistral3ForConditionalGeneration``: Pixtral vision encoder + Mistral decoder) against
transformers on a tiny random checkpoint (``vlm_support``; 4x4 patches, 2x2 spatial merge, images resized to
at most 48 pixels in multiples of 8, so every image has its own grid): the token layout of each image
(``[IMG]`` rows closed by ``[IMG_BREAK]``, the last by ``[IMG_END]``), the encoder + projector on images of
three sizes at once, prefill and decode logits for 0/1/2 images, greedy tokens alone and batched with
another image size, chunked prefill and the prefix cache around images with break tokens inside."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PIL")

import torch  # noqa: E402

from vlm_support import (  # noqa: E402
    M3_BREAK,
    M3_END,
    M3_IMG,
    check_greedy,
    check_steps,
    hf_inputs_mistral3,
    image_bytes,
    tiny_mistral3,
    with_llm,
)

from max.interfaces import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def m3():
    return with_llm(tiny_mistral3, 256)


_hf_inputs = hf_inputs_mistral3


def test_registered_and_listed():
    from click.testing import CliRunner

    from max.entrypoints.cli import main
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    register_all_models()
    listed = CliRunner().invoke(main, ["list"])
    for name in ("Mistral3ForConditionalGeneration", "LlavaForConditionalGeneration"):
        assert PIPELINE_REGISTRY.architectures[name].tokenizer.__name__ == "Mistral3Tokenizer"
        assert f"{name}\n    task: text_generation (text and images)" in listed.output


def test_each_image_is_laid_out_in_rows_with_break_and_end_tokens(m3):
    d, model, llm = m3
    ctx = llm.make_context("Compare.", SamplingParams(max_new_tokens=1),
                           images=[image_bytes(1, (40, 28)), image_bytes(2, (20, 50))])
    tok = llm.tokenizer.delegate
    ids = ctx.tokens[:ctx.active_idx]
    names = tok.convert_ids_to_tokens(ids.tolist())
    assert len(ctx.images) == 2 and [p.shape for p in ctx.pixel_values] == [(3, 32, 40), (3, 48, 24)]
    for im, px in zip(ctx.images, ctx.pixel_values):
        rows, cols = px.shape[1] // 8, px.shape[2] // 8
        want = ([M3_IMG] * cols + [M3_BREAK]) * rows
        want[-1] = M3_END
        assert names[im.start_idx:im.end_idx] == want
    img = model.config.image_token_id
    assert ctx.image_token_indices.tolist() == np.flatnonzero(ids == img).tolist() and len(ctx.image_token_indices) \
        == 4 * 5 + 6 * 3


def test_vision_encoder_and_projector_match_transformers(m3):
    d, model, llm = m3
    pm = llm.pipeline.pipeline_model
    ctx = llm.make_context("x", SamplingParams(max_new_tokens=1),
                           images=[image_bytes(1, (40, 28)), image_bytes(2, (20, 50)), image_bytes(3, (64, 64))])
    assert len({p.shape for p in ctx.pixel_values}) == 3
    ours = torch.cat(pm.encode([ctx])).double().numpy()
    kw = _hf_inputs(model, ctx, ctx.tokens[:ctx.active_idx].tolist())
    with torch.no_grad():
        ref = model.model.get_image_features(kw["pixel_values"], kw["image_sizes"]).pooler_output
    ref = torch.cat(list(ref)).double().numpy()
    assert ours.shape == ref.shape == (len(ctx.image_token_indices), 64)
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_prefill_and_decode_logits_match_transformers(m3, n_images):
    d, model, llm = m3
    images = [image_bytes(4, (40, 28)), image_bytes(5, (20, 50))][:n_images]
    ctx = llm.make_context("What is shown?", SamplingParams(max_new_tokens=8), images=images)
    check_steps(llm, ctx, model, _hf_inputs)


def test_greedy_16_alone_and_batched_with_another_image_size(m3):
    d, model, llm = m3
    reqs = [("Describe it.", [image_bytes(6, (40, 28))]), ("What is this?", [image_bytes(7, (20, 50))])]
    check_greedy(llm, model, _hf_inputs, reqs)


def test_greedy_two_images_batched_with_a_text_only_request(m3):
    d, model, llm = m3
    reqs = [("Compare them.", [image_bytes(10, (40, 28)), image_bytes(11, (64, 64))]), ("Say something.", [])]
    check_greedy(llm, model, _hf_inputs, reqs)


def test_chunked_prefill_and_prefix_cache_around_images(m3, monkeypatch):
    """9-token prefill chunks would cut the image (its span holds break tokens): the cut moves before it and
    the tokens are unchanged; with prefix caching on, the same text with another image reuses nothing of the
    first request's image."""
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, model, llm = m3
    alt = LLM(PipelineConfig(model_path=d, max_length=256, max_batch_size=2, kv_cache_page_size=4,
                             enable_prefix_caching=True, prefill_chunk_size=9))
    pm = alt.pipeline.pipeline_model
    steps = []
    prepare = pm.prepare_initial_token_inputs

    def spy(ctxs, *a, **k):
        steps.extend((c.start_idx, c.active_idx, [(im.start_idx, im.end_idx) for im in c.images]) for c in ctxs)
        return prepare(ctxs, *a, **k)

    monkeypatch.setattr(pm, "prepare_initial_token_inputs", spy)
    a, b = image_bytes(8, (40, 28)), image_bytes(9, (40, 28))
    first = alt.generate("Same words here.", max_new_tokens=8, images=[a], use_tqdm=False)
    assert first == llm.generate("Same words here.", max_new_tokens=8, images=[a], use_tqdm=False)
    (lo, hi), = steps[0][2]
    assert lo < 9 < hi and steps[0][:2] == (0, lo) and steps[1][:2] == (lo, hi)
    assert alt.generate("Same words here.", max_new_tokens=8, images=[b], use_tqdm=False) == \
        llm.generate("Same words here.", max_new_tokens=8, images=[b], use_tqdm=False)
    assert alt.generate("Same words here.", max_new_tokens=8, images=[a], use_tqdm=False) == first


# --------------------------------------------------------------------------- Llava over a Pixtral tower
@pytest.fixture(scope="module")
def llava():
    return with_llm(lambda: tiny_mistral3(longest_edge=32, llava=True), 256)


def test_llava_pixtral_encoder_and_projector_match_transformers(llava):
    d, model, llm = llava
    pm = llm.pipeline.pipeline_model
    ctx = llm.make_context("x", SamplingParams(max_new_tokens=1),
                           images=[image_bytes(1, (40, 28)), image_bytes(2, (20, 50))])
    assert [p.shape for p in ctx.pixel_values] == [(3, 24, 32), (3, 32, 12)]
    assert len(ctx.image_token_indices) == 6 * 8 + 8 * 3  # one token per 4x4 patch, no merge
    ours = torch.cat(pm.encode([ctx])).double().numpy()
    kw = _hf_inputs(model, ctx, ctx.tokens[:ctx.active_idx].tolist())
    with torch.no_grad():
        ref = model.model.get_image_features(kw["pixel_values"], image_sizes=kw["image_sizes"]).pooler_output
    ref = torch.cat(list(ref)).double().numpy()
    assert ours.shape == ref.shape == (72, 64)
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


def test_llava_pixtral_logits_and_greedy_match_transformers(llava):
    d, model, llm = llava
    ctx = llm.make_context("What is shown?", SamplingParams(max_new_tokens=8),
                           images=[image_bytes(4, (40, 28)), image_bytes(5, (20, 50))])
    check_steps(llm, ctx, model, _hf_inputs, n_decode=2)
    reqs = [("Describe it.", [image_bytes(6, (40, 28))]), ("What is this?", [image_bytes(7, (20, 50))])]
    check_greedy(llm, model, _hf_inputs, reqs)


def test_llava_with_another_vision_tower_is_refused():
    from max.pipelines.architectures.llava.config import vision_config_from_hf

    with pytest.raises(NotImplementedError, match="only a Pixtral vision tower"):
        vision_config_from_hf({"vision_config": {"model_type": "clip_vision_model"}, "text_config": {}})
    with pytest.raises(NotImplementedError, match="vision_feature_select_strategy 'full'"):
        vision_config_from_hf({"vision_config": {"model_type": "pixtral"}, "text_config": {},
                               "vision_feature_select_strategy": "default"})


def test_unsupported_configs_and_processor_output_are_refused(m3):
    from max.interfaces.errors import InvalidRequest
    from max.pipelines.architectures.mistral3.config import config_from_hf, vision_config_from_hf

    d, model, llm = m3
    hf = model.config.to_dict()
    with pytest.raises(NotImplementedError, match="list of vision_feature_layer"):
        vision_config_from_hf({**hf, "vision_feature_layer": [-1, -2]})
    with pytest.raises(ValueError, match="outside the 3 hidden states"):
        vision_config_from_hf({**hf, "vision_feature_layer": -4})
    rope = {"rope_type": "yarn", "factor": 16.0, "rope_theta": 1e6, "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 16384}
    with pytest.raises(NotImplementedError, match="llama_4_scaling_beta"):
        config_from_hf({**hf, "text_config": {**hf["text_config"], "rope_parameters": rope}})
    assert vision_config_from_hf({**hf, "vision_feature_layer": 1}).feature_layer == 1
    tok = llm.tokenizer
    px = np.zeros((1, 3, 16, 16), np.float32)
    with pytest.raises(InvalidRequest, match="whole 8-pixel tokens"):
        tok.split_images({"pixel_values": px, "image_sizes": np.array([[16, 12]])}, "r")
    assert [p.shape for p in tok.split_images({"pixel_values": px, "image_sizes": np.array([[16, 8]])}, "r")[0]] == \
        [(3, 16, 8)]
