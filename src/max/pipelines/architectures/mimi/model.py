"""Mimi as ``max.nn`` modules named as the checkpoint names them (``encoder.layers.N``, ``encoder_transformer``,
``downsample``, ``quantizer.{semantic,acoustic}_residual_vector_quantizer``, ``upsample``,
``decoder_transformer``, ``decoder.layers.N``), and its two graphs:

- **encode**: waveform float32 ``[batch, samples, 1]`` plus one zero tensor per strided convolution giving its
  right padding (``extra_i`` frames, computed from the length by :func:`encoder_paddings`) -> codes int64
  ``[batch, num_codebooks, frames]``: SEANet encoder, encoder transformer (sliding-window causal attention from
  position 0), replicate-padded downsampling, then the split residual quantiser's nearest-code search
  (squared distances in float64, first index on ties).
- **decode step**: codes int64 ``[batch, num_codebooks, frames]``, each row's transformer position offset int64
  ``[batch]`` and the stream state (:meth:`MimiNet.decode_state_shapes`) -> waveform float32
  ``[batch, frames * samples_per_frame]`` and the next state.  Whole-codes decoding is one step from the zero
  state.
"""

from __future__ import annotations

import numpy as np

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, Weight, ops
from max.nn import LayerList, Module
from max.pipelines.architectures.mimi.config import MimiSettings
from max.pipelines.architectures.mimi.layers import (
    CPU,
    F32,
    CausalConv1d,
    CausalConvTranspose1d,
    Elu,
    TransformerLayer,
    extra_padding,
    rope_and_mask,
    rope_inv_freq,
)

__all__ = ["MimiNet", "build_decode_graph", "build_encode_graph", "encoder_paddings"]


class ResnetBlock(Module):
    """``block``: ELU, conv (kernel ``residual_kernel_size``, dilation), ELU, conv (kernel 1); plus the input."""

    def __init__(self, s: MimiSettings, dim: int, dilation: int) -> None:
        super().__init__()
        hidden = dim // s.compress
        self.block = LayerList([Elu(), CausalConv1d(dim, hidden, s.residual_kernel_size, dilation=dilation),
                                Elu(), CausalConv1d(hidden, dim, 1)])

    def convs(self) -> list[CausalConv1d]:
        return [self.block[1], self.block[3]]

    def step(self, x: TensorValue, states: list) -> tuple[TensorValue, list]:
        y, new = x, []
        for layer in self.block:
            if isinstance(layer, CausalConv1d):
                st = states.pop(0) if layer.state_len else None
                y, ns = layer.step(y, st)
                if ns is not None:
                    new.append(ns)
            else:
                y = layer(y)
        return x + y, new

    def whole(self, x: TensorValue) -> TensorValue:
        y = x
        for layer in self.block:
            y = layer.whole(y, None) if isinstance(layer, CausalConv1d) else layer(y)
        return x + y


class SEANetEncoder(Module):
    def __init__(self, s: MimiSettings) -> None:
        super().__init__()
        nf = s.num_filters
        layers: list[Module] = [CausalConv1d(s.audio_channels, nf, s.kernel_size)]
        scaling = 1
        for ratio in reversed(s.upsampling_ratios):
            cur = scaling * nf
            layers += [ResnetBlock(s, cur, s.dilation_growth_rate ** j) for j in range(s.num_residual_layers)]
            layers += [Elu(), CausalConv1d(cur, cur * 2, ratio * 2, stride=ratio)]
            scaling *= 2
        layers += [Elu(), CausalConv1d(scaling * nf, s.hidden_size, s.last_kernel_size)]
        self.layers = LayerList(layers)

    def strided(self) -> list[CausalConv1d]:
        return [c for c in self.layers if isinstance(c, CausalConv1d) and c.stride > 1]

    def __call__(self, x: TensorValue, extras: list[TensorValue]) -> TensorValue:
        extras = list(extras)
        for layer in self.layers:
            if isinstance(layer, CausalConv1d):
                x = layer.whole(x, extras.pop(0) if layer.stride > 1 else None)
            elif isinstance(layer, ResnetBlock):
                x = layer.whole(x)
            else:
                x = layer(x)
        return x


class SEANetDecoder(Module):
    def __init__(self, s: MimiSettings) -> None:
        super().__init__()
        nf = s.num_filters
        scaling = 2 ** len(s.upsampling_ratios)
        layers: list[Module] = [CausalConv1d(s.hidden_size, scaling * nf, s.kernel_size)]
        for ratio in s.upsampling_ratios:
            cur = scaling * nf
            layers += [Elu(), CausalConvTranspose1d(cur, cur // 2, ratio * 2, ratio)]
            layers += [ResnetBlock(s, cur // 2, s.dilation_growth_rate ** j) for j in range(s.num_residual_layers)]
            scaling //= 2
        layers += [Elu(), CausalConv1d(nf, s.audio_channels, s.last_kernel_size)]
        self.layers = LayerList(layers)

    def state_shapes(self) -> list[list[int]]:
        out = []
        for layer in self.layers:
            if isinstance(layer, CausalConv1d) and layer.state_len:
                out.append([layer.state_len, layer.in_ch])
            elif isinstance(layer, CausalConvTranspose1d) and layer.state_len:
                out.append([layer.state_len, layer.stride, layer.out_ch])
            elif isinstance(layer, ResnetBlock):
                out += [[c.state_len, c.in_ch] for c in layer.convs() if c.state_len]
        return out

    def step(self, x: TensorValue, states: list) -> tuple[TensorValue, list]:
        new: list = []
        for layer in self.layers:
            if isinstance(layer, (CausalConv1d, CausalConvTranspose1d)):
                x, ns = layer.step(x, states.pop(0) if layer.state_len else None)
                if ns is not None:
                    new.append(ns)
            elif isinstance(layer, ResnetBlock):
                x, ns = layer.step(x, states)
                new += ns
            else:
                x = layer(x)
        return x, new


class Transformer(Module):
    def __init__(self, s: MimiSettings) -> None:
        super().__init__()
        self.layers = LayerList([TransformerLayer(s) for _ in range(s.num_hidden_layers)])


class _Codebook(Module):
    def __init__(self, s: MimiSettings) -> None:
        super().__init__()
        self.codebook = Module()
        # embed_sum / max(cluster_usage, 1e-5), made on load
        self.codebook.embed = Weight("embed", F32, [s.codebook_size, s.codebook_dim], CPU)


class ResidualVQ(Module):
    def __init__(self, s: MimiSettings, n: int) -> None:
        super().__init__()
        self.layers = LayerList([_Codebook(s) for _ in range(n)])
        self.input_proj = self.output_proj = None
        if s.vq_dim != s.hidden_size:
            self.input_proj = Module()
            self.input_proj.weight = Weight("weight", F32, [s.vq_dim, s.hidden_size, 1], CPU)
            self.output_proj = Module()
            self.output_proj.weight = Weight("weight", F32, [s.hidden_size, s.vq_dim, 1], CPU)

    def encode(self, x: TensorValue, n: int) -> list[TensorValue]:
        """Codes ``[b, t]`` of the first ``n`` codebooks for latents ``x`` ``[b, t, hidden]``."""
        if self.input_proj is not None:
            x = x @ ops.transpose(ops.squeeze(self.input_proj.weight, 2), 0, 1)
        codes = []
        residual = x
        for layer in list(self.layers)[:n]:
            e = layer.codebook.embed
            e64 = ops.cast(e, DType.float64)
            dist = ops.squeeze(ops.sum(e64 * e64, -1), 1) - 2.0 * (ops.cast(residual, DType.float64)
                                                                   @ ops.transpose(e64, 0, 1))
            idx = ops.squeeze(ops.argmin(dist, -1), -1)  # [b, t]
            codes.append(idx)
            residual = residual - ops.gather(e, idx, axis=0)
        return codes

    def decode(self, codes: TensorValue) -> TensorValue:
        """Latents ``[b, t, hidden]`` of codes ``[b, n, t]`` of the first ``n`` codebooks: one lookup in the
        codebooks' stacked tables, summed over the codebooks."""
        n = int(codes.shape[1])
        size = int(self.layers[0].codebook.embed.shape[0])
        table = ops.concat([layer.codebook.embed for layer in list(self.layers)[:n]], axis=0)
        shift = ops.constant(np.arange(n, dtype=np.int64).reshape(1, n, 1) * size, DType.int64, CPU)
        q = ops.squeeze(ops.sum(ops.gather(table, codes + shift, axis=0), 1), 1)  # [b, n, t, d] -> [b, t, d]
        if self.output_proj is not None:
            q = q @ ops.transpose(ops.squeeze(self.output_proj.weight, 2), 0, 1)
        return q


class SplitRVQ(Module):
    def __init__(self, s: MimiSettings) -> None:
        super().__init__()
        self.n_sem = s.num_semantic_quantizers
        self.semantic_residual_vector_quantizer = ResidualVQ(s, s.num_semantic_quantizers)
        self.acoustic_residual_vector_quantizer = ResidualVQ(s, s.num_quantizers - s.num_semantic_quantizers)

    def encode(self, x: TensorValue, n: int) -> TensorValue:
        codes = self.semantic_residual_vector_quantizer.encode(x, self.n_sem)
        if n > self.n_sem:
            codes += self.acoustic_residual_vector_quantizer.encode(x, n - self.n_sem)
        return ops.stack(codes, axis=1)

    def decode(self, codes: TensorValue) -> TensorValue:
        q = self.semantic_residual_vector_quantizer.decode(codes[:, :self.n_sem])
        if int(codes.shape[1]) > self.n_sem:
            q = q + self.acoustic_residual_vector_quantizer.decode(codes[:, self.n_sem:])
        return q


class MimiNet(Module):
    def __init__(self, s: MimiSettings) -> None:
        super().__init__()
        self.s = s
        self.encoder = SEANetEncoder(s)
        self.encoder_transformer = Transformer(s)
        self.quantizer = SplitRVQ(s)
        self.decoder_transformer = Transformer(s)
        self.decoder = SEANetDecoder(s)
        st = s.latent_stride
        self.downsample = self.upsample = None
        if s.has_resample:
            self.downsample = CausalConv1d(s.hidden_size, s.hidden_size, 2 * st, stride=st, bias=False,
                                           pad_mode="replicate")
            self.upsample = CausalConvTranspose1d(s.hidden_size, s.hidden_size, 2 * st, st, bias=False)

    # ------------------------------------------------------------------ decode
    def decode_state_shapes(self) -> list[list[int]]:
        """Per-request shapes (batch axis left out) of the decode stream state, in graph order."""
        s = self.s
        out = []
        if self.upsample is not None and self.upsample.state_len:
            out.append([self.upsample.state_len, self.upsample.stride, self.upsample.out_ch])
        out += [[s.num_key_value_heads, int(s.sliding_window), s.head_dim]] * (2 * s.num_hidden_layers)
        return out + self.decoder.state_shapes()

    def decode_step(self, codes: TensorValue, offsets: TensorValue, states: list) -> tuple[TensorValue, list]:
        s = self.s
        states = list(states)
        new: list = []
        x = self.quantizer.decode(codes)
        if self.upsample is not None:
            x, ns = self.upsample.step(x, states.pop(0) if self.upsample.state_len else None)
            if ns is not None:
                new.append(ns)
        cos, sin, mask = rope_and_mask(rope_inv_freq(s), offsets, x.shape[1], int(s.sliding_window), True)
        for layer in self.decoder_transformer.layers:
            k, v = states.pop(0), states.pop(0)
            x, (nk, nv) = layer(x, cos, sin, mask, (k, v))
            new += [nk, nv]
        x, ns = self.decoder.step(x, states)
        new += ns
        return ops.squeeze(x, -1), new

    # ------------------------------------------------------------------ encode
    def strided_convs(self) -> list[CausalConv1d]:
        return self.encoder.strided() + ([self.downsample] if self.downsample is not None else [])

    def encode(self, wave: TensorValue, extras: list[TensorValue], n: int) -> TensorValue:
        s = self.s
        extras = list(extras)
        x = self.encoder(wave, extras[:len(self.encoder.strided())])
        zero = ops.constant(np.zeros(1, np.int64), DType.int64, CPU)
        cos, sin, mask = rope_and_mask(rope_inv_freq(s), zero, x.shape[1], int(s.sliding_window), False)
        for layer in self.encoder_transformer.layers:
            x, _ = layer(x, cos, sin, mask, None)
        if self.downsample is not None:
            x = self.downsample.whole(x, extras[-1])
        return self.quantizer.encode(x, n)


def encoder_paddings(net: MimiNet, samples: int) -> list[tuple[int, int]]:
    """(right padding, input channels) of each strided convolution of the encoder for ``samples`` samples."""
    out, length = [], samples
    for conv in net.strided_convs():
        extra = extra_padding(length, conv.kernel, conv.stride)
        out.append((extra, conv.in_ch))
        length = (length + conv.state_len + extra - conv.kernel) // conv.stride + 1
    return out


def build_decode_graph(net: MimiNet, num_codebooks: int, device: DeviceRef = CPU) -> Graph:
    shapes = net.decode_state_shapes()
    types = [TensorType(DType.int64, ["batch", num_codebooks, "frames"], device),
             TensorType(DType.int64, ["batch"], device)]
    types += [TensorType(F32, ["batch", *sh], device) for sh in shapes]
    with Graph(f"mimi.decode{num_codebooks}", input_types=types) as g:
        codes, offsets, *states = (v.tensor for v in g.inputs)
        audio, new = net.decode_step(codes, offsets, states)
        g.output(audio, *new)
    return g


def build_encode_graph(net: MimiNet, num_codebooks: int, device: DeviceRef = CPU) -> Graph:
    types = [TensorType(F32, ["batch", "samples", 1], device)]
    types += [TensorType(F32, ["batch", f"extra{i}", c.in_ch], device) for i, c in enumerate(net.strided_convs())]
    with Graph(f"mimi.encode{num_codebooks}", input_types=types) as g:
        wave, *extras = (v.tensor for v in g.inputs)
        g.output(net.encode(wave, extras, num_codebooks))
    return g
