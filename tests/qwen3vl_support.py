"""Tiny random-weight ``Qwen3VLForConditionalGeneration`` / ``Qwen3VLMoeForConditionalGeneration`` checkpoints
(transformers' config classes, reduced sizes) with a locally trained tokenizer, Qwen2-VL's image processor
and a chat template with image and video parts, plus transformers' inputs for a context (unique module name)."""

from __future__ import annotations

import functools
import io
import json
import os
import tempfile
from typing import Any

from vlm_support import _SPECIALS, IP, VE, VS, _over, text_inputs

VP = "<|video_pad|>"

QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}" + VS + IP + VE +
    "{% elif p['type'] == 'video' %}" + VS + VP + VE +
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@functools.lru_cache(maxsize=None)
def tiny_qwen3_vl(moe: bool = False, text_kw: tuple = (), vision_kw: tuple = (),
                  max_pixels: int = 48 * 48) -> tuple[str, Any, Any]:
    """``(folder, hf_model, image_processor)``: 4x4 patches, 2x2 merge, a 4x4 table of learned position
    embeddings, 3 vision blocks of which blocks 0 and 1 feed DeepStack into decoder layers 0 and 1 (of 3);
    ``moe``: the text decoder's MLPs are 4 experts, top 2 (layer 1 dense)."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    from lm_support import _bpe_json

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_bpe_json(600, _SPECIALS)), bos_token="<s>", eos_token="</s>",
        pad_token="<pad>", chat_template=QWEN3_TEMPLATE,
        extra_special_tokens={"image_token": IP, "vision_start_token": VS, "vision_end_token": VE})
    tok.add_tokens([VP], special_tokens=True)
    text = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                         "mrope_interleaved": True},
        initializer_range=0.2, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)
    if moe:
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, mlp_only_layers=[1])
    text = _over(text, text_kw)
    vision = _over(dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=64, patch_size=4,
                        spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                        deepstack_visual_indexes=[0, 1], in_channels=3, initializer_range=0.2), vision_kw)
    ids = dict(image_token_id=tok.convert_tokens_to_ids(IP), video_token_id=tok.convert_tokens_to_ids(VP),
               vision_start_token_id=tok.convert_tokens_to_ids(VS), vision_end_token_id=tok.convert_tokens_to_ids(VE))
    if moe:
        cfg = transformers.Qwen3VLMoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **ids)
        cls = transformers.Qwen3VLMoeForConditionalGeneration
    else:
        cfg = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **ids)
        cls = transformers.Qwen3VLForConditionalGeneration
    torch.manual_seed(0)
    model = cls(cfg).eval().float()
    with torch.no_grad():  # norms and biases that initialise to 1/0 made to matter; experts made non-trivial
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "norm1.weight", "norm2.weight")):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias") or "pos_embed" in name:
                p.normal_(0, 0.3)
            elif "experts" in name:
                p.normal_(0, 0.2)
    side = vision["patch_size"] * 4
    ip = transformers.Qwen2VLImageProcessorPil(patch_size=vision["patch_size"], merge_size=2, temporal_patch_size=2,
                                               min_pixels=side * side, max_pixels=max_pixels)
    d = tempfile.mkdtemp(prefix="libremax-qwen3_vl-")
    model.save_pretrained(d)
    ip.save_pretrained(d)  # (no Qwen3VLProcessor: its video processor needs torchvision)
    tok.save_pretrained(d)
    with open(os.path.join(d, "chat_template.jinja"), "w") as f:
        f.write(QWEN3_TEMPLATE)
    with open(os.path.join(d, "video_preprocessor_config.json"), "w") as f:  # transformers' names; small frames
        json.dump({"video_processor_type": "Qwen3VLVideoProcessor", "patch_size": vision["patch_size"],
                   "temporal_patch_size": 2, "merge_size": 2, "fps": 2, "min_frames": 4, "max_frames": MAX_FRAMES,
                   "size": {"shortest_edge": 2 * side * side, "longest_edge": 4 * 32 * 32},
                   "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}, f)
    return d, model, ip


MAX_FRAMES = 12
"""The tiny checkpoints' ``max_frames``."""


def video_bytes(seed: int, size: tuple[int, int] = (40, 28), n_frames: int = 8, fps: int = 4) -> bytes:
    """An MPEG-4 video of ``n_frames`` random frames (``size`` = width, height) at ``fps``, made with PyAV."""
    import av
    import numpy as np

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        for _ in range(n_frames):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8),
                                               format="rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()


def video_request(tokenizer: Any, text: str, video: Any, images: tuple = (), fps: Any = None,
                  max_new_tokens: int = 8) -> Any:
    """A context for a user turn of ``images``, a ``video_url`` part (``video``: bytes -> a data: URI; a list:
    frame images as a ``video`` part) and ``text``."""
    import base64
    import uuid

    from max.interfaces import SamplingParams, TextGenerationRequest
    from max.entrypoints.llm import run_coro

    if isinstance(video, (bytes, bytearray)):
        part = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(video).decode()}}
    else:
        part = {"type": "video", "video": list(video), **({"fps": fps} if fps else {})}
    content = [*({"type": "image", "image": im} for im in images), part, {"type": "text", "text": text}]
    req = TextGenerationRequest(request_id=uuid.uuid4().hex, model_name="tiny", prompt=None,
                                messages=[{"role": "user", "content": content}],
                                sampling_params=SamplingParams(top_k=1, max_new_tokens=max_new_tokens,
                                                               ignore_eos=True))
    return run_coro(tokenizer.new_context(req))


def hf_inputs_qwen3_vl(model: Any, ctx: Any, seq: list[int]) -> dict:
    """transformers' inputs of ``ctx`` with the tokens ``seq``: images as ``pixel_values``, videos as
    ``pixel_values_videos`` (their grids as the context's ``video_grid_thw``); ``mm_token_type_ids`` marks
    image (1) and video (2) tokens."""
    import numpy as np
    import torch

    kw = text_inputs(seq)
    ids = kw["input_ids"]
    if ctx.pixel_values:
        cfg = model.config
        is_video = np.asarray(ctx.extra_model_args.get("run_is_video", [False] * len(ctx.pixel_values)), bool)
        runs = list(ctx.pixel_values)
        grids = np.asarray(ctx.extra_model_args["image_grid_thw"]).reshape(-1, 3)
        if (~is_video).any():
            kw.update(pixel_values=torch.from_numpy(np.concatenate([r for r, v in zip(runs, is_video) if not v])),
                      image_grid_thw=torch.from_numpy(grids[~is_video]))
        if is_video.any():
            kw.update(pixel_values_videos=torch.from_numpy(np.concatenate([r for r, v in zip(runs, is_video) if v])),
                      video_grid_thw=torch.from_numpy(np.asarray(ctx.extra_model_args["video_grid_thw"])))
        kw["mm_token_type_ids"] = ((ids == cfg.image_token_id).int() + 2 * (ids == cfg.video_token_id).int())
    return kw
