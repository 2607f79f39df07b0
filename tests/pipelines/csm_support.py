"""A tiny random Sesame CSM checkpoint (``CsmForConditionalGeneration`` from ``CsmConfig``: 2-layer backbone,
2-layer depth decoder over 4 codebooks, a small Mimi codec), its tokenizer and chat template, and -- for the
tests only, until the native Mimi codec lands -- :class:`HFMimiCodec`, transformers' ``MimiModel`` behind the
interface ``max.pipelines.architectures.mimi.MimiCodec`` will have."""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Mapping

import numpy as np
import torch

NUM_CODEBOOKS = 4
CODEBOOK_VOCAB = 64
CHAT_TEMPLATE = (
    "{% for m in messages %}{% for c in m['content'] %}{% if c['type'] == 'text' %}"
    "{{ '<s>[' + m['role'] + ']' + c['text'] + '</s>' }}{% elif c['type'] == 'audio' %}"
    "{{ '<|AUDIO|><|audio_eos|>' }}{% endif %}{% endfor %}{% endfor %}")
"""Speaker turns as ``<s>[speaker]text</s>`` then, for a turn with audio, its frames and an audio end token (the
layout of Sesame's template; a tiny tokenizer's own special tokens)."""


def mimi_config(**kw: Any) -> Any:
    from transformers import MimiConfig

    args = dict(hidden_size=32, num_filters=4, num_residual_layers=1, codebook_size=CODEBOOK_VOCAB, codebook_dim=16,
                num_quantizers=NUM_CODEBOOKS, vector_quantization_hidden_dimension=16, num_semantic_quantizers=1,
                upsample_groups=32, num_hidden_layers=1, intermediate_size=64, num_attention_heads=4,
                num_key_value_heads=4, head_dim=8, sliding_window=16, max_position_embeddings=256)
    args.update(kw)
    return MimiConfig(**args)


def csm_config(tokenizer: Any, **kw: Any) -> Any:
    from transformers import CsmConfig

    depth = dict(num_codebooks=NUM_CODEBOOKS, backbone_hidden_size=32, vocab_size=CODEBOOK_VOCAB, hidden_size=24,
                 intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=6,
                 max_position_embeddings=NUM_CODEBOOKS + 1,
                 rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    depth.update(kw.pop("depth", {}))
    args = dict(num_codebooks=NUM_CODEBOOKS, vocab_size=CODEBOOK_VOCAB, text_vocab_size=len(tokenizer), hidden_size=32,
                intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                audio_token_id=tokenizer.convert_tokens_to_ids("<|AUDIO|>"),
                audio_eos_token_id=tokenizer.convert_tokens_to_ids("<|audio_eos|>"),
                codebook_pad_token_id=CODEBOOK_VOCAB - 1, codebook_eos_token_id=0,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                depth_decoder_config=depth, codec_config=mimi_config().to_dict())
    args.update(kw)
    return CsmConfig(**args)


def _tokenizer(folder: str) -> Any:
    from transformers import AutoTokenizer

    from tests.pipelines.test_hf_utils import make_bpe_tokenizer

    tok = AutoTokenizer.from_pretrained(make_bpe_tokenizer())
    tok.add_special_tokens({"additional_special_tokens": ["<|AUDIO|>", "<|audio_eos|>"]})
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)
    return tok


def _randomize(model: torch.nn.Module, std: float = 0.3) -> None:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("codec_model."):
                continue
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g))


@functools.lru_cache(maxsize=None)
def make_csm_dir(root: str, sizes: str = "", **generation: Any) -> str:
    """A saved tiny CSM folder (config, safetensors weights, tokenizer with the chat template, generation
    config with greedy depth decoding unless ``generation`` says otherwise).  ``sizes``: JSON of
    :func:`csm_config` overrides (``"depth"``: the depth decoder's; ``"std"``: the weights' scale)."""
    from transformers import CsmForConditionalGeneration

    folder = os.path.join(root, "csm-tiny")
    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    os.makedirs(folder, exist_ok=True)
    tok = _tokenizer(folder)
    torch.manual_seed(0)
    over = json.loads(sizes) if sizes else {}
    std = float(over.pop("std", 0.3))
    model = CsmForConditionalGeneration(csm_config(tok, **over)).eval()
    _randomize(model, std)
    gen = dict(do_sample=False, max_new_tokens=24, depth_decoder_do_sample=False)
    gen.update(generation)
    for k, v in gen.items():
        if k.startswith("depth_decoder_"):
            setattr(model.depth_decoder.generation_config, k[len("depth_decoder_"):], v)
        else:
            setattr(model.generation_config, k, v)
    model.save_pretrained(folder)
    gpath = os.path.join(folder, "generation_config.json")
    with open(gpath) as f:  # a hub checkpoint's file: not marked as derived from the model config (transformers
        g = {k: v for k, v in json.load(f).items() if "_from_model_config" not in k}  # then drops the depth keys)
    with open(gpath, "w") as f:
        json.dump(g, f)
    with open(os.path.join(folder, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    return folder


def hf_model(folder: str) -> Any:
    from transformers import CsmForConditionalGeneration

    return CsmForConditionalGeneration.from_pretrained(folder).eval()


def hf_processor(folder: str) -> Any:
    from transformers import AutoTokenizer, CsmProcessor, EncodecFeatureExtractor

    tok = AutoTokenizer.from_pretrained(folder)
    fe = EncodecFeatureExtractor(feature_size=1, sampling_rate=24000)
    return CsmProcessor(fe, tok, chat_template=CHAT_TEMPLATE)


class HFMimiCodec:
    """Tests only: transformers' ``MimiModel`` with the native ``MimiCodec`` interface (encode / decode /
    chunked decode), so the CSM pipeline runs before the native codec lands."""

    def __init__(self, model: Any) -> None:
        self.model = model.eval()
        c = model.config
        self.sample_rate = int(c.sampling_rate)
        self.frame_rate = float(c.frame_rate)
        self.num_codebooks = int(c.num_quantizers)

    @classmethod
    def from_state_dict(cls, config: dict, tensors: Mapping[str, Any], prefix: str = "") -> "HFMimiCodec":
        import tempfile

        from safetensors.torch import save_file
        from transformers import MimiConfig, MimiModel

        cfg = {k: v for k, v in config.items() if k not in ("transformers_version", "architectures")}
        sd = {k[len(prefix):]: torch.as_tensor(np.asarray(v)).contiguous() for k, v in tensors.items()
              if k.startswith(prefix)}
        with tempfile.TemporaryDirectory() as d:  # transformers maps the checkpoint's names to its modules on load
            MimiConfig(**cfg).save_pretrained(d)
            save_file(sd, os.path.join(d, "model.safetensors"))
            model = MimiModel.from_pretrained(d)
        return cls(model)

    def encode(self, waveform: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            x = torch.as_tensor(np.asarray(waveform, np.float32)).reshape(1, 1, -1)
            return self.model.encode(x).audio_codes[0].numpy().astype(np.int64)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.model.decode(torch.as_tensor(np.asarray(codes, np.int64))[None]).audio_values[0, 0].numpy()

    def new_decode_state(self) -> dict:
        return {"codes": np.zeros((self.num_codebooks, 0), np.int64), "emitted": 0}

    def decode_chunk(self, codes: np.ndarray, state: dict) -> np.ndarray:
        # a reference adapter: re-decodes everything so far and returns the new samples (exact, not fast)
        state["codes"] = np.concatenate([state["codes"], np.asarray(codes, np.int64)], axis=1)
        audio = self.decode(state["codes"])
        out = audio[state["emitted"]:]
        state["emitted"] = audio.size
        return out


def hf_codes(model: Any, processor: Any, conversations: list, max_new_tokens: int, **kw: Any) -> list[np.ndarray]:
    """transformers' ``generate`` frames ``[frames, num_codebooks]`` of each conversation (one batch, left
    padded), each cut at its end frame (the end frame and the padding after it are not audio)."""
    inputs = processor.apply_chat_template(conversations, tokenize=True, return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, **kw)
    eos = model.config.codebook_eos_token_id
    res = []
    for row in out.numpy():
        end = next((i for i, f in enumerate(row) if (f[:-1] == eos).all()), len(row))
        res.append(row[:end])
    return res


def conversation(text: str, speaker: int = 0, context: list | None = None) -> list:
    """A processor conversation: ``context`` turns ``(speaker, text, waveform)`` then ``text`` by ``speaker``."""
    conv = [{"role": str(s), "content": [{"type": "text", "text": t}, {"type": "audio", "path": a}]}
            for s, t, a in (context or [])]
    return conv + [{"role": str(speaker), "content": [{"type": "text", "text": text}]}]
