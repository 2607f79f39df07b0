"""Qwen3-VL (``Qwen3VLForConditionalGeneration``) and Qwen3-VL-MoE against transformers on tiny random
checkpoints (``qwen3vl_support``: 4x4 patches, 2x2 merge, a 4x4 learned position table resampled per image,
DeepStack from vision blocks 0 and 1 into decoder layers 0 and 1, interleaved M-RoPE): the vision tower and
its DeepStack features on images of different sizes; prefill and decode logits for 0/1/2 images and for a
short video (alone and with an image); greedy tokens alone and batched, pages freed.  Video preprocessing
against transformers' own pieces (frame size, timestamps, patch layout); bad videos are clear 400s."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("av")

import torch  # noqa: E402

from qwen3vl_support import MAX_FRAMES, hf_inputs_qwen3_vl, tiny_qwen3_vl, video_bytes, video_request  # noqa: E402
from vlm_support import check_greedy, check_steps, image_bytes  # noqa: E402

from max.interfaces import SamplingParams  # noqa: E402
from max.interfaces.errors import InvalidRequest  # noqa: E402


def _llm(moe: bool):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, model, _ = tiny_qwen3_vl(moe)
    return d, model, LLM(PipelineConfig(model_path=d, max_length=320, max_batch_size=4, kv_cache_page_size=16))


@pytest.fixture(scope="module")
def dense():
    return _llm(False)


@pytest.fixture(scope="module")
def moe():
    return _llm(True)


def test_vision_tower_and_deepstack_match_transformers(dense):
    d, model, llm = dense
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
def test_prefill_and_decode_logits_match_transformers(dense, n_images):
    d, model, llm = dense
    images = [image_bytes(4, (40, 28)), image_bytes(5, (20, 50))][:n_images]
    ctx = llm.make_context("What is shown?", SamplingParams(max_new_tokens=8), images=images)
    check_steps(llm, ctx, model, hf_inputs_qwen3_vl)


@pytest.mark.parametrize("with_image", [False, True], ids=["video", "image+video"])
def test_video_logits_match_transformers(dense, with_image):
    d, model, llm = dense
    ctx = video_request(llm.tokenizer, "What happens?", video_bytes(1),
                        images=(image_bytes(3, (20, 50)),) if with_image else ())
    assert ctx.extra_model_args["run_is_video"].tolist() == [False] * with_image + [True, True]
    assert ctx.extra_model_args["video_grid_thw"].tolist() == [[2, 6, 8]]
    check_steps(llm, ctx, model, hf_inputs_qwen3_vl, n_decode=3 - 2 * with_image)


def test_greedy_16_alone_and_batched_with_another_image_size(dense):
    d, model, llm = dense
    reqs = [("Describe it.", [image_bytes(6, (40, 28))]), ("What is this?", [image_bytes(7, (20, 50))])]
    check_greedy(llm, model, hf_inputs_qwen3_vl, reqs)


def _greedy_with_video(llm, model, ctxs, n=10):
    """Greedy tokens of ``ctxs`` run together equal ``transformers.generate``'s; the pages are freed."""
    got = {c.request_id: [] for c in ctxs}
    for c in ctxs:
        llm.scheduler.submit(c, lambda o: got[o.request_id].extend(o.tokens))
    llm.scheduler.run_until_idle()
    for c in ctxs:
        seq = c.prompt_tokens.tolist()
        with torch.no_grad():
            g = model.generate(**hf_inputs_qwen3_vl(model, c, seq), max_new_tokens=n, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
        assert got[c.request_id] == g[0, len(seq):].tolist()
    mgr = llm.pipeline.kv_managers[0]
    assert mgr.num_free_pages == mgr.total_num_pages


def test_greedy_video_alone_and_batched_with_an_image_request(dense):
    d, model, llm = dense
    video = video_bytes(2, (36, 44), n_frames=10, fps=5)
    _greedy_with_video(llm, model, [video_request(llm.tokenizer, "Describe the clip.", video, max_new_tokens=10)])
    _greedy_with_video(llm, model, [
        video_request(llm.tokenizer, "Describe the clip.", video, max_new_tokens=10),
        llm.make_context("What is this?", SamplingParams(top_k=1, max_new_tokens=10, ignore_eos=True),
                         images=[image_bytes(8, (20, 50))])])


def test_chunked_prefill_adds_each_chunks_deepstack_rows(dense):
    """Prefill in 20-token chunks (an image and two video frames of 12 tokens each in an 87-token prompt):
    each chunk gets the embeddings and DeepStack features of its own image rows; the images are encoded once."""
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, model, _ = dense
    llm = LLM(PipelineConfig(model_path=d, max_length=320, max_batch_size=2, kv_cache_page_size=16,
                             prefill_chunk_size=20))
    ctx = video_request(llm.tokenizer, "Describe the clip.", video_bytes(2, (36, 44), n_frames=10, fps=5),
                        images=(image_bytes(3, (20, 50)),), max_new_tokens=8)
    assert len(ctx.prompt_tokens) == 87 and [(m.start_idx, m.end_idx) for m in ctx.images] == [(5, 17), (29, 41),
                                                                                                 (52, 64)]
    _greedy_with_video(llm, model, [ctx], n=8)
    assert llm.pipeline.pipeline_model.vision_encodes == 1


def test_moe_logits_and_greedy_match_transformers(moe):
    d, model, llm = moe
    ctx = llm.make_context("What is shown?", SamplingParams(max_new_tokens=8), images=[image_bytes(4, (40, 28))])
    check_steps(llm, ctx, model, hf_inputs_qwen3_vl)
    _greedy_with_video(llm, model, [
        video_request(llm.tokenizer, "Describe the clip.", video_bytes(3), max_new_tokens=6),
        llm.make_context("What is this?", SamplingParams(top_k=1, max_new_tokens=6, ignore_eos=True),
                         images=[image_bytes(9, (40, 28))])], n=6)


def test_moe_experts_read_in_either_layout():
    from max.pipelines.architectures.qwen3vl_moe.weight_adapters import _expert

    g = torch.Generator().manual_seed(0)
    gate_up, down = torch.randn(3, 2 * 5, 7, generator=g), torch.randn(3, 7, 5, generator=g)  # transformers' layout
    for which, want in (("gate", gate_up[:, :5]), ("up", gate_up[:, 5:]), ("down", down)):
        assert torch.equal(_expert(which, gate_up, down), want)
        assert torch.equal(_expert(which, gate_up.transpose(1, 2), down.transpose(1, 2)), want)
    with pytest.raises(ValueError, match="do not fit"):
        _expert("gate", gate_up, down[:, :, :4])


def test_video_preprocessing_matches_transformers_pieces(dense):
    from PIL import Image
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor, smart_resize

    from max.pipelines.architectures.qwen3vl.processor import (
        frame_timestamps,
        preprocess_video,
        sample_indices,
        video_smart_resize,
    )

    s = dense[2].tokenizer.video_settings
    for n, h, w in [(4, 28, 40), (8, 100, 30), (5, 7, 300), (2, 64, 64), (12, 17, 19)]:
        assert video_smart_resize(n, h, w, s) == smart_resize(n, h, w, s.temporal_patch_size, 8, s.min_pixels,
                                                              s.max_pixels)
    for idx, fps in [([0, 2, 5, 7], 4.0), ([0, 3, 6], 2.5), ([1], 30.0)]:
        assert frame_timestamps(idx, fps, 2) == Qwen3VLProcessor._calculate_timestamps(None, list(idx), fps, 2)
    assert sample_indices(8, 4.0, s).tolist() == [0, 2, 5, 7]  # 2 frames a second, at least min_frames=4
    assert sample_indices(100, 10.0, s).tolist() == np.linspace(0, 99, 12).round().astype(int).tolist()  # max 12
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (30, 44, 3), dtype=np.uint8) for _ in range(5)]
    patches, grid = preprocess_video(frames, s)
    rh, rw = video_smart_resize(5, 30, 44, s)
    clip = torch.from_numpy(np.stack([np.asarray(Image.fromarray(f).resize((rw, rh), Image.Resampling.BICUBIC),
                                                 np.float32) / 255 for f in frames]))
    clip = ((clip - 0.5) / 0.5).permute(0, 3, 1, 2)[None]
    ref, gt, gh, gw = Qwen3VLVideoProcessor.patchify(None, clip, 4, 2, 2)
    assert grid == (gt, gh, gw) == (3, rh // 4, rw // 4)
    np.testing.assert_allclose(patches, ref[0].numpy(), rtol=0, atol=1e-6)


def test_a_video_given_as_frame_images(dense):
    d, model, llm = dense
    frames = [image_bytes(30 + i, (40, 28)) for i in range(6)]
    ctx = video_request(llm.tokenizer, "And this?", frames, fps=2)
    text = llm.tokenizer.delegate.decode(ctx.tokens[:ctx.active_idx])
    assert [t for t in ("<0.2 seconds>", "<1.2 seconds>", "<2.2 seconds>") if t in text] == \
        ["<0.2 seconds>", "<1.2 seconds>", "<2.2 seconds>"]
    assert ctx.extra_model_args["video_grid_thw"].tolist() == [[3, 4, 6]]  # 6 frames of 40x28 within 4096 pixels
    check_steps(llm, ctx, model, hf_inputs_qwen3_vl, n_decode=1)


@pytest.mark.parametrize("video,match", [
    (b"not a video at all", "not a readable video|corrupt"),
    (b"", "empty|needs video_url.url"),
    ("video-frames-too-many", f"more than the {MAX_FRAMES}"),
    ("one-frame", "at least 2 frames"),
    ("/no/such/video.mp4", "no such file"),
    ("https://example.com/clip.mp4", "remote videos"),
    ("data:image/png;base64,AAAA", "video/\\* media type"),
])
def test_bad_videos_are_invalid_requests_naming_the_field(dense, video, match):
    d, model, llm = dense
    if video == "video-frames-too-many":
        video = [image_bytes(40, (20, 20))] * (MAX_FRAMES + 1)
    elif video == "one-frame":
        video = video_bytes(4, n_frames=1)
    elif video == b"":
        video = "data:video/mp4;base64,"
    if isinstance(video, str) and video.startswith(("data:", "http", "/")):
        with pytest.raises(InvalidRequest, match=match) as e:
            _request_with_url(llm.tokenizer, video)
    else:
        with pytest.raises(InvalidRequest, match=match) as e:
            video_request(llm.tokenizer, "x", video if not isinstance(video, str) else [video])
    assert e.value.param in ("video_url", "images")


def test_a_video_too_long_for_max_length_is_refused_before_any_model_work(dense):
    from max.interfaces.errors import PromptTooLong
    from max.pipelines.architectures.qwen3vl.processor import Qwen3VLTokenizer

    tok = Qwen3VLTokenizer(dense[0], max_length=40)
    with pytest.raises(PromptTooLong, match="shorter or smaller videos"):
        video_request(tok, "x", video_bytes(5))


def _request_with_url(tokenizer, url):
    import uuid

    from max.entrypoints.llm import run_coro
    from max.interfaces import TextGenerationRequest

    req = TextGenerationRequest(request_id=uuid.uuid4().hex, model_name="tiny", prompt=None, messages=[
        {"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "x"}]}],
        sampling_params=SamplingParams(max_new_tokens=1))
    return run_coro(tokenizer.new_context(req))


def test_models_without_video_refuse_video_parts(dense):
    from max.pipelines.architectures.qwen2_5vl.processor import Qwen2VLTokenizer
    from max.pipelines.lib.tokenizer import _flatten_content

    tok = Qwen2VLTokenizer(dense[0])
    with pytest.raises(InvalidRequest, match="does not take video") as e:
        _request_with_url(tok, "data:video/mp4;base64,AAAA")
    assert e.value.param == "video_url"
    with pytest.raises(InvalidRequest, match="text only"):
        _flatten_content([{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "x.mp4"}}]}])


@pytest.mark.parametrize("name", ["Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration"])
def test_registered_with_the_vision_tokenizer(name):
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models
    from max.pipelines.lib.tokenizer import TextAndVisionTokenizer

    register_all_models()
    arch = PIPELINE_REGISTRY.architectures[name]
    assert issubclass(arch.tokenizer, TextAndVisionTokenizer) and arch.tokenizer.__name__ == "Qwen3VLTokenizer"
