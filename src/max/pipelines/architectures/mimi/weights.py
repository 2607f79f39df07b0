"""Checkpoint tensors -> the names and forms :class:`~max.pipelines.architectures.mimi.model.MimiNet` uses.

Saved Mimi checkpoints use flat names (``encoder.layers.N``, ``encoder_transformer``, ``downsample``,
``upsample``, ``decoder_transformer``, ``decoder.layers.N``); a live ``MimiModel.state_dict()`` nests them under
its two halves (``encoder.encoder_seanet``, ``decoder.decoder_seanet`` ...): both are accepted.  Each
codebook's table is made once, ``embed_sum / max(cluster_usage, 1e-5)``; the grouped upsampling weight
``[in, out / groups, kernel]`` is expanded to the dense ``[in, out, kernel]`` (zeros across groups)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from max.pipelines.architectures.common.weights import float_tensor
from max.pipelines.architectures.mimi.config import WHO, MimiSettings

__all__ = ["adapt_tensors"]

_NESTED = (
    ("encoder.encoder_seanet.", "encoder."),
    ("encoder.encoder_transformer.", "encoder_transformer."),
    ("encoder.downsample.", "downsample."),
    ("decoder.upsample.", "upsample."),
    ("decoder.decoder_transformer.", "decoder_transformer."),
    ("decoder.decoder_seanet.", "decoder."),
)
_CODEBOOK_EPS = 1e-5


def _tensor(name: str, v: Any) -> torch.Tensor:
    try:
        return float_tensor(v).detach().to("cpu")
    except (TypeError, ValueError) as e:
        raise TypeError(f"{WHO}: tensor {name!r} cannot be read as a float tensor ({e})") from e


def adapt_tensors(s: MimiSettings, tensors: Mapping[str, Any], prefix: str = "") -> dict[str, torch.Tensor]:
    """The module-named float32 tensors of the checkpoint entries under ``prefix``."""
    raw: dict[str, torch.Tensor] = {}
    for name, v in tensors.items():
        if not name.startswith(prefix):
            continue
        n = name[len(prefix):]
        for old, new in _NESTED:
            if n.startswith(old):
                n = new + n[len(old):]
                break
        raw[n] = _tensor(name, v)
    if not raw:
        raise ValueError(f"{WHO}: no tensors under the prefix {prefix!r}")
    out: dict[str, torch.Tensor] = {}
    for n, t in raw.items():
        if n.endswith(".codebook.initialized") or n.endswith(".codebook.cluster_usage"):
            continue
        if n.endswith(".codebook.embed_sum"):
            base = n[: -len("embed_sum")]
            usage = raw.get(base + "cluster_usage")
            if usage is None:
                raise ValueError(f"{WHO}: {prefix}{n} comes without its cluster_usage")
            t = t.float() / usage.float().clamp(min=_CODEBOOK_EPS)[:, None]
            n = base + "embed"
        elif n.endswith(".codebook._embed"):
            n = n[: -len("_embed")] + "embed"
        out[n] = t.float().contiguous()
    up = out.get("upsample.conv.weight")
    if up is not None and s.has_resample and up.shape[1] != s.hidden_size:
        out["upsample.conv.weight"] = _dense_grouped(up, s.upsample_groups)
    return out


def _dense_grouped(w: torch.Tensor, groups: int) -> torch.Tensor:
    """A grouped transposed-convolution weight ``[in, out/g, k]`` as the dense ``[in, out, k]``."""
    cin, cout_g, k = w.shape
    if cin % groups:
        raise ValueError(f"{WHO}: upsample weight {list(w.shape)} does not split into {groups} groups")
    cin_g = cin // groups
    dense = torch.zeros(cin, groups * cout_g, k, dtype=w.dtype)
    for g in range(groups):
        dense[g * cin_g:(g + 1) * cin_g, g * cout_g:(g + 1) * cout_g] = w[g * cin_g:(g + 1) * cin_g]
    return dense
