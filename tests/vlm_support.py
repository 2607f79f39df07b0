"""A tiny random-weight ``Gemma3ForConditionalGeneration`` checkpoint (transformers' own config classes,
reduced sizes) saved with a locally trained tokenizer and a real ``Gemma3Processor``, plus generated
images, shared by the pipeline and serving tests of vision-language models (unique module name)."""

from __future__ import annotations

import functools
import io
import os
import tempfile
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

BOI, IMG, EOI = "<start_of_image>", "<image_soft_token>", "<end_of_image>"
SOT, EOT = "<start_of_turn>", "<end_of_turn>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}" + SOT + "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}" + BOI + "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}" + EOT + "\n{% endfor %}{% if add_generation_prompt %}" + SOT + "model\n{% endif %}")
IMAGE_SIZE, PATCH, MM_TOKENS = 32, 8, 4
VS, IP, VE = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
FAKE, IMAGE, GLOBAL, EOU = "<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"
_SPECIALS = (BOI, IMG, EOI, SOT, EOT, VS, IP, VE, FAKE, IMAGE, GLOBAL, EOU)
"""Every family's special tokens in one vocabulary: the BPE is trained once per process."""


def image_bytes(seed: int, size: tuple[int, int] = (40, 28), fmt: str = "PNG") -> bytes:
    """A random RGB image encoded as ``fmt``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def _over(defaults: dict, changes: tuple) -> dict:
    """``defaults`` updated with ``changes``: ``(key, value)`` pairs, hashable for the builders' caches (a value
    that is itself a tuple of pairs becomes a dict, any other tuple a list)."""
    def plain(v: Any) -> Any:
        if isinstance(v, tuple) and v and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str)
                                              for x in v):
            return {k: plain(x) for k, x in v}
        return list(v) if isinstance(v, tuple) else v

    return {**defaults, **{k: plain(v) for k, v in changes}}


@functools.lru_cache(maxsize=None)
def tiny_gemma3_vlm(text_kw: tuple = (), vision_kw: tuple = (), mm_tokens: int = MM_TOKENS) -> tuple[str, Any, Any]:
    """``(folder, hf_model, processor)``: the checkpoint, its transformers model (float32, eval) and
    processor.  ``text_kw``/``vision_kw`` (``(key, value)`` pairs) change the sizes (benchmarks)."""
    import torch
    import transformers

    from tokenizers import Tokenizer

    from lm_support import _bpe_json

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_bpe_json(600, _SPECIALS)), bos_token="<s>",
        eos_token="</s>", pad_token="<pad>", chat_template=CHAT_TEMPLATE,
        extra_special_tokens={"boi_token": BOI, "image_token": IMG, "eoi_token": EOI})
    text = transformers.Gemma3TextConfig(**_over(dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256, initializer_range=0.2,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False), text_kw))  # a tied random head mostly repeats the last token
    vision = transformers.SiglipVisionConfig(**_over(dict(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, image_size=IMAGE_SIZE,
        patch_size=PATCH, layer_norm_eps=1e-6, vision_use_head=False), vision_kw))
    cfg = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                    mm_tokens_per_image=mm_tokens, image_token_index=tok.convert_tokens_to_ids(IMG),
                                    boi_token_index=tok.convert_tokens_to_ids(BOI),
                                    eoi_token_index=tok.convert_tokens_to_ids(EOI),
                                    eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                                    pad_token_id=tok.pad_token_id, initializer_range=0.2,
                                    tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(cfg).eval().float()
    with torch.no_grad():  # norms and biases that initialise to 0/1 made to matter
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight", "layer_norm1.weight", "layer_norm2.weight")):
                p.uniform_(-0.5, 0.5) if "language_model" in name or "mm_soft" in name else p.uniform_(0.5, 1.5)
            elif name.endswith(".bias") or "position_embedding" in name or "mm_input_projection" in name:
                p.normal_(0, 0.3)
    ip = transformers.Gemma3ImageProcessorPil(size={"height": vision.image_size, "width": vision.image_size})
    proc = transformers.Gemma3Processor(image_processor=ip, tokenizer=tok, chat_template=CHAT_TEMPLATE,
                                        image_seq_length=mm_tokens)
    d = tempfile.mkdtemp(prefix="libremax-gemma3-vlm-")
    model.save_pretrained(d)
    proc.save_pretrained(d)
    return d, model, proc


QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}" + VS + IP + VE +
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@functools.lru_cache(maxsize=None)
def tiny_qwen2_5_vl(text_kw: tuple = (), vision_kw: tuple = (), max_pixels: int = 48 * 48) -> tuple[str, Any, Any]:
    """``(folder, hf_model, processor)``: a tiny random ``Qwen2_5_VLForConditionalGeneration`` (4x4 patches,
    2x2 merge, 16-pixel windows: a 32x32 image has 4 windows; block 1 of 2 attends over the whole image)."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    from lm_support import _bpe_json

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_bpe_json(600, _SPECIALS)), bos_token="<s>", eos_token="</s>",
        pad_token="<pad>", chat_template=QWEN_TEMPLATE,
        extra_special_tokens={"image_token": IP, "vision_start_token": VS, "vision_end_token": VE})
    text = _over(dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        initializer_range=0.2, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id), text_kw)
    vision = _over(dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=64, patch_size=4,
                        spatial_merge_size=2, temporal_patch_size=2, window_size=16, fullatt_block_indexes=[1],
                        in_channels=3, hidden_act="silu", initializer_range=0.2), vision_kw)
    cfg = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision,
                                        image_token_id=tok.convert_tokens_to_ids(IP),
                                        vision_start_token_id=tok.convert_tokens_to_ids(VS),
                                        vision_end_token_id=tok.convert_tokens_to_ids(VE), tie_word_embeddings=False,
                                        initializer_range=0.2)
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(cfg).eval().float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "ln_q.weight", "norm1.weight", "norm2.weight")):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0, 0.3)
    side = vision["patch_size"] * 4
    ip = transformers.Qwen2VLImageProcessorPil(patch_size=vision["patch_size"], merge_size=2, temporal_patch_size=2,
                                               min_pixels=side * side, max_pixels=max_pixels)
    d = tempfile.mkdtemp(prefix="libremax-qwen2_5_vl-")
    model.save_pretrained(d)
    ip.save_pretrained(d)  # (no Qwen2_5_VLProcessor: its video processor needs torchvision)
    tok.save_pretrained(d)
    with open(os.path.join(d, "chat_template.jinja"), "w") as f:
        f.write(QWEN_TEMPLATE)
    return d, model, ip


def check_steps(llm: Any, ctx: Any, hf_model: Any, hf_inputs: Any, n_decode: int = 3) -> None:
    """Prefill ``ctx`` and decode ``n_decode`` greedy steps through the pipeline model, comparing each step's
    logits with transformers' full forward over the tokens so far (``hf_model(**hf_inputs(hf_model, ctx,
    ids))``, within 1e-4 of the logit range); the images are encoded exactly once."""
    import numpy as np
    import torch

    from family_support import assert_close

    def hf_logits(ids: list[int]) -> Any:
        with torch.no_grad():
            return hf_model(**hf_inputs(hf_model, ctx, ids)).logits[0, -1].double().numpy()

    pm = llm.pipeline.pipeline_model
    mgr = pm.kv_manager
    before = pm.vision_encodes
    seq = ctx.tokens[:ctx.active_idx].tolist()
    mgr.claim(ctx.request_id)
    try:
        for step in range(n_decode + 1):
            kv = mgr.fetch([ctx])
            logits = pm.execute(pm.prepare_initial_token_inputs([ctx], kv)).logits.numpy()[0]
            assert_close(logits, hf_logits(seq), f"step {step}")
            tok = int(np.argmax(logits))
            seq.append(tok)
            ctx.update(tok)
            mgr.step([ctx])
    finally:
        mgr.release(ctx.request_id)
    assert pm.vision_encodes == before + (1 if ctx.pixel_values else 0)


def run_greedy(llm: Any, requests: list[tuple[str, list]], n: int = 16) -> tuple[list, list[list[int]]]:
    """``(contexts, tokens)``: ``requests`` ``[(prompt, images)]`` submitted together, ``n`` greedy tokens each."""
    from max.interfaces import SamplingParams

    params = SamplingParams(top_k=1, max_new_tokens=n, ignore_eos=True)
    ctxs = [llm.make_context(p, params, images=ims) for p, ims in requests]
    got: dict[str, list[int]] = {c.request_id: [] for c in ctxs}
    for c in ctxs:
        llm.scheduler.submit(c, lambda o: got[o.request_id].extend(o.tokens))
    llm.scheduler.run_until_idle()
    return ctxs, [got[c.request_id] for c in ctxs]


IDEFICS_TEMPLATE = (
    "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}:{% if m['content'] is string %}"
    "{{ ' ' + m['content'] }}{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>"
    "{% elif p['type'] == 'text' %}{{ ' ' + p['text'] }}{% endif %}{% endfor %}{% endif %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}")


@functools.lru_cache(maxsize=None)
def tiny_idefics3(text_kw: tuple = (), vision_kw: tuple = ()) -> tuple[str, Any, Any]:
    """``(folder, hf_model, processor)``: a tiny random ``Idefics3ForConditionalGeneration`` (32-pixel tiles of
    8x8 patches, pixel shuffle 2: 4 tokens per tile; images split into up to 2x2 tiles plus a global one)."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    from lm_support import _bpe_json

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_bpe_json(600, _SPECIALS)),
        bos_token="<s>", eos_token="</s>", pad_token="<pad>", chat_template=IDEFICS_TEMPLATE,
        extra_special_tokens={"fake_image_token": FAKE, "image_token": IMAGE, "global_image_token": GLOBAL,
                              "end_of_utterance_token": EOU})
    text = _over(dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id), text_kw)
    vision = _over(dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                        patch_size=8, initializer_range=0.2), vision_kw)
    cfg = transformers.Idefics3Config(text_config=text, vision_config=vision, scale_factor=2,
                                      image_token_id=tok.convert_tokens_to_ids(IMAGE), tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Idefics3ForConditionalGeneration(cfg).eval().float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight", "layer_norm1.weight", "layer_norm2.weight")):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias") or "position_embedding" in name:
                p.normal_(0, 0.3)
    tile = vision["image_size"]
    ip = transformers.Idefics3ImageProcessorPil(size={"longest_edge": 2 * tile}, max_image_size={"longest_edge": tile})
    proc = transformers.Idefics3Processor(image_processor=ip, tokenizer=tok,
                                          image_seq_len=(tile // vision["patch_size"] // 2) ** 2,
                                          chat_template=IDEFICS_TEMPLATE)
    d = tempfile.mkdtemp(prefix="libremax-idefics3-")
    model.save_pretrained(d)
    proc.save_pretrained(d)
    return d, model, proc


def check_greedy(llm: Any, hf_model: Any, hf_inputs: Any, requests: list[tuple[str, list]], n: int = 16) -> None:
    """``n`` greedy tokens of each request equal ``transformers.generate``'s, the first request alone and all of
    them batched; the requests' outputs differ."""
    import torch

    def hf_greedy(ctx: Any) -> list[int]:
        seq = ctx.prompt_tokens.tolist()
        with torch.no_grad():
            g = hf_model.generate(**hf_inputs(hf_model, ctx, seq), max_new_tokens=n, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)
        return g[0, len(seq):].tolist()

    _, alone = run_greedy(llm, requests[:1], n)
    ctxs, both = run_greedy(llm, requests, n)
    want = [hf_greedy(c) for c in ctxs]
    assert alone == want[:1] and both == want
    assert len({tuple(w) for w in want}) == len(want), "different images should lead to different outputs"
    mgr = llm.pipeline.kv_managers[0]
    assert mgr.num_free_pages == mgr.total_num_pages


def with_llm(build: Any, max_length: int) -> tuple[str, Any, Any]:
    """``(folder, hf_model, LLM)`` for a checkpoint builder of this module."""
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, model, _ = build()
    return d, model, LLM(PipelineConfig(model_path=d, max_length=max_length, max_batch_size=4, kv_cache_page_size=16))


# --------------------------------------------------------------------------- transformers' inputs of a context
def text_inputs(seq: list[int]) -> dict:
    """transformers' ``input_ids`` and ``attention_mask`` of one sequence (the hf_inputs_* functions add
    their pixels)."""
    import torch

    ids = torch.tensor([seq])
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids))


def hf_inputs_gemma3(model: Any, ctx: Any, seq: list[int]) -> dict:
    """Gemma 3: ``token_type_ids`` mark the image tokens (transformers then attends within an image both ways)."""
    import numpy as np
    import torch

    kw = text_inputs(seq)
    if ctx.pixel_values:
        kw.update(pixel_values=torch.from_numpy(np.stack(ctx.pixel_values)),
                  token_type_ids=(kw["input_ids"] == model.config.image_token_index).long())
    return kw


def hf_inputs_qwen2_5_vl(model: Any, ctx: Any, seq: list[int]) -> dict:
    import numpy as np
    import torch

    kw = text_inputs(seq)
    if ctx.pixel_values:
        kw.update(pixel_values=torch.from_numpy(np.concatenate(ctx.pixel_values)),
                  image_grid_thw=torch.from_numpy(ctx.extra_model_args["image_grid_thw"]),
                  mm_token_type_ids=(kw["input_ids"] == model.config.image_token_id).int())
    return kw


def hf_inputs_idefics3(model: Any, ctx: Any, seq: list[int]) -> dict:
    import numpy as np
    import torch

    kw = text_inputs(seq)
    if ctx.pixel_values:
        kw["pixel_values"] = torch.from_numpy(np.stack(ctx.pixel_values))[None]
    return kw


# --------------------------------------------------------------------------- Mistral 3 (Pixtral vision)
M3_IMG, M3_BREAK, M3_END = "[IMG]", "[IMG_BREAK]", "[IMG_END]"
MISTRAL3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST]{% if m['content'] is string %}"
    "{{ m['content'] }}{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}" + M3_IMG +
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}[/INST]"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")


@functools.lru_cache(maxsize=None)
def tiny_mistral3(text_kw: tuple = (), vision_kw: tuple = (), top_kw: tuple = (), longest_edge: int = 48,
                  llava: bool = False) -> tuple[str, Any, Any]:
    """``(folder, hf_model, image_processor)``: a tiny random ``Mistral3ForConditionalGeneration`` (Pixtral
    vision tower of 4x4 patches, 2x2 spatial merge, images resized to at most ``longest_edge`` pixels and
    to multiples of 8, so variable grids; a Mistral text decoder); ``llava``: a
    ``LlavaForConditionalGeneration`` over the same tower (Pixtral 12B's layout: no merge, every patch a
    token, a two-layer projector).  The folder holds the Pixtral image
    processor, the tokenizer and a ``processor_config.json`` as Mistral's checkpoints do (transformers'
    ``PixtralProcessor`` itself needs torchvision)."""
    import json

    import torch
    import transformers
    from tokenizers import Tokenizer

    from lm_support import _bpe_json

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_bpe_json(600, _SPECIALS + (M3_IMG, M3_BREAK, M3_END))),
        bos_token="<s>", eos_token="</s>", pad_token="<pad>", chat_template=MISTRAL3_TEMPLATE)
    text = transformers.MistralConfig(**_over(dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, sliding_window=None, initializer_range=0.2,
        rms_norm_eps=1e-5, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, tie_word_embeddings=False), text_kw))
    vision = transformers.PixtralVisionConfig(**_over(dict(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, head_dim=8, patch_size=4,
        image_size=longest_edge, initializer_range=0.2), vision_kw))
    if llava:
        top = _over(dict(vision_feature_layer=-1, vision_feature_select_strategy="full"), top_kw)
        cfg = transformers.LlavaConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                       image_token_index=tok.convert_tokens_to_ids(M3_IMG), tie_word_embeddings=False,
                                       **top)
        top["spatial_merge_size"] = 1
    else:
        top = _over(dict(spatial_merge_size=2, vision_feature_layer=-1, multimodal_projector_bias=True), top_kw)
        cfg = transformers.Mistral3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                          image_token_index=tok.convert_tokens_to_ids(M3_IMG),
                                          tie_word_embeddings=False, **top)
    torch.manual_seed(0)
    cls = transformers.LlavaForConditionalGeneration if llava else transformers.Mistral3ForConditionalGeneration
    model = cls(cfg).eval().float()
    with torch.no_grad():  # norms and biases that initialise to 1/0 made to matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("ln_pre.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0, 0.3)
    patch = vision.patch_size * top["spatial_merge_size"]
    ip = transformers.PixtralImageProcessorPil(size={"longest_edge": longest_edge},
                                               patch_size={"height": patch, "width": patch})
    d = tempfile.mkdtemp(prefix="libremax-mistral3-")
    model.save_pretrained(d)
    ip.save_pretrained(d)
    tok.save_pretrained(d)
    with open(os.path.join(d, "processor_config.json"), "w") as f:
        json.dump({"processor_class": "PixtralProcessor", "patch_size": vision.patch_size,
                   "spatial_merge_size": top["spatial_merge_size"], "image_token": M3_IMG,
                   "image_break_token": M3_BREAK, "image_end_token": M3_END}, f)
    with open(os.path.join(d, "chat_template.jinja"), "w") as f:
        f.write(MISTRAL3_TEMPLATE)
    return d, model, ip


def hf_inputs_mistral3(model: Any, ctx: Any, seq: list[int]) -> dict:
    """Mistral 3: the images padded to one size as the Pixtral processor does, with their real sizes."""
    import numpy as np
    import torch

    kw = text_inputs(seq)
    if ctx.pixel_values:
        sizes = [p.shape[1:] for p in ctx.pixel_values]
        h, w = max(s[0] for s in sizes), max(s[1] for s in sizes)
        pix = np.zeros((len(sizes), ctx.pixel_values[0].shape[0], h, w), np.float32)
        for i, p in enumerate(ctx.pixel_values):
            pix[i, :, :p.shape[1], :p.shape[2]] = p
        kw.update(pixel_values=torch.from_numpy(pix), image_sizes=torch.tensor(sizes))
    return kw


# --------------------------------------------------------------------------- InternVL
IMG_START, IMG_END, IMG_CONTEXT, VIDEO = "<img>", "</img>", "<IMG_CONTEXT>", "<video>"
INTERNVL_TEMPLATE = QWEN_TEMPLATE.replace(VS + IP + VE, IMG_CONTEXT + "\n")


@functools.lru_cache(maxsize=None)
def tiny_internvl(text_kw: tuple = (), vision_kw: tuple = (), text_type: str = "qwen2", top_kw: tuple = ()
                  ) -> tuple[str, Any, Any]:
    """``(folder, hf_model, image_processor)``: a tiny random ``InternVLForConditionalGeneration`` (32-pixel
    tiles of 4x4 patches, pixel shuffle 2: 4 tokens per tile; up to 4 tiles plus a thumbnail per image) over
    a Qwen2 (or ``text_type``) decoder.  The folder holds what a hub folder does: the image processor, the
    tokenizer with InternVL's image tokens, ``processor_config.json`` (``InternVLProcessor`` itself needs
    torchvision, which the tests do not have)."""
    import json

    import torch
    import transformers
    from tokenizers import Tokenizer

    from lm_support import _bpe_json

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_bpe_json(600, _SPECIALS + (IMG_START, IMG_END, IMG_CONTEXT, VIDEO))),
        bos_token="<s>", eos_token="</s>", pad_token="<pad>", chat_template=INTERNVL_TEMPLATE,
        extra_special_tokens={"start_image_token": IMG_START, "end_image_token": IMG_END,
                              "context_image_token": IMG_CONTEXT, "video_token": VIDEO})
    text = _over(dict(
        model_type=text_type, vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2,
        tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id), text_kw)
    vision = _over(dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                        image_size=32, patch_size=8, initializer_range=0.2), vision_kw)
    cfg = transformers.InternVLConfig(**_over(dict(
        text_config=text, vision_config=vision, downsample_ratio=0.5,
        image_seq_length=(vision["image_size"] // vision["patch_size"] // 2) ** 2,
        image_token_id=tok.convert_tokens_to_ids(IMG_CONTEXT), tie_word_embeddings=False), top_kw))
    torch.manual_seed(0)
    model = transformers.InternVLForConditionalGeneration(cfg).eval().float()
    with torch.no_grad():  # layer scales, CLS token, positions, norms and biases made to matter
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm_before.weight", "layernorm_after.weight",
                              "layer_norm.weight", "layernorm.weight")):
                p.uniform_(0.5, 1.5)
            elif name.endswith((".bias", "cls_token", "position_embeddings")):
                p.normal_(0, 0.3)
            elif name.endswith(("lambda_1", "lambda_2")):
                p.uniform_(0.2, 1.0)
    tile = vision["image_size"]
    ip = transformers.GotOcr2ImageProcessorPil(size={"height": tile, "width": tile}, crop_to_patches=True,
                                               min_patches=1, max_patches=4)
    d = tempfile.mkdtemp(prefix="libremax-internvl-")
    model.save_pretrained(d)
    ip.save_pretrained(d)
    tok.save_pretrained(d)
    with open(os.path.join(d, "processor_config.json"), "w") as f:
        json.dump({"processor_class": "InternVLProcessor", "image_seq_length": cfg.image_seq_length}, f)
    with open(os.path.join(d, "chat_template.jinja"), "w") as f:
        f.write(INTERNVL_TEMPLATE)
    return d, model, ip


def hf_inputs_internvl(model: Any, ctx: Any, seq: list[int]) -> dict:
    """InternVL: every image's tiles in one ``pixel_values`` array."""
    import numpy as np
    import torch

    kw = text_inputs(seq)
    if ctx.pixel_values:
        kw["pixel_values"] = torch.from_numpy(np.concatenate(ctx.pixel_values))
    return kw


# --------------------------------------------------------------------------- Llama 4 with images
L4_TOKENS = dict(start_of_image_token="<|image_start|>", end_of_image_token="<|image_end|>", image_token="<|image|>",
                 patch_token="<|patch|>", tile_x_separator_token="<|tile_x_separator|>",
                 tile_y_separator_token="<|tile_y_separator|>")
LLAMA4_TEMPLATE = QWEN_TEMPLATE.replace(VS + IP + VE, "<|image|>")


@functools.lru_cache(maxsize=None)
def tiny_llama4_vlm(text_kw: tuple = (), vision_kw: tuple = (), max_patches: int = 4) -> tuple[str, Any, Any]:
    """``(folder, hf_model, None)``: a tiny random ``Llama4ForConditionalGeneration`` (the text decoder of
    ``family_support``'s llama4 with one 512-token attention chunk; 32-pixel tiles of 8x8 patches, pixel
    shuffle 2: 4 tokens per tile; up to ``max_patches`` tiles plus a global view).  The folder holds what a
    hub folder does (``Llama4Processor`` itself needs torchvision, which the tests do not have): the
    tokenizer, ``preprocessor_config.json`` and ``processor_config.json``."""
    import json

    import torch
    import transformers
    from tokenizers import Tokenizer

    from lm_support import _bpe_json

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_bpe_json(600, _SPECIALS + tuple(dict.fromkeys(L4_TOKENS.values())))),
        bos_token="<s>", eos_token="</s>", pad_token="<pad>", chat_template=LLAMA4_TEMPLATE)
    text = _over(dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=48, intermediate_size_mlp=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
        interleave_moe_layer_step=2, no_rope_layers=[1, 0], attention_chunk_size=512, floor_scale=4, attn_scale=0.5,
        max_position_embeddings=512, initializer_range=0.2, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}), text_kw)
    vision = _over(dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                        vision_output_dim=48, projector_input_dim=48, projector_output_dim=48, image_size=32,
                        patch_size=8, pixel_shuffle_ratio=0.5, initializer_range=0.2), vision_kw)
    cfg = transformers.Llama4Config(text_config=text, vision_config=vision, tie_word_embeddings=False,
                                    image_token_index=tok.convert_tokens_to_ids(L4_TOKENS["patch_token"]),
                                    boi_token_index=tok.convert_tokens_to_ids(L4_TOKENS["start_of_image_token"]),
                                    eoi_token_index=tok.convert_tokens_to_ids(L4_TOKENS["end_of_image_token"]))
    torch.manual_seed(0)
    model = transformers.Llama4ForConditionalGeneration(cfg).eval().float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("layernorm.weight", "layernorm_pre.weight", "layernorm_post.weight")):
                p.uniform_(0.5, 1.5)
            elif name.endswith((".bias", "class_embedding", "positional_embedding_vlm", "router.weight")):
                p.normal_(0, 0.3)
    tile = vision["image_size"]
    d = tempfile.mkdtemp(prefix="libremax-llama4-vlm-")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
        json.dump({"image_processor_type": "Llama4ImageProcessor", "processor_class": "Llama4Processor",
                   "size": {"height": tile, "width": tile}, "max_patches": max_patches, "resize_to_max_canvas": False,
                   "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "rescale_factor": 1 / 255, "resample": 2}, f)
    with open(os.path.join(d, "processor_config.json"), "w") as f:
        json.dump({"processor_class": "Llama4Processor", "patch_size": vision["patch_size"],
                   "pixel_shuffle_ratio": vision["pixel_shuffle_ratio"], "fake_image_token": "<|image|>",
                   **L4_TOKENS}, f)
    with open(os.path.join(d, "chat_template.jinja"), "w") as f:
        f.write(LLAMA4_TEMPLATE)
    return d, model, None


def hf_inputs_llama4(model: Any, ctx: Any, seq: list[int]) -> dict:
    """Llama 4: every tile (and global view) of every image in prompt order, one ``pixel_values`` array."""
    import numpy as np
    import torch

    kw = text_inputs(seq)
    if ctx.pixel_values:
        kw["pixel_values"] = torch.from_numpy(np.stack(ctx.pixel_values))
    return kw


class Llama4Reference:
    """transformers' ``Llama4ForConditionalGeneration`` as the tests call it (``model(**kw).logits``,
    ``model.generate(**kw)``), its steps taken one by one: its ``forward`` in transformers 5.24 fails after
    computing the logits (it reads ``image_outputs`` from the text model's output).  The image rows are made
    as its ``forward`` makes them: ``get_image_features``, ``multi_modal_projector``, scattered at
    ``image_token_index``; its text model (``language_model``) does the rest."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.config = model.config

    def _embeds(self, input_ids: Any, pixel_values: Any = None) -> Any:
        m = self.model
        emb = m.get_input_embeddings()(input_ids)
        if pixel_values is not None:
            feats = m.get_image_features(pixel_values=pixel_values).last_hidden_state
            rows = m.multi_modal_projector(feats.reshape(-1, feats.shape[-1]))
            mask = (input_ids == self.config.image_token_index)[..., None].expand_as(emb)
            emb = emb.masked_scatter(mask, rows)
        return emb

    def __call__(self, input_ids: Any, attention_mask: Any, pixel_values: Any = None) -> Any:
        return self.model.language_model(inputs_embeds=self._embeds(input_ids, pixel_values),
                                         attention_mask=attention_mask)

    def generate(self, input_ids: Any, attention_mask: Any, pixel_values: Any = None, **kw: Any) -> Any:
        import torch

        new = self.model.language_model.generate(inputs_embeds=self._embeds(input_ids, pixel_values),
                                                 attention_mask=attention_mask, **kw)
        return torch.cat([input_ids, new], dim=1)  # generating from embeddings returns only the new tokens
