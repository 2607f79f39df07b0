"""CSM as ``max.nn`` modules and its two graphs.

- **Backbone step graph** (paged KV cache, ragged batch: prompts and single new frames together):
  ``text`` int64 ``[total_seq_len]``, ``codes`` int64 ``[total_seq_len, num_codebooks]`` (codebook ``j``'s
  code already offset by ``j * codebook_vocab``), ``is_audio`` float32 ``[total_seq_len, 1]`` (1: the
  position is an audio frame, its input is the sum of its codes' embeddings; 0: a text token, its text
  embedding), ``input_row_offsets`` uint32 ``[batch + 1]``, then the cache's inputs.  Llama layers
  (``common.layers``), final RMSNorm; outputs each request's last normed hidden state float32 ``[batch,
  hidden]`` and its codebook-0 logits float32 ``[batch, codebook_vocab]``.
- **Depth decoder graph** (a small transient cache per frame, as transformers' depth decoder keeps one: the
  first call computes positions 0 (the backbone state) and 1 (codebook 0), each later call one position):
  ``ids`` int64 ``[batch, n]`` (position ``p >= 1`` holds the code of codebook ``p - 1`` offset by ``(p - 1) *
  codebook_vocab``; position 0 a placeholder), ``hidden`` float32 ``[batch, backbone_hidden]`` (placed at
  position 0), ``positions`` int64 ``[batch * n]``, ``mask`` float32 ``[n, past + n]`` (additive causal),
  ``first`` float32 ``[n, 1]`` (1 where the position is 0), ``last`` int64 ``[1]`` (= n - 1), ``head`` int64
  ``[1]`` (the codebook of the last position minus 1: its ``codebooks_head`` entry), ``past_k`` / ``past_v``
  ``[layers, batch, kv_heads, past, head_dim]``; outputs float32 logits ``[batch, codebook_vocab]`` of the next
  codebook and the keys / values ``[layers, batch, kv_heads, past + n, head_dim]`` for the next call.
"""

from __future__ import annotations

import math

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, Weight, ops
from max.nn import LayerList, Module
from max.nn.kernels_decoder import ragged_rope, ragged_rope_tables
from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams
from max.pipelines.architectures.common.layers import DecoderAttention, DecoderLayer, GatedMLP, make_rope, rms_norm
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.csm.config import CsmConfig

__all__ = ["Backbone", "DepthDecoder", "build_backbone_graph", "build_depth_graph"]


class Backbone(Module):
    """Module names are the checkpoint's minus ``backbone_model.`` (``layers.N...``, ``norm``), plus
    ``embed_text_tokens``, ``embed_audio_tokens`` and ``lm_head`` (the codebook-0 head)."""

    def __init__(self, c: CsmConfig, f: WeightFactory, kv_params: KVCacheParams, max_seq_len: int) -> None:
        super().__init__()
        cfg = c.backbone
        self.c = c
        self.kv_params = kv_params
        rope = make_rope(cfg, max_seq_len, f.device)
        self.freqs = rope.table
        self.layers = LayerList([
            DecoderLayer(cfg, DecoderAttention(cfg, i, f, kv_params, rope),
                         GatedMLP(f"layers.{i}.mlp", f, cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                                  has_bias=cfg.mlp_bias, who=cfg.architecture), f.dtype)
            for i in range(cfg.num_hidden_layers)])
        self.norm = rms_norm(cfg, cfg.hidden_size, f.dtype)
        self.embed_text_tokens = f.embedding("embed_text_tokens", c.text_vocab_size, cfg.hidden_size)
        self.embed_audio_tokens = f.embedding("embed_audio_tokens", c.num_codebooks * c.codebook_vocab,
                                              cfg.hidden_size)
        self.lm_head = f.linear("lm_head", cfg.hidden_size, c.codebook_vocab)
        f.check_paths(self)

    def __call__(self, text: TensorValue, codes: TensorValue, is_audio: TensorValue, offsets: TensorValue,
                 kv_inputs: list) -> tuple[TensorValue, TensorValue]:
        H = self.c.backbone.hidden_size
        kv = FetchPagedKVCacheCollection(self.kv_params, len(self.layers))(*kv_inputs)
        frames = ops.reshape(ops.sum(self.embed_audio_tokens(codes), axis=1), [text.shape[0], H])
        audio = ops.cast(is_audio, frames.dtype)
        x = self.embed_text_tokens(text) * (1.0 - audio) + frames * audio
        for i, layer in enumerate(self.layers):
            x = layer(ops.constant(i, DType.uint32, x.device), x, kv, self.freqs.freqs_cis, offsets)
        last = offsets.cast(DType.int64)[1:] - 1
        h = self.norm(ops.gather(x, last, axis=0))
        return ops.cast(h, DType.float32), ops.cast(self.lm_head(h), DType.float32)


class _DepthAttention(Module):
    def __init__(self, c: CsmConfig, f: WeightFactory, i: int) -> None:
        super().__init__()
        cfg = c.depth
        p = f"layers.{i}.self_attn"
        self.H, self.Hkv, self.D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        d = cfg.hidden_size
        self.q_proj = f.linear(f"{p}.q_proj", d, self.H * self.D, cfg.attention_bias)
        self.k_proj = f.linear(f"{p}.k_proj", d, self.Hkv * self.D, cfg.attention_bias)
        self.v_proj = f.linear(f"{p}.v_proj", d, self.Hkv * self.D, cfg.attention_bias)
        self.o_proj = f.linear(f"{p}.o_proj", self.H * self.D, d, False)

    def __call__(self, x: TensorValue, cos: TensorValue, sin: TensorValue, mask: TensorValue, past_k: TensorValue,
                 past_v: TensorValue) -> tuple[TensorValue, TensorValue, TensorValue]:
        b, s = x.shape[0], x.shape[1]
        D = self.D

        def heads(y: TensorValue, n: int, rotate: bool) -> TensorValue:
            y = ops.reshape(y, [-1, n, D])  # [b * s, n, D]
            if rotate:
                y = ragged_rope(y, cos, sin, False)
            return ops.transpose(ops.reshape(y, [b, s, n, D]), 1, 2)  # [b, n, s, D]

        q = heads(self.q_proj(x), self.H, True)
        k_all = ops.concat([past_k, heads(self.k_proj(x), self.Hkv, True)], axis=2)
        v_all = ops.concat([past_v, heads(self.v_proj(x), self.Hkv, False)], axis=2)
        k, v = k_all, v_all
        if self.H != self.Hkv:
            k = ops.repeat_interleave(k, self.H // self.Hkv, axis=1)
            v = ops.repeat_interleave(v, self.H // self.Hkv, axis=1)
        m = ops.rebind(mask, [s, k.shape[2]], "the mask covers the past and the new positions")
        scores = ops.cast(q @ ops.transpose(k, -1, -2), DType.float32) * (1.0 / math.sqrt(D)) + m
        o = ops.cast(ops.softmax(scores), v.dtype) @ v  # [b, H, s, D]
        return self.o_proj(ops.reshape(ops.transpose(o, 1, 2), [b, s, self.H * D])), k_all, v_all


class _DepthLayer(Module):
    def __init__(self, c: CsmConfig, f: WeightFactory, i: int) -> None:
        super().__init__()
        cfg = c.depth
        self.self_attn = _DepthAttention(c, f, i)
        self.mlp = GatedMLP(f"layers.{i}.mlp", f, cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                            has_bias=cfg.mlp_bias, who=cfg.architecture)
        self.input_layernorm = rms_norm(cfg, cfg.hidden_size, f.dtype)
        self.post_attention_layernorm = rms_norm(cfg, cfg.hidden_size, f.dtype)

    def __call__(self, x: TensorValue, cos: TensorValue, sin: TensorValue, mask: TensorValue, past_k: TensorValue,
                 past_v: TensorValue) -> tuple[TensorValue, TensorValue, TensorValue]:
        a, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, past_k, past_v)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


class _CodebooksHead(Module):
    def __init__(self, c: CsmConfig, dtype: DType, device: DeviceRef) -> None:
        super().__init__()
        self.weight = Weight("weight", dtype, [c.num_codebooks - 1, c.depth.hidden_size, c.codebook_vocab], device)


class DepthDecoder(Module):
    """Module names are the checkpoint's minus ``depth_decoder.model.`` (``embed_tokens``,
    ``inputs_embeds_projector``, ``layers.N...``, ``norm``) plus ``codebooks_head`` (one
    ``[hidden, codebook_vocab]`` projection per codebook 1..N-1)."""

    def __init__(self, c: CsmConfig, f: WeightFactory) -> None:
        super().__init__()
        cfg = c.depth
        self.c = c
        self.rope = make_rope(cfg, c.num_codebooks + 1, f.device)
        bb = c.backbone.hidden_size
        self.embed_tokens = f.embedding("embed_tokens", c.num_codebooks * c.codebook_vocab, bb)
        self.inputs_embeds_projector = f.linear("inputs_embeds_projector", bb, cfg.hidden_size)
        self.layers = LayerList([_DepthLayer(c, f, i) for i in range(cfg.num_hidden_layers)])
        self.norm = rms_norm(cfg, cfg.hidden_size, f.dtype)
        self.codebooks_head = _CodebooksHead(c, f.dtype, f.device)
        f.check_paths(self)

    def __call__(self, ids: TensorValue, hidden: TensorValue, positions: TensorValue, mask: TensorValue,
                 first: TensorValue, last: TensorValue, head: TensorValue, past_k: TensorValue,
                 past_v: TensorValue) -> tuple[TensorValue, TensorValue, TensorValue]:
        e = self.embed_tokens(ids)  # [b, n, backbone_hidden]
        h = ops.unsqueeze(ops.cast(hidden, e.dtype), 1)
        f = ops.cast(first, e.dtype)
        x = self.inputs_embeds_projector(e * (1.0 - f) + h * f)
        cos, sin = ragged_rope_tables(self.rope.table.freqs_cis, positions)
        ks, vs = [], []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, cos, sin, mask, past_k[i], past_v[i])
            ks.append(k)
            vs.append(v)
        x = self.norm(ops.reshape(ops.gather(x, last, axis=1), [x.shape[0], self.c.depth.hidden_size]))
        w = ops.gather(self.codebooks_head.weight, head, axis=0)  # [1, hidden, vocab]
        w = ops.reshape(w, [self.c.depth.hidden_size, self.c.codebook_vocab])
        return ops.cast(x @ w, DType.float32), ops.stack(ks, axis=0), ops.stack(vs, axis=0)


def build_backbone_graph(model: Backbone, kv_symbols: list, device: DeviceRef) -> Graph:
    n = model.c.num_codebooks
    types = [TensorType(DType.int64, ["total_seq_len"], device),
             TensorType(DType.int64, ["total_seq_len", n], device),
             TensorType(DType.float32, ["total_seq_len", 1], device),
             TensorType(DType.uint32, ["input_row_offsets_len"], device)]
    with Graph(f"{model.c.backbone.architecture}.backbone", input_types=[*types, *kv_symbols]) as g:
        text, codes, audio, offsets, *kv = g.inputs
        g.output(*model(text.tensor, codes.tensor, audio.tensor, offsets.tensor, kv))
    return g


def build_depth_graph(model: DepthDecoder, device: DeviceRef) -> Graph:
    c = model.c
    d = c.depth
    cache = TensorType(model.embed_tokens.weight.dtype, [d.num_hidden_layers, "batch", d.num_key_value_heads, "past",
                                                         d.head_dim], device)
    types = [TensorType(DType.int64, ["batch", "n"], device),
             TensorType(DType.float32, ["batch", c.backbone.hidden_size], device),
             TensorType(DType.int64, ["bn"], device),
             TensorType(DType.float32, ["n", "past_and_n"], device),
             TensorType(DType.float32, ["n", 1], device),
             TensorType(DType.int64, [1], device),
             TensorType(DType.int64, [1], device),
             cache, cache]
    with Graph(f"{c.backbone.architecture}.depth_decoder", input_types=types) as g:
        g.output(*model(*(v.tensor for v in g.inputs)))
    return g
