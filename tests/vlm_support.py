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


def image_bytes(seed: int, size: tuple[int, int] = (40, 28), fmt: str = "PNG") -> bytes:
    """A random RGB image encoded as ``fmt``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


@functools.lru_cache(maxsize=None)
def tiny_gemma3_vlm() -> tuple[str, Any, Any]:
    """``(folder, hf_model, processor)``: the checkpoint, its transformers model (float32, eval) and
    processor."""
    import torch
    import transformers

    from tokenizers import Tokenizer

    from lm_support import _bpe_json

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_bpe_json(600, (BOI, IMG, EOI, SOT, EOT))), bos_token="<s>",
        eos_token="</s>", pad_token="<pad>", chat_template=CHAT_TEMPLATE,
        extra_special_tokens={"boi_token": BOI, "image_token": IMG, "eoi_token": EOI})
    text = transformers.Gemma3TextConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256, initializer_range=0.2,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False)  # a tied random head mostly repeats the last token
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                             num_attention_heads=4, image_size=IMAGE_SIZE, patch_size=PATCH,
                                             layer_norm_eps=1e-6, vision_use_head=False)
    cfg = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                    mm_tokens_per_image=MM_TOKENS, image_token_index=tok.convert_tokens_to_ids(IMG),
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
    ip = transformers.Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    proc = transformers.Gemma3Processor(image_processor=ip, tokenizer=tok, chat_template=CHAT_TEMPLATE,
                                        image_seq_length=MM_TOKENS)
    d = tempfile.mkdtemp(prefix="libremax-gemma3-vlm-")
    model.save_pretrained(d)
    proc.save_pretrained(d)
    return d, model, proc
