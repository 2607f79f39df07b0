"""Whisper as ``max.nn`` modules and its two graphs.

Module names are the checkpoint's minus ``model.`` (``encoder.conv1``, ``decoder.layers.N.encoder_attn.q_proj``
...); ``proj_out`` is the token embedding (tied).

- **Encoder graph** (once per 30 s window): ``input_features`` float32 ``[n, n_mels, 3000]`` ->
  the decoder's cross-attention keys and values, each ``[n, decoder_layers, 1500, heads, head_dim]`` (compute
  dtype): two convolutions (kernel 3, GELU; the second stride 2) as matmuls over shifted frames, plus the
  position table, pre-LayerNorm layers, final LayerNorm, then every decoder layer's ``encoder_attn``
  key/value projections.  The pipeline model stores them in the cross cache's pages (one request per
  window).
- **Decoder step graph**: ``tokens`` int64 ``[total_seq_len]`` (ragged), ``input_row_offsets`` uint32
  ``[batch + 1]``, ``cross_row_offsets`` uint32 ``[batch + 1]`` (each request's encoder positions in the cross
  cache), the self-attention cache's inputs, then the cross cache's; output float32 logits ``[batch, vocab]``
  of each request's last token.  Self-attention runs on the paged cache (K/V written by ``ragged_qkv_store``,
  causal ``flash_attention_ragged``), positions are the cache's (``ragged_write_plan``); cross-attention is
  ``cross_attention_ragged`` (no mask) over the cross cache, so one graph serves prompts and decode steps.
"""

from __future__ import annotations

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, Weight, ops
from max.nn import LayerList, LayerNorm, Module, kernels
from max.nn.kernels import MHAMaskVariant
from max.nn.kernels_decoder import ragged_write_plan
from max.nn.kv_cache import FetchPagedKVCacheCollection, KVCacheParams
from max.pipelines.architectures.common.layers import activation
from max.pipelines.architectures.common.weights import WeightFactory
from max.pipelines.architectures.whisper.config import N_FRAMES, WhisperConfig

__all__ = ["Whisper", "build_decoder_graph", "build_encoder_graph"]

_EPS = 1e-5


class _Conv1d(Module):
    """A kernel-3, padding-1 convolution over time on channels-last input ``[n, time, in]``."""

    def __init__(self, f: WeightFactory, in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.weight = Weight("weight", f.dtype, [out_ch, in_ch, 3], f.device)
        self.bias = Weight("bias", f.dtype, [out_ch], f.device)
        self.in_ch, self.out_ch, self.stride = in_ch, out_ch, stride

    def __call__(self, x: TensorValue, length: int) -> TensorValue:
        xp = ops.pad(x, [0, 0, 1, 1, 0, 0])
        out_len = (length - 1) // self.stride + 1
        taps = [xp[:, k:k + self.stride * (out_len - 1) + 1:self.stride, :] for k in range(3)]
        cols = ops.concat(taps, axis=-1)  # [n, out_len, 3 * in]: tap-major
        w = ops.reshape(ops.permute(self.weight, [2, 1, 0]), [3 * self.in_ch, self.out_ch])
        return cols @ w + self.bias


class _Attention(Module):
    """q/k/v/out projections (k without bias), as both attention kinds name them."""

    def __init__(self, f: WeightFactory, p: str, d: int) -> None:
        super().__init__()
        self.q_proj = f.linear(f"{p}.q_proj", d, d, has_bias=True)
        self.k_proj = f.linear(f"{p}.k_proj", d, d, has_bias=False)
        self.v_proj = f.linear(f"{p}.v_proj", d, d, has_bias=True)
        self.out_proj = f.linear(f"{p}.out_proj", d, d, has_bias=True)


def _ffn(layer: Module, f: WeightFactory, p: str, d: int, ffn: int, act: str) -> None:
    """``fc1``/``fc2`` (with biases) on ``layer`` itself, where the checkpoint names them."""
    layer.fc1 = f.linear(f"{p}.fc1", d, ffn, has_bias=True)
    layer.fc2 = f.linear(f"{p}.fc2", ffn, d, has_bias=True)
    object.__setattr__(layer, "_act", activation(act, "Whisper"))


class EncoderLayer(Module):
    def __init__(self, c: WhisperConfig, f: WeightFactory, i: int) -> None:
        super().__init__()
        p = f"encoder.layers.{i}"
        d = c.d_model
        self.n_heads, self.head_dim = c.encoder_attention_heads, c.encoder_head_dim
        self.self_attn = _Attention(f, f"{p}.self_attn", d)
        self.self_attn_layer_norm = LayerNorm(d, f.device, f.dtype, eps=_EPS)
        _ffn(self, f, p, d, c.encoder_ffn_dim, c.activation_function)
        self.final_layer_norm = LayerNorm(d, f.device, f.dtype, eps=_EPS)

    def _heads(self, x: TensorValue) -> TensorValue:
        return ops.transpose(ops.reshape(x, [x.shape[0], x.shape[1], self.n_heads, self.head_dim]), 1, 2)

    def __call__(self, x: TensorValue) -> TensorValue:
        a = self.self_attn
        h = self.self_attn_layer_norm(x)
        q, k, v = self._heads(a.q_proj(h)), self._heads(a.k_proj(h)), self._heads(a.v_proj(h))
        ctx = ops.softmax((q @ ops.transpose(k, -1, -2)) * (float(self.head_dim) ** -0.5)) @ v
        n, s = x.shape[0], x.shape[1]
        x = x + a.out_proj(ops.reshape(ops.transpose(ctx, 1, 2), [n, s, self.n_heads * self.head_dim]))
        return x + self.fc2(self._act(self.fc1(self.final_layer_norm(x))))


class Encoder(Module):
    def __init__(self, c: WhisperConfig, f: WeightFactory) -> None:
        super().__init__()
        self.c = c
        self.conv1 = _Conv1d(f, c.num_mel_bins, c.d_model, 1)
        self.conv2 = _Conv1d(f, c.d_model, c.d_model, 2)
        self.embed_positions = f.embedding("encoder.embed_positions", c.max_source_positions, c.d_model)
        self.layers = LayerList([EncoderLayer(c, f, i) for i in range(c.encoder_layers)])
        self.layer_norm = LayerNorm(c.d_model, f.device, f.dtype, eps=_EPS)

    def __call__(self, features: TensorValue) -> TensorValue:
        c = self.c
        act = activation(c.activation_function, "Whisper")
        x = ops.permute(features, [0, 2, 1])  # [n, frames, mels]
        x = act(self.conv1(x, N_FRAMES))
        x = act(self.conv2(x, N_FRAMES))  # [n, 1500, d]
        x = x + self.embed_positions.weight
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class DecoderLayer(Module):
    def __init__(self, c: WhisperConfig, f: WeightFactory, i: int, kv_params: KVCacheParams,
                 cross_params: KVCacheParams) -> None:
        super().__init__()
        p = f"decoder.layers.{i}"
        d = c.d_model
        self.layer = i
        self.n_heads, self.head_dim = c.decoder_attention_heads, c.head_dim
        self.kv_params, self.cross_params = kv_params, cross_params
        self.self_attn = _Attention(f, f"{p}.self_attn", d)
        self.self_attn_layer_norm = LayerNorm(d, f.device, f.dtype, eps=_EPS)
        self.encoder_attn = _Attention(f, f"{p}.encoder_attn", d)
        self.encoder_attn_layer_norm = LayerNorm(d, f.device, f.dtype, eps=_EPS)
        _ffn(self, f, p, d, c.decoder_ffn_dim, c.activation_function)
        self.final_layer_norm = LayerNorm(d, f.device, f.dtype, eps=_EPS)

    def cross_kv(self, enc: TensorValue) -> tuple[TensorValue, TensorValue]:
        """This layer's cross-attention keys and values, each ``[n, source_len, heads, head_dim]``, of encoder
        output ``enc`` ``[n, source_len, d]``."""
        n, s = enc.shape[0], enc.shape[1]

        def heads(x: TensorValue) -> TensorValue:
            return ops.reshape(x, [n, s, self.n_heads, self.head_dim])

        return heads(self.encoder_attn.k_proj(enc)), heads(self.encoder_attn.v_proj(enc))

    def __call__(self, x: TensorValue, kv: object, offsets: TensorValue, cross: object,
                 cross_offsets: TensorValue) -> TensorValue:
        scale = float(self.head_dim) ** -0.5
        a = self.self_attn
        h = self.self_attn_layer_norm(x)
        qkv = ops.concat([a.q_proj(h), a.k_proj(h), a.v_proj(h)], axis=-1)
        q = kernels.ragged_qkv_store(self.kv_params, qkv, offsets, kv, self.layer, self.n_heads, freqs_cis=None,
                                     interleaved=False)
        layer_idx = ops.constant(self.layer, DType.uint32, x.device)
        o = kernels.flash_attention_ragged(self.kv_params, q, offsets, kv, layer_idx, MHAMaskVariant.CAUSAL_MASK,
                                           scale)
        x = x + a.out_proj(ops.reshape(o, [x.shape[0], self.n_heads * self.head_dim]))
        e = self.encoder_attn
        q = e.q_proj(self.encoder_attn_layer_norm(x))
        o = kernels.cross_attention_ragged(self.cross_params, q, offsets, cross, layer_idx, MHAMaskVariant.NULL_MASK,
                                           cross_offsets, None, scale)
        x = x + e.out_proj(o)
        return x + self.fc2(self._act(self.fc1(self.final_layer_norm(x))))


class Decoder(Module):
    def __init__(self, c: WhisperConfig, f: WeightFactory, kv_params: KVCacheParams,
                 cross_params: KVCacheParams) -> None:
        super().__init__()
        self.c = c
        self.kv_params, self.cross_params = kv_params, cross_params
        self.embed_tokens = f.embedding("decoder.embed_tokens", c.vocab_size, c.d_model)
        self.embed_positions = f.embedding("decoder.embed_positions", c.max_target_positions, c.d_model)
        self.layers = LayerList([DecoderLayer(c, f, i, kv_params, cross_params) for i in range(c.decoder_layers)])
        self.layer_norm = LayerNorm(c.d_model, f.device, f.dtype, eps=_EPS)

    def __call__(self, tokens: TensorValue, offsets: TensorValue, cross_offsets: TensorValue, kv_inputs: list,
                 cross_inputs: list) -> TensorValue:
        c = self.c
        kv = FetchPagedKVCacheCollection(self.kv_params, c.decoder_layers)(*kv_inputs)
        cross = FetchPagedKVCacheCollection(self.cross_params, c.decoder_layers)(*cross_inputs)
        positions, _, _ = ragged_write_plan(offsets, kv)
        x = self.embed_tokens(tokens)
        if c.scale_embedding:
            x = x * float(c.d_model) ** 0.5
        pos = ops.gather(self.embed_positions.weight, positions, axis=0)
        x = x + ops.rebind(pos, [x.shape[0], c.d_model], "one position per token")
        for layer in self.layers:
            x = layer(x, kv, offsets, cross, cross_offsets)
        last = offsets.cast(DType.int64)[1:] - 1
        h = self.layer_norm(ops.gather(x, last, axis=0))
        return ops.cast(h @ ops.transpose(self.embed_tokens.weight, 0, 1), DType.float32)  # proj_out: tied


class Whisper(Module):
    def __init__(self, c: WhisperConfig, f: WeightFactory, kv_params: KVCacheParams,
                 cross_params: KVCacheParams) -> None:
        super().__init__()
        self.config = c
        self.dtype = f.dtype
        self.encoder = Encoder(c, f)
        self.decoder = Decoder(c, f, kv_params, cross_params)
        f.check_paths(self)

    def encode(self, features: TensorValue) -> tuple[TensorValue, TensorValue]:
        enc = self.encoder(ops.cast(features, self.dtype))
        ks, vs = zip(*[layer.cross_kv(enc) for layer in self.decoder.layers])
        return ops.stack(list(ks), axis=1), ops.stack(list(vs), axis=1)


def build_encoder_graph(model: Whisper, device: DeviceRef) -> Graph:
    c = model.config
    t = TensorType(DType.float32, ["n_windows", c.num_mel_bins, N_FRAMES], device)
    with Graph(f"{c.architecture}.encoder", input_types=[t]) as g:
        g.output(*model.encode(g.inputs[0].tensor))
    return g


def build_decoder_graph(model: Whisper, kv_symbols: list, cross_symbols: list, device: DeviceRef) -> Graph:
    """The decoder step graph (prompt steps and decode steps alike) over the self-attention cache's inputs
    ``kv_symbols`` and the cross cache's ``cross_symbols``."""
    c = model.config
    types = [TensorType(DType.int64, ["total_seq_len"], device),
             TensorType(DType.uint32, ["input_row_offsets_len"], device),
             TensorType(DType.uint32, ["input_row_offsets_len"], device)]
    n_kv = len(kv_symbols)
    with Graph(f"{c.architecture}.decoder", input_types=[*types, *kv_symbols, *cross_symbols]) as g:
        tokens, offsets, cross_offsets, *rest = g.inputs
        g.output(model.decoder(tokens.tensor, offsets.tensor, cross_offsets.tensor, rest[:n_kv], rest[n_kv:]))
    return g
