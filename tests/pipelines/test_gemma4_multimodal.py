"""Gemma 4 as released (``Gemma4ForConditionalGeneration``), run natively for text: a tiny random
checkpoint made with transformers' ``Gemma4Config`` (tiny text + vision (+ audio) configs) goes to the
gemma4multimodal family, not the transformers fallback; its logits (ragged prefill + decode, alone and
batched) and greedy tokens equal transformers' text-only forward/generate; the vision/audio towers are
left out at load; images, video and audio are refused naming the input."""

from __future__ import annotations

import asyncio
import functools
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
import transformers  # noqa: E402

from support import scheduled_greedy  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nn"))

from family_support import DIMS, _randomize, _randomize_buffers, hf_greedy, steps_against_hf  # noqa: E402
from test_hf_utils import make_bpe_tokenizer  # noqa: E402

from max.interfaces import SamplingParams  # noqa: E402
from max.interfaces.errors import InvalidRequest  # noqa: E402

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{% if m['content'] is string %}{{ m['content'] }}"
            "{% else %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<model>{% endif %}")

_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=2, head_dim=16, patch_size=4, position_embedding_size=64)
_AUDIO = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, subsampling_conv_channels=[8, 4],
              output_proj_dims=32)

VARIANTS = {
    # E2B/E4B's layout: per-layer input embeddings, KV sharing, double-wide MLPs; vision and audio towers
    "e2b": (dict(num_hidden_layers=4, head_dim=16, global_head_dim=32, hidden_size_per_layer_input=8,
                 sliding_window=8, num_kv_shared_layers=2, use_double_wide_mlp=True, final_logit_softcapping=3.0,
                 layer_types=["sliding_attention", "full_attention"] * 2), True),
    # 31B's layout: global layers with their own head size and keys doubling as values, image tokens
    # attending both ways (use_bidirectional_attention="vision": causal for text); vision tower only
    "31b": (dict(head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
                 hidden_size_per_layer_input=0, sliding_window=8, use_bidirectional_attention="vision",
                 layer_types=["sliding_attention", "full_attention"], final_logit_softcapping=3.0), False),
}


@functools.lru_cache(maxsize=None)
def tiny_gemma4mm(variant: str):
    """``(folder, hf_model, tokenizer)``: a tiny random ``Gemma4ForConditionalGeneration`` saved with a BPE
    tokenizer that has a chat template."""
    text_kw, audio = VARIANTS[variant]
    tok = transformers.AutoTokenizer.from_pretrained(make_bpe_tokenizer())
    tok.chat_template = TEMPLATE
    ids = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id)
    text = transformers.Gemma4TextConfig(**{**DIMS, **ids, **text_kw})
    cfg = transformers.Gemma4Config(text_config=text, vision_config=transformers.Gemma4VisionConfig(**_VISION),
                                    audio_config=transformers.Gemma4AudioConfig(**_AUDIO) if audio else None)
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration(cfg).eval().float()
    _randomize(model.model.language_model, "norm.weight", "layernorm.weight")
    _randomize_buffers(model.model.language_model, "layer_scalar", std=0.5)
    d = tempfile.mkdtemp(prefix=f"libremax-gemma4mm-{variant}-")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d, model, tok


@functools.lru_cache(maxsize=None)
def gemma4mm_llm(variant: str):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    return LLM(PipelineConfig(model_path=tiny_gemma4mm(variant)[0], max_length=128, max_batch_size=4,
                              kv_cache_page_size=16))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_registered_natively_with_the_towers_left_out(variant):
    from safetensors import safe_open

    from max.pipelines import PipelineConfig
    from max.pipelines.architectures.gemma4multimodal.weight_adapters import IGNORED_PREFIXES
    from max.pipelines.lib.registry import PIPELINE_REGISTRY, register_all_models

    register_all_models()
    d, model, _ = tiny_gemma4mm(variant)
    arch = PIPELINE_REGISTRY._require(PipelineConfig(model_path=d, max_length=64, max_batch_size=2, hf_fallback=False))
    assert arch.name == "Gemma4ForConditionalGeneration"
    assert arch.pipeline_model.__name__ == "Gemma4TextOnlyModel"
    with safe_open(str(Path(d) / "model.safetensors"), "pt") as f:
        towers = {k.split(".")[1] for k in f.keys() if k.startswith(IGNORED_PREFIXES)}
    assert towers == ({"vision_tower", "embed_vision", "audio_tower", "embed_audio"} if VARIANTS[variant][1]
                      else {"vision_tower", "embed_vision"})
    assert gemma4mm_llm(variant).pipeline.pipeline_model.__class__.__name__ == "Gemma4TextOnlyModel"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prefill_and_decode_logits_match_transformers(variant):
    """Two ragged prompts together, then 4 decode steps: every step's logits equal transformers' text-only
    forward; a prompt alone too; every page freed."""
    _, model, tok = tiny_gemma4mm(variant)
    rng = np.random.default_rng(0)
    prompts = {"a": rng.integers(0, len(tok), 11).tolist(), "b": rng.integers(0, len(tok), 5).tolist()}
    llm = gemma4mm_llm(variant)
    for batch in ({"a": prompts["a"]}, prompts):
        mgr = steps_against_hf(llm, model, batch, 4)
        assert mgr.num_free_pages == mgr.total_num_pages


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_greedy_alone_and_batched_match_transformers_generate(variant):
    _, model, tok = tiny_gemma4mm(variant)
    llm = gemma4mm_llm(variant)
    prompts = ["def forward(self, x):", "import os"]
    want = [hf_greedy(model, tok(p)["input_ids"], 12) for p in prompts]
    assert scheduled_greedy(llm, prompts[:1], 12) == want[:1]
    assert scheduled_greedy(llm, prompts, 12) == want


def test_chat_template_comes_from_the_folder():
    _, _, tok = tiny_gemma4mm("e2b")
    llm = gemma4mm_llm("e2b")
    ctx = llm.make_context("hello there", SamplingParams(max_new_tokens=2), chat=True)
    want = tok.apply_chat_template([{"role": "user", "content": "hello there"}], add_generation_prompt=True,
                                   tokenize=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert ctx.tokens[:ctx.active_idx].tolist() == list(want)


def test_images_video_and_audio_are_refused_naming_the_input():
    from max.interfaces import TextGenerationRequest

    llm = gemma4mm_llm("e2b")
    tk = llm.tokenizer
    with pytest.raises(InvalidRequest, match="runs Gemma 4's text; images/audio are not supported yet.*1 image"):
        llm.make_context("Describe.", SamplingParams(max_new_tokens=2), images=[b"\x89PNG not read"])
    for part, what in ((({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}), "image"),
                       ({"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}, "audio"),
                       ({"type": "video_url", "video_url": {"url": "file:///x.mp4"}}, "video")):
        msgs = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]
        with pytest.raises(InvalidRequest, match=f"images/audio are not supported yet.*1 {what} part") as e:
            tk.apply_chat_template(msgs)
        assert e.value.param == "messages"
        req = TextGenerationRequest(request_id="r", model_name="m", messages=msgs)
        with pytest.raises(InvalidRequest, match=f"not supported yet.*{what}"):
            asyncio.run(tk.new_context(req))
    # the refusal left the pipeline usable
    assert llm.generate("import os", max_new_tokens=2, use_tqdm=False)


def test_text_config_translation():
    """``text_config`` is the text family's; "vision" bidirectional attention (image tokens only) is causal for
    text, "all" stays unsupported (named); no text_config is a clear error."""
    from max.pipelines.architectures.gemma4multimodal.config import config_from_hf
    from max.pipelines.architectures.gemma4multimodal.model import Gemma4TextOnlyModel

    base = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                global_head_dim=32, vocab_size=100, intermediate_size=96, rms_norm_eps=1e-6,
                max_position_embeddings=64, layer_types=["sliding_attention", "full_attention"])
    cfg = config_from_hf({"text_config": {**base, "use_bidirectional_attention": "vision"}})
    assert cfg.architecture == "Gemma4ForConditionalGeneration" and cfg.extra["head_dims"] == [16, 32]
    assert "bidirectional" in Gemma4TextOnlyModel.unsupported_reason(
        {"text_config": {**base, "use_bidirectional_attention": "all"}})
    assert Gemma4TextOnlyModel.unsupported_reason({"text_config": base}) is None
    with pytest.raises(ValueError, match="no text_config"):
        config_from_hf(base)


def test_server_answers_an_image_or_audio_request_with_a_400_naming_it():
    """Through the OpenAI-compatible app: a chat request with an image or audio part gets an OpenAI-shaped 400
    whose message names the input; a text request on the same app is served."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from max.pipelines import PipelineConfig
    from max.serve.server import build_app

    d = tiny_gemma4mm("e2b")[0]
    app = build_app(PipelineConfig(model_path=d, max_length=64, max_batch_size=2), served_model_name="g4")
    with TestClient(app) as client:
        for part in ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                     {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}):
            body = {"model": "g4", "max_tokens": 2,
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "what?"}, part]}]}
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 400, r.text
            assert "runs Gemma 4's text; images/audio are not supported yet" in r.json()["error"]["message"]
        r = client.post("/v1/chat/completions", json={"model": "g4", "max_tokens": 2,
                                                      "messages": [{"role": "user", "content": "hello"}]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] is not None


def test_weight_adapter_leaves_out_only_the_towers():
    """Tower/embedder tensors are dropped by name; text tensors lose ``model.language_model.``; any other name
    is kept (so the load reports it as unused rather than silently ignoring it)."""
    from max.pipelines.architectures.gemma4multimodal.weight_adapters import rename

    sd = {"model.language_model.embed_tokens.weight": 1, "model.language_model.layers.0.mlp.up_proj.weight": 2,
          "model.vision_tower.encoder.layers.0.x.weight": 3, "model.embed_vision.embedding_projection.weight": 4,
          "model.audio_tower.layers.0.y.weight": 5, "model.embed_audio.embedding_projection.weight": 6,
          "lm_head.weight": 7, "model.something_new.weight": 8}
    assert rename(sd) == {"embed_tokens.weight": 1, "layers.0.mlp.up_proj.weight": 2, "lm_head.weight": 7,
                          "something_new.weight": 8}
