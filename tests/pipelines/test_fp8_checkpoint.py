"""FP8 safetensors checkpoints (the Hugging Face layout: ``float8_e4m3fn`` weights with per-block
``weight_scale_inv`` or per-tensor ``weight_scale``) load with their projections kept float8 in memory
(``Float8Linear``, scaled on use) and generate token-identically to transformers running the same
(dequantised) weights."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch
from safetensors.torch import load_file, save_file

from family_support import hf_greedy, tiny_family
from max.interfaces import SamplingParams, TextGenerationRequest

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _fp8_copy(scheme: str):
    """The tiny Llama's projections quantised to float8 (block 16x16 or per tensor), the rest as is; and
    a transformers model holding exactly the dequantised values."""
    d, model, tok = tiny_family("llama")
    sd = load_file(os.path.join(d, "model.safetensors"))
    out, deq = {}, {}
    for k, v in sd.items():
        if v.dim() == 2 and any(p in k for p in PROJ):
            o, i = v.shape
            if scheme == "block":
                b = 16
                vb = v.float().reshape(o // b, b, i // b, b)
                scale = vb.abs().amax(dim=(1, 3)) / 448.0
                w8 = (vb / scale[:, None, :, None]).reshape(o, i).to(torch.float8_e4m3fn)
                out[k.replace(".weight", ".weight_scale_inv")] = scale.contiguous()
                deq[k] = (w8.float().reshape(o // b, b, i // b, b) * scale[:, None, :, None]).reshape(o, i)
            else:
                scale = v.float().abs().max() / 448.0
                w8 = (v.float() / scale).to(torch.float8_e4m3fn)
                out[k.replace(".weight", ".weight_scale")] = scale.reshape([]).clone()
                deq[k] = w8.float() * scale
            out[k] = w8
        else:
            out[k] = v
    folder = tempfile.mkdtemp(prefix=f"libremax-fp8-{scheme}-")
    save_file(out, os.path.join(folder, "model.safetensors"))
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["quantization_config"] = ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [16, 16]}
                                  if scheme == "block" else {"quant_method": "fp8", "activation_scheme": "dynamic"})
    json.dump(cfg, open(os.path.join(folder, "config.json"), "w"))
    tok.save_pretrained(folder)
    ref = type(model)(model.config).eval()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if n in deq:
                p.copy_(deq[n])
    return folder, ref, tok


@pytest.mark.parametrize("scheme", ["block", "tensor"])
def test_fp8_checkpoint_generates_like_transformers(scheme):
    from max.entrypoints.llm import LLM
    from max.pipelines import PipelineConfig

    folder, ref, tok = _fp8_copy(scheme)
    llm = LLM(PipelineConfig(model_path=folder, max_length=128, max_batch_size=2, kv_cache_page_size=16))
    consts = llm.pipeline.pipeline_model.model._consts
    n_f8 = sum(isinstance(c, torch.Tensor) and c.dtype == torch.float8_e4m3fn for c in consts)
    assert n_f8 >= 7 * ref.config.num_hidden_layers  # every projection's weight stays float8 in memory
    prompts = ["def forward(self, x):", "import os"]
    sp = SamplingParams(top_k=1, max_new_tokens=10)
    outs = llm.pipeline.generate([TextGenerationRequest(request_id=f"f{i}", model_name="fp8", prompt=p,
                                                        sampling_params=sp) for i, p in enumerate(prompts)])
    assert [o.tokens for o in outs] == [hf_greedy(ref, tok(p)["input_ids"], 10) for p in prompts]
