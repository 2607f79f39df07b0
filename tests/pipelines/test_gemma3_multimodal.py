"""Gemma 3 multimodal (``Gemma3ForConditionalGeneration``) against transformers on a tiny random checkpoint
(``vlm_support``): vision tower + projector output, prefill and decode logits with an image (bidirectional
attention inside the image block), greedy tokens alone and batched with a different image, images encoded
once per request, chunked prefill that never cuts an image, and bad image inputs."""

from __future__ import annotations

import base64

import numpy as np
import pytest

pytest.importorskip("PIL")

import torch  # noqa: E402

from vlm_support import check_steps, hf_inputs_gemma3, image_bytes, run_greedy, tiny_gemma3_vlm, with_llm  # noqa: E402

from max.interfaces import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def vlm():
    return with_llm(tiny_gemma3_vlm, 128)


@pytest.fixture(scope="module")
def alt_llm(vlm):
    """The same checkpoint with prefix caching on, 4-token pages and 9-token prefill chunks."""
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    return LLM(PipelineConfig(model_path=vlm[0], max_length=128, max_batch_size=2, kv_cache_page_size=4,
                              enable_prefix_caching=True, prefill_chunk_size=9))


_hf_inputs = hf_inputs_gemma3


def _hf_greedy(model, ctx, n):
    seq = ctx.prompt_tokens.tolist()
    with torch.no_grad():
        g = model.generate(**_hf_inputs(model, ctx, seq), max_new_tokens=n, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    return g[0, len(seq):].tolist()


def test_registered_and_listed():
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    register_all_models()
    arch = PIPELINE_REGISTRY.architectures["Gemma3ForConditionalGeneration"]
    assert arch.tokenizer.__name__ == "TextAndVisionTokenizer"


def test_vision_tower_and_projector_match_transformers(vlm):
    d, model, llm = vlm
    pm = llm.pipeline.pipeline_model
    ctx = llm.make_context("x", SamplingParams(max_new_tokens=1), images=[image_bytes(1), image_bytes(2, (17, 60))])
    px = np.stack(ctx.pixel_values)
    assert px.shape == (2, 3, 32, 32)
    from max.driver import Buffer

    (out,) = pm.vision_model.execute(Buffer.from_numpy(px))
    with torch.no_grad():
        ref = model.model.get_image_features(torch.from_numpy(px)).pooler_output.double().numpy()
    ours = out.to_numpy().astype(np.float64)
    assert ours.shape == ref.shape == (2, 4, 64)
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_prefill_and_decode_logits_match_transformers(vlm, n_images):
    """The prompt's image tokens get the image embeddings and attend to each other both ways (each image on
    its own); three decode steps after it (the embeddings are not recomputed) still match transformers'
    full forward.  Without images the model is Gemma 3's text decoder."""
    d, model, llm = vlm
    images = [image_bytes(3), image_bytes(33, (64, 16))][:n_images]
    ctx = llm.make_context("Describe the picture.", SamplingParams(max_new_tokens=8), images=images)
    assert [im.end_idx - im.start_idx for im in ctx.images] == [4] * n_images
    check_steps(llm, ctx, model, _hf_inputs)


def test_bidirectional_image_block_changes_the_result(vlm):
    """Without the block mask the image tokens would only see earlier ones: check the model really uses
    it by comparing with transformers run causally (no token_type_ids) -- they must differ."""
    d, model, llm = vlm
    ctx = llm.make_context("Describe.", SamplingParams(max_new_tokens=1), images=[image_bytes(4)])
    seq = ctx.tokens[:ctx.active_idx].tolist()
    inputs = _hf_inputs(model, ctx, seq)
    with torch.no_grad():
        bidi = model(**inputs).logits[0, -1].numpy()
        inputs.pop("token_type_ids")
        causal = model(**inputs).logits[0, -1].numpy()
    assert np.abs(bidi - causal).max() > 1e-3


def test_greedy_16_alone_and_batched_with_another_image(vlm):
    d, model, llm = vlm
    pm = llm.pipeline.pipeline_model
    reqs = [("What is in the image?", [image_bytes(5, (40, 28))]),
            ("Describe it.", [image_bytes(6, (13, 70), "JPEG")])]

    def run(rs):
        return run_greedy(llm, rs)

    n0 = pm.vision_encodes
    ctxs, alone = run(reqs[:1])
    assert pm.vision_encodes == n0 + 1  # once for the request, never again while decoding
    ctxs, both = run(reqs)
    assert pm.vision_encodes == n0 + 2  # both requests' images in one call
    want = [_hf_greedy(model, c, 16) for c in ctxs]
    assert alone == want[:1] and both == want
    assert len(set(map(tuple, want))) == 2, "the two images should lead to different outputs"
    mgr = llm.pipeline.kv_managers[0]
    assert mgr.num_free_pages == mgr.total_num_pages


def test_same_text_different_images_do_not_share_the_prefix_cache(vlm):
    d, model, llm = vlm
    a = llm.make_context("Same text.", SamplingParams(max_new_tokens=4), images=[image_bytes(7)])
    b = llm.make_context("Same text.", SamplingParams(max_new_tokens=4), images=[image_bytes(8)])
    assert a.tokens[:a.active_idx].tolist() == b.tokens[:b.active_idx].tolist()
    assert a.cache_salt != b.cache_salt


def test_prefix_cache_keeps_images_apart(vlm, alt_llm):
    """With prefix caching on, a request whose text matches an earlier one's but whose image differs must not
    reuse that request's pages (the placeholder tokens are the same; the images are not)."""
    d, model, llm = vlm
    cached = alt_llm
    a, b = image_bytes(30), image_bytes(31)
    first = cached.generate("Same words here.", max_new_tokens=8, images=[a], use_tqdm=False)
    assert cached.generate("Same words here.", max_new_tokens=8, images=[b], use_tqdm=False) == \
        llm.generate("Same words here.", max_new_tokens=8, images=[b], use_tqdm=False)
    assert cached.generate("Same words here.", max_new_tokens=8, images=[a], use_tqdm=False) == first


def test_chunked_prefill_never_cuts_an_image():
    from max.pipelines.core import ImageMetadata, TextAndVisionContext
    from max.pipelines.lib.step_plan import chunk_end

    px = np.zeros((3, 2, 2), np.float32)
    c = TextAndVisionContext(max_length=64, tokens=np.arange(30),
                             images=[ImageMetadata(5, 9, px), ImageMetadata(12, 20, px)])
    assert c.image_spans == ((5, 9), (12, 20))
    assert chunk_end(c.start_idx, 7, c.image_spans) == 5  # inside the first image: end before it
    assert chunk_end(c.start_idx, 10, c.image_spans) == 10
    c.set_token_indices(start_idx=12)
    assert chunk_end(c.start_idx, 14, c.image_spans) == 20  # the image starts the chunk: take all of it
    assert c.compute_image_aligned_idx(15) == 12 and c.image_idx == 1


def test_chunked_prefill_matches_unchunked(vlm, alt_llm, monkeypatch):
    """A prefill chunk size that would cut the image: the pipeline moves the cut, tokens are unchanged."""
    d, model, llm = vlm
    pm = alt_llm.pipeline.pipeline_model
    steps = []
    prepare = pm.prepare_initial_token_inputs

    def spy(ctxs, *a, **k):
        steps.extend((c.start_idx, c.active_idx, [(im.start_idx, im.end_idx) for im in c.images]) for c in ctxs)
        return prepare(ctxs, *a, **k)

    monkeypatch.setattr(pm, "prepare_initial_token_inputs", spy)
    img = image_bytes(9)
    out = alt_llm.generate("Look.", max_new_tokens=8, images=[img], use_tqdm=False)
    assert out == llm.generate("Look.", max_new_tokens=8, images=[img], use_tqdm=False)
    (lo, hi), = steps[0][2]
    assert lo < 9 < hi  # the chunk size would cut the image ...
    assert steps[0][:2] == (0, lo) and steps[1][:2] == (lo, lo + 9)  # ... so the first chunk ends before it


# --------------------------------------------------------------------------- bad input
def test_image_inputs_forms(vlm, tmp_path):
    d, model, llm = vlm
    raw = image_bytes(10)
    p = tmp_path / "im.png"
    p.write_bytes(raw)
    uri = "data:image/png;base64," + base64.b64encode(raw).decode()
    ctxs = [llm.make_context("Hi.", SamplingParams(max_new_tokens=2), images=[r]) for r in (raw, str(p), uri)]
    for c in ctxs[1:]:
        np.testing.assert_array_equal(c.pixel_values[0], ctxs[0].pixel_values[0])


@pytest.mark.parametrize("ref,match", [
    (image_bytes(11)[:80], "corrupt|not a readable image"),
    (b"this is not an image", "not a readable image"),
    (image_bytes(12, fmt="PPM"), "unsupported image format"),
    ("https://example.com/cat.png", "remote images"),
    ("data:text/plain;base64,aGk=", "image/\\* media type"),
    ("/no/such/file.png", "no such file"),
])
def test_bad_images_raise_before_any_work(vlm, ref, match):
    d, model, llm = vlm
    with pytest.raises(ValueError, match=match):
        llm.generate("Describe.", max_new_tokens=2, images=[ref], use_tqdm=False)


def test_image_urls_are_fetched_only_when_allowed(vlm, tmp_path, monkeypatch):
    import functools
    import http.server
    import threading

    from max.interfaces import TextGenerationRequest
    from max.pipelines.lib.tokenizer import TextAndVisionTokenizer

    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    d, model, llm = vlm
    raw = image_bytes(40)
    (tmp_path / "a.png").write_bytes(raw)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_port}"

    def request(url):
        return TextGenerationRequest(request_id="u", model_name="m", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}]}])

    try:
        with pytest.raises(ValueError, match="allow-image-urls"):
            llm.tokenizer.new_context_sync(request(base + "/a.png"))
        tok = TextAndVisionTokenizer(d, max_length=128, allow_image_urls=True)
        ctx = tok.new_context_sync(request(base + "/a.png"))
        want = llm.make_context("hi", SamplingParams(max_new_tokens=2), images=[raw])
        np.testing.assert_array_equal(ctx.pixel_values[0], want.pixel_values[0])
        assert ctx.tokens[:ctx.active_idx].tolist() == want.tokens[:want.active_idx].tolist()
        with pytest.raises(ValueError, match="HTTP 404"):
            tok.new_context_sync(request(base + "/missing.png"))
    finally:
        srv.shutdown()
        srv.server_close()


def test_too_many_images_for_the_context(vlm):
    d, model, llm = vlm
    with pytest.raises(ValueError, match="fewer or smaller images"):
        llm.generate("Describe.", max_new_tokens=2, images=[image_bytes(13)] * 16, use_tqdm=False)


def test_bad_request_leaves_the_others_alone(vlm):
    d, model, llm = vlm
    good = llm.generate("Describe it.", max_new_tokens=6, images=[image_bytes(14)], use_tqdm=False)
    with pytest.raises(ValueError):
        llm.generate(["Describe it.", "Again."], max_new_tokens=6, images=[[image_bytes(14)], [b"junk"]],
                     use_tqdm=False)
    assert llm.generate("Describe it.", max_new_tokens=6, images=[image_bytes(14)], use_tqdm=False) == good


def test_image_sent_to_a_text_only_tokenizer(vlm):
    from max.interfaces import TextGenerationRequest
    from max.pipelines.lib.tokenizer import TextTokenizer
    from max.entrypoints.llm import run_coro

    d, model, llm = vlm
    tok = TextTokenizer(d, max_length=128)
    req = TextGenerationRequest(request_id="r", model_name="m", prompt="hi", images=[image_bytes(15)])
    with pytest.raises(ValueError, match="takes text only"):
        run_coro(tok.new_context(req))
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                                         {"type": "text", "text": "hi"}]}]
    with pytest.raises(ValueError, match="text only"):
        run_coro(tok.new_context(TextGenerationRequest(request_id="r2", model_name="m", messages=msgs)))


# --------------------------------------------------------------------------- command line
def test_max_generate_with_images_and_max_list(vlm, tmp_path):
    from click.testing import CliRunner

    from max.entrypoints.cli import main

    d, model, llm = vlm
    paths = []
    for i, seed in enumerate((16, 17)):
        p = tmp_path / f"im{i}.png"
        p.write_bytes(image_bytes(seed, (30 + 10 * i, 20)))
        paths.append(str(p))
    want = llm.generate("Compare them.", max_new_tokens=8, images=paths, use_tqdm=False)[0]
    args = ["generate", "--model-path", d, "--devices", "cpu", "--max-length", "128", "--prompt", "Compare them.",
            "--max-new-tokens", "8", "--image", paths[0], "--image", paths[1]]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert want in res.output and "Prompt size:" in res.output
    bad = CliRunner().invoke(main, args[:-1] + [str(tmp_path / "missing.png")])
    assert bad.exit_code != 0 and "no such file" in bad.output
    listed = CliRunner().invoke(main, ["list"])
    assert "Gemma3ForConditionalGeneration\n    task: text_generation (text and images)" in listed.output
