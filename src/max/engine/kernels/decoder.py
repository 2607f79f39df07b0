"""Kernels for ``max.nn.kernels_decoder`` (RoPE on projected q/k, K/V rows into the paged cache).

Its write plan and RoPE tables are ``max.nn.kernels``' (kernels in ``ragged``).

Pool layout as in ``ragged``: ``blocks[page, 0 (K) | 1 (V), layer, offset, kv_head, head_dim]``.
"""

from __future__ import annotations

import torch

from max.engine.kernels import kernel


@kernel("ragged_rope")
def ragged_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    rot = 2 * cos.shape[-1]
    xf = x[..., :rot].float()
    if interleaved:
        a, b = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        h = rot // 2
        a, b = xf[..., :h], xf[..., h:]
        out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    out = out.to(x.dtype)
    if rot == x.shape[-1]:
        return out
    return torch.cat((out, x[..., rot:]), dim=-1)


@kernel("store_kv_ragged", pure=False)
def store_kv_ragged(k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor, write_page: torch.Tensor,
                    write_offset: torch.Tensor, layer: int) -> None:
    blocks[write_page, 0, layer, write_offset] = k.to(blocks.dtype)
    blocks[write_page, 1, layer, write_offset] = v.to(blocks.dtype)
