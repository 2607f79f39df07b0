"""DeepSeek-V3 configuration from a Hugging Face ``config.json``: DeepSeek-V2's (MLA sizes, YaRN softmax
scale, dense first layers, shared experts) with V3's router (see the package docstring) and
``rope_interleave`` choosing the RoPE layout."""

from __future__ import annotations

import dataclasses

from max.pipelines.architectures.common import DecoderConfig
from max.pipelines.architectures.deepseek_v2.config import config_from_hf as v2_config


def config_from_hf(hf: dict) -> DecoderConfig:
    method = hf.get("topk_method") or "noaux_tc"
    if method != "noaux_tc":
        raise NotImplementedError(f"DeepseekV3ForCausalLM: topk_method {method!r} is not supported (noaux_tc)")
    c = v2_config({**hf, "topk_method": "greedy"})
    n_group, topk_group = int(hf.get("n_group") or 1), int(hf.get("topk_group") or 1)
    E = c.moe.num_experts
    if E % n_group or not 1 <= topk_group <= n_group or E // n_group < 2:
        raise ValueError(f"DeepseekV3ForCausalLM: n_group {n_group} / topk_group {topk_group} do not fit {E} experts "
                         "(each group needs at least 2 experts)")
    moe = dataclasses.replace(c.moe, routing="sigmoid_bias", renormalize=bool(hf.get("norm_topk_prob", True)),
                              n_group=n_group, topk_group=topk_group)
    return dataclasses.replace(c, architecture="DeepseekV3ForCausalLM", moe=moe,
                               interleaved_rope=bool(hf.get("rope_interleave", True)))
