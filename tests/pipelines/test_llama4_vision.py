"""Llama 4 with images (``Llama4ForConditionalGeneration``) against transformers on a tiny random checkpoint
(``vlm_support``: 32-pixel tiles of 8x8 patches, pixel shuffle 2, up to 4 tiles plus a global view):
vision encoder + projector output per tile, prefill and decode logits for 0/1/2 images, greedy tokens
alone and batched.  The image preprocessing (``Llama4Processor`` needs torchvision, absent here) is
checked against transformers' own canvas functions and prompt layout, read from its source at run time."""

from __future__ import annotations

import ast
import inspect
import math
from collections import defaultdict

import numpy as np
import pytest

pytest.importorskip("PIL")

import torch  # noqa: E402

from vlm_support import (  # noqa: E402
    Llama4Reference,
    check_greedy,
    check_steps,
    hf_inputs_llama4,
    image_bytes,
    tiny_llama4_vlm,
    with_llm,
)

from max.interfaces import SamplingParams  # noqa: E402
from max.pipelines.architectures.llama4vision.processor import best_canvas, resize_target  # noqa: E402


@pytest.fixture(scope="module")
def l4v():
    return with_llm(tiny_llama4_vlm, 512)


def test_tiles_through_the_encoder_and_projector_match_transformers(l4v):
    d, model, llm = l4v
    from max.pipelines.architectures.llama4vision.model import Llama4VisionLanguageModel
    from max.pipelines.lib.registry import PIPELINE_REGISTRY

    pm = llm.pipeline.pipeline_model
    assert type(pm) is Llama4VisionLanguageModel  # native, not the transformers fallback
    assert "Llama4ForConditionalGeneration" in PIPELINE_REGISTRY.architectures  # so in `max list`
    ctx = llm.make_context("x", SamplingParams(max_new_tokens=1),
                           images=[image_bytes(1, (70, 28)), image_bytes(2, (32, 32)), image_bytes(3, (90, 100))])
    assert len(ctx.pixel_values) == 4 + 1 + 5  # 1x3 tiles + global, one tile, 2x2 tiles + global
    assert [m.end_idx - m.start_idx for m in ctx.images] == [4] * 10
    ours = torch.cat(pm.encode([ctx])).double().numpy()
    with torch.no_grad():
        v = model.get_image_features(torch.from_numpy(np.stack(ctx.pixel_values))).last_hidden_state
        ref = model.multi_modal_projector(v.reshape(-1, v.shape[-1])).double().numpy()
    assert ours.shape == ref.shape == (40, 64)
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_prefill_and_decode_logits_match_transformers(l4v, n_images):
    d, model, llm = l4v
    images = [image_bytes(4, (70, 28)), image_bytes(5, (90, 100))][:n_images]
    ctx = llm.make_context("What is shown?", SamplingParams(max_new_tokens=8), images=images)
    check_steps(llm, ctx, Llama4Reference(model), hf_inputs_llama4)


def test_greedy_16_alone_and_batched(l4v):  # requests of 1, 0 and 2 images in one batch
    d, model, llm = l4v
    reqs = [("Describe it.", [image_bytes(6, (70, 28))]), ("Say hello.", []),
            ("Compare them.", [image_bytes(8, (90, 100)), image_bytes(9, (20, 50))])]
    check_greedy(llm, Llama4Reference(model), hf_inputs_llama4, reqs)


def _reference_canvas_functions() -> dict:
    """transformers' Llama 4 canvas functions, taken from its source (the module itself imports torchvision)."""
    import transformers.models.llama4 as pkg

    path = inspect.getfile(pkg).replace("__init__.py", "image_processing_llama4.py")
    tree = ast.parse(open(path, encoding="utf-8").read())
    names = {"get_factors", "get_max_res_without_distortion", "find_supported_resolutions", "get_best_fit"}
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    for fn in funcs:
        fn.decorator_list = []  # lru_cache over an unhashable size record: not needed here
    ns: dict = {"math": math, "torch": torch, "defaultdict": defaultdict, "SizeDict": object}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), path, "exec"), ns)
    assert names <= set(ns)
    return ns


def test_canvas_and_resize_match_transformers():
    ref = _reference_canvas_functions()

    class Size:
        height = width = 32

    rng = np.random.default_rng(0)
    for max_tiles in (1, 4, 6):
        res = torch.tensor(ref["find_supported_resolutions"](max_tiles, Size()))
        sizes = [(int(h), int(w)) for h, w in rng.integers(1, 200, (150, 2))] + [(32, 32), (64, 32), (31, 97)]
        for h, w in sizes:
            want = [int(x) for x in ref["get_best_fit"]((h, w), res)]
            rows, cols = best_canvas(h, w, 32, max_tiles)
            assert [rows * 32, cols * 32] == want, (h, w, max_tiles)
            limit = (min(max(h, 32), want[0]), min(max(w, 32), want[1]))
            assert resize_target(h, w, rows, cols, 32) == tuple(max(x, 1) for x in
                                                                 ref["get_max_res_without_distortion"]((h, w), limit))


def test_prompt_layout_matches_transformers(l4v):
    from transformers.models.llama4.processing_llama4 import Llama4Processor

    d, model, llm = l4v
    proc = llm.tokenizer.processor
    for rc in [(1, 1), (1, 3), (2, 2), (3, 1)]:
        assert proc.layout(*rc) == Llama4Processor._prompt_split_image(None, rc, 4)
    ctx = llm.make_context("Hi", SamplingParams(max_new_tokens=1), images=[image_bytes(1, (90, 100))])
    text = llm.tokenizer.delegate.decode(ctx.tokens[:ctx.active_idx].tolist())
    assert Llama4Processor._prompt_split_image(None, (2, 2), 4) in text
    pix = np.stack(ctx.pixel_values)
    assert pix.shape == (5, 3, 32, 32) and pix.min() >= -1 and pix.max() <= 1  # (x / 255 - 0.5) / 0.5


def test_placeholders_without_images_are_refused(l4v):
    from max.interfaces import TextGenerationRequest
    from max.interfaces.errors import InvalidRequest

    d, model, llm = l4v
    req = TextGenerationRequest(request_id="r", model_name="m", prompt="<|image|><|image|>Compare.",
                                images=[image_bytes(1, (70, 28))])
    with pytest.raises(InvalidRequest, match="2 image placeholders for 1 images"):
        llm.tokenizer.new_context_sync(req)
