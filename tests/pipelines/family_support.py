"""Shared harness for the per-family tests: a tiny random checkpoint made with transformers' own config
class, loaded through the real pipeline (PipelineConfig -> registry -> family folder), and compared with
transformers on the same weights.

``FAMILIES`` maps a test id to a function returning the family's transformers config for the shared
tiny dimensions; ``tweak`` functions make rarely-non-zero parameters (biases, norm weights) matter.
"""

from __future__ import annotations

import functools
import os
import tempfile
from typing import Any, Callable

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

from test_hf_utils import make_bpe_tokenizer  # noqa: E402

DIMS = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256, initializer_range=0.2)


def _randomize(model: Any, *suffixes: str, std: float = 0.5) -> None:
    """Give every parameter whose name ends with one of ``suffixes`` random values (biases, norms...)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(suffixes):
                p.normal_(0, std) if not name.endswith("norm.weight") else p.uniform_(0.5, 1.5)


FamilySpec = tuple[Callable[[dict], Any], Callable[[Any], None] | None]

FAMILIES: dict[str, FamilySpec] = {
    "llama": (lambda d: transformers.LlamaConfig(**d, tie_word_embeddings=False), None),
    "mistral": (lambda d: transformers.MistralConfig(**d, sliding_window=8, tie_word_embeddings=False), None),
    "qwen2": (lambda d: transformers.Qwen2Config(**d, tie_word_embeddings=True),
              lambda m: _randomize(m, "q_proj.bias", "k_proj.bias", "v_proj.bias")),
    "qwen3": (lambda d: transformers.Qwen3Config(**d, head_dim=32, tie_word_embeddings=True),
              lambda m: _randomize(m, "q_norm.weight", "k_norm.weight")),
}


@functools.lru_cache(maxsize=None)
def tiny_family(name: str) -> tuple[str, Any, Any]:
    """``(folder, hf_model, tokenizer)``: the family's tiny random checkpoint saved with a BPE tokenizer."""
    make_config, tweak = FAMILIES[name]
    tok = transformers.AutoTokenizer.from_pretrained(make_bpe_tokenizer())
    ids = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id)
    cfg = make_config({**DIMS, **ids})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval().float()
    if tweak is not None:
        tweak(model)
    d = tempfile.mkdtemp(prefix=f"libremax-family-{name}-")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d, model, tok


@functools.lru_cache(maxsize=None)
def family_llm(name: str) -> Any:
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    d, _, _ = tiny_family(name)
    return LLM(PipelineConfig(model_path=d, max_length=128, max_batch_size=4, kv_cache_page_size=16))


def hf_next_logits(model: Any, seq: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([seq])).logits[0, -1].double().numpy()


def hf_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        g = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return g[0, len(ids):].tolist()


def assert_close(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    span = float(ref.max() - ref.min())
    err = float(np.abs(ours - ref).max())
    assert err <= 1e-4 * span, f"{what}: max |diff| {err:.3g} > 1e-4 of the logit range {span:.3g}"
