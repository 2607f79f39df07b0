"""InternVL (``InternVLForConditionalGeneration``) against transformers on tiny random checkpoints
(``vlm_support``; 32-pixel tiles of 4x4 patches, pixel shuffle 2, the real GotOcr2 image processor
splitting each image into up to 4 tiles plus a thumbnail): InternViT + projector output per tile, prefill
and decode logits for 0/1/2 images, greedy tokens alone and batched.  A second checkpoint has InternViT's
other options (RMSNorm, QK norm, attention biases, the final LayerNorm) over a Llama decoder; two more take
their image features from a chosen vision layer."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PIL")

import torch  # noqa: E402

from vlm_support import (  # noqa: E402
    check_greedy,
    check_steps,
    hf_inputs_internvl,
    image_bytes,
    tiny_internvl,
    with_llm,
)

from max.interfaces import SamplingParams  # noqa: E402

OPTIONS = (("norm_type", "rms_norm"), ("use_qk_norm", True), ("attention_bias", True), ("use_mean_pooling", False))


@pytest.fixture(scope="module")
def ivl():
    return with_llm(tiny_internvl, 512)


@pytest.fixture(scope="module")
def ivl_options():
    return with_llm(lambda: tiny_internvl(vision_kw=OPTIONS, text_type="llama"), 512)


def _encode_matches(llm, model, images, n_tiles):
    pm = llm.pipeline.pipeline_model
    ctx = llm.make_context("x", SamplingParams(max_new_tokens=1), images=images)
    assert [len(p) for p in ctx.pixel_values] == n_tiles  # tiles + thumbnail, one placeholder span per image
    assert [m.end_idx - m.start_idx for m in ctx.images] == [4 * n for n in n_tiles]
    ours = torch.cat(pm.encode([ctx])).double().numpy()
    with torch.no_grad():
        ref = model.model.get_image_features(torch.from_numpy(np.concatenate(ctx.pixel_values))).pooler_output
    ref = ref.reshape(-1, ref.shape[-1]).double().numpy()
    assert ours.shape == ref.shape == (4 * sum(n_tiles), 64)
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


def test_tiles_through_internvit_and_projector_match_transformers(ivl):
    d, model, llm = ivl
    from max.pipelines.architectures.internvl.model import InternVLModel
    from max.pipelines.lib.registry import PIPELINE_REGISTRY

    assert type(llm.pipeline.pipeline_model) is InternVLModel  # native, not the transformers fallback
    assert "InternVLForConditionalGeneration" in PIPELINE_REGISTRY.architectures  # so in `max list`
    _encode_matches(llm, model, [image_bytes(1, (70, 28)), image_bytes(2, (32, 32)), image_bytes(3, (100, 100))],
                    [4, 1, 5])


def test_internvit_options_match_transformers(ivl_options):
    d, model, llm = ivl_options
    _encode_matches(llm, model, [image_bytes(1, (70, 28))], [4])


@pytest.mark.parametrize("layer", [-2, 3])  # the next-to-last layer; the last one's raw output (no final norm)
def test_features_from_a_chosen_vision_layer_match_transformers(layer):
    d, model, llm = with_llm(lambda: tiny_internvl(vision_kw=OPTIONS + (("num_hidden_layers", 3),),
                                                   top_kw=(("vision_feature_layer", layer),)), 512)
    _encode_matches(llm, model, [image_bytes(2, (20, 50))], [4])


@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_prefill_and_decode_logits_match_transformers(ivl, n_images):
    d, model, llm = ivl
    images = [image_bytes(4, (70, 28)), image_bytes(5, (100, 100))][:n_images]
    ctx = llm.make_context("What is shown?", SamplingParams(max_new_tokens=8), images=images)
    check_steps(llm, ctx, model, hf_inputs_internvl)


def test_options_checkpoint_logits_match_transformers(ivl_options):
    d, model, llm = ivl_options
    ctx = llm.make_context("What is shown?", SamplingParams(max_new_tokens=8), images=[image_bytes(6, (40, 40))])
    check_steps(llm, ctx, model, hf_inputs_internvl, n_decode=1)


def test_greedy_16_alone_and_batched(ivl):  # requests of 1, 0 and 2 images in one batch
    d, model, llm = ivl
    reqs = [("Describe it.", [image_bytes(6, (70, 28))]), ("Say hello.", []),
            ("Compare them.", [image_bytes(8, (100, 100)), image_bytes(9, (20, 50))])]
    check_greedy(llm, model, hf_inputs_internvl, reqs)


def test_chat_messages_use_the_template_and_bad_tile_counts_are_refused(ivl):
    d, model, llm = ivl
    tok = llm.tokenizer
    from max.interfaces import TextGenerationRequest
    from max.interfaces.errors import InvalidRequest

    msgs = [{"role": "user", "content": [{"type": "text", "text": "Look:"},
                                         {"type": "image", "image": image_bytes(1, (70, 28))}]}]
    ctx = tok.new_context_sync(TextGenerationRequest(request_id="r", model_name="m", messages=msgs))
    text = tok.delegate.decode(ctx.tokens[:ctx.active_idx].tolist())
    assert text.count("<img>") == 1 and text.count("<IMG_CONTEXT>") == 16 and "Look:" in text
    out = {"input_ids": np.array([[1] + [tok.image_token_id] * 6 + [2]]), "pixel_values": np.zeros((2, 3, 32, 32))}
    with pytest.raises(InvalidRequest, match="placeholder spans"):
        tok.split_images(out, "r")
