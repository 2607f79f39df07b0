"""A zoo of transformers causal-LM classes for the transformers-fallback tests: each a tiny random checkpoint
of its own config class (hidden 32, 2-5 layers, the shared BPE tokenizer's 512-token vocabulary).

``ZOO`` maps a class name to its ``model_type`` (which picks the config class) and the config fields that
differ from the shared tiny sizes ``TINY`` (only the fields a config class declares are passed to it).
``REFUSED`` names the classes the fallback must refuse, with the reason.  :func:`recurrent_causal_lms` lists
the recurrent / hybrid causal LMs the installed transformers ships (found in its modeling sources), which
the zoo must all cover.
"""

from __future__ import annotations

import inspect
import os
import re
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

VOCAB = 512  # the shared BPE tokenizer's (test_hf_utils.make_bpe_tokenizer)

TINY: dict[str, Any] = dict(
    vocab_size=VOCAB, unpadded_vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, attention_head_dim=8, max_position_embeddings=128,
    sliding_window=4, attention_window_size=4, sliding_window_size=4, initializer_range=0.2,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
    # GPT-2 style names
    n_embd=32, n_layer=2, n_head=4, n_positions=128, n_inner=64, rotary_dim=4,
    # mixture of experts
    moe_intermediate_size=32, shared_expert_intermediate_size=32, shared_intermediate_size=32, num_experts=4,
    num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
    n_group=1, topk_group=1, router_hidden_size=16,
    # multi-head latent attention
    kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8,
    # Mamba / Mamba-2 mixers
    state_size=8, mamba_d_state=8, ssm_state_size=8, mamba_n_heads=4, mamba_d_head=16, mamba_num_heads=4,
    mamba_head_dim=16, n_groups=1, mamba_n_groups=1, mamba_ngroups=1, n_mamba_heads=2, mamba_d_ssm=64,
    chunk_size=8, mamba_chunk_size=8,
    # linear attention (gated delta net, KDA, ...)
    linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_head_dim=8, linear_num_heads=4, lru_width=32, layer_group_size=2, hc_lowrank=8,
    swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=8, rel_extent=16, d_rel=4,
    n_layers_per_attn_res_block=1, vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=8,
)

LIN_FULL = ["linear_attention", "full_attention"]

# class -> (model_type, config fields beyond TINY); recurrent / hybrid classes first
ZOO: dict[str, tuple[str, dict]] = {
    "MambaForCausalLM": ("mamba", {}),
    "Mamba2ForCausalLM": ("mamba2", dict(num_heads=4, head_dim=16)),
    "FalconMambaForCausalLM": ("falcon_mamba", {}),
    "JambaForCausalLM": ("jamba", dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                                       expert_layer_offset=1)),
    "ZambaForCausalLM": ("zamba", dict(num_hidden_layers=5, attn_layer_period=2, attn_layer_offset=1)),
    "Zamba2ForCausalLM": ("zamba2", dict(layers_block_type=["mamba", "hybrid"])),
    "BambaForCausalLM": ("bamba", dict(attn_layer_indices=[1])),
    "FalconH1ForCausalLM": ("falcon_h1", {}),
    "GraniteMoeHybridForCausalLM": ("granitemoehybrid", dict(layer_types=["mamba", "attention"])),
    "NemotronHForCausalLM": ("nemotron_h", dict(layers_block_type=["mamba", "attention"])),
    "Lfm2ForCausalLM": ("lfm2", dict(layer_types=["conv", "full_attention"])),
    "Lfm2MoeForCausalLM": ("lfm2_moe", dict(layer_types=["conv", "full_attention"], num_dense_layers=1)),
    "Lfm3ForCausalLM": ("lfm3", {}),
    "Qwen3NextForCausalLM": ("qwen3_next", dict(layer_types=LIN_FULL)),
    "Qwen3_5ForCausalLM": ("qwen3_5_text", dict(layer_types=LIN_FULL)),
    "Qwen3_5MoeForCausalLM": ("qwen3_5_moe_text", dict(layer_types=LIN_FULL)),
    "Qwen4ExpForCausalLM": ("qwen4_exp_text", dict(layer_types=LIN_FULL, indexer_n_heads=2, indexer_kv_heads=1,
                                                   indexer_head_dim=8, indexer_budget=8, indexer_compress_ratio=2,
                                                   hc_count=2)),
    "OlmoHybridForCausalLM": ("olmo_hybrid", {}),
    "KimiLinearForCausalLM": ("kimi_linear", dict(layer_types=LIN_FULL)),
    "BailingHybridForCausalLM": ("bailing_hybrid", {}),
    "LaraMiniForCausalLM": ("lara_mini", {}),
    "ZayaForCausalLM": ("zaya", dict(num_experts_per_tok=1)),
    # (with a sliding window its cached step disagrees with its full forward: refused)
    "MiniMaxForCausalLM": ("minimax", dict(layer_types=LIN_FULL, sliding_window=None)),
    "RecurrentGemmaForCausalLM": ("recurrent_gemma", dict(block_types=["recurrent", "attention"])),
    "InklingForCausalLM": ("inkling_text", {}),
    "Inkling2ForCausalLM": ("inkling2_text", {}),
    "Inkling2LoopForCausalLM": ("inkling2_loop_text", {}),
    "DoryForCausalLM": ("dory", dict(num_hidden_layers=3, n_input_layers=1, n_output_layers=1)),
    "RwkvForCausalLM": ("rwkv", {}),
    "xLSTMForCausalLM": ("xlstm", dict(num_heads=4, qk_dim_factor=1.0, chunk_size=4)),
    "XLNetLMHeadModel": ("xlnet", dict(d_model=32, d_inner=64, n_head=4)),
    # attention-only families
    "GPT2LMHeadModel": ("gpt2", {}),
    "LlamaForCausalLM": ("llama", {}),
    "Llama4ForCausalLM": ("llama4_text", dict(num_experts_per_tok=1)),  # Llama 4 routes to one expert (native)
    "DeepseekV3ForCausalLM": ("deepseek_v3", {}),
    "Exaone4ForCausalLM": ("exaone4", {}),
    "Olmo3ForCausalLM": ("olmo3", {}),
    "SmolLM3ForCausalLM": ("smollm3", {}),
    "Glm4ForCausalLM": ("glm4", {}),
    "Gemma2ForCausalLM": ("gemma2", {}),
    "Gemma3ForCausalLM": ("gemma3_text", {}),
    "Gemma4ForCausalLM": ("gemma4_text", {}),
    "Cohere2ForCausalLM": ("cohere2", {}),
    "GptOssForCausalLM": ("gpt_oss", {}),
    "MistralForCausalLM": ("mistral", {}),
    "Phi3ForCausalLM": ("phi3", {}),
    "FalconForCausalLM": ("falcon", {}),
    "BloomForCausalLM": ("bloom", {}),
    "GPTNeoXForCausalLM": ("gpt_neox", {}),
    "CodeGenForCausalLM": ("codegen", {}),
    "OPTForCausalLM": ("opt", {}),
    "MiniCPM3ForCausalLM": ("minicpm3", {}),
    "Qwen2MoeForCausalLM": ("qwen2_moe", {}),
    # a BERT encoder saved as a causal-LM class but configured bidirectional (is_decoder=False)
    "BertLMHeadModel": ("bert", {}),
}

REFUSED: dict[str, str] = {
    "xLSTMForCausalLM": "its recurrent step fails (transformers' own generate fails the same way on it)",
    "XLNetLMHeadModel": "a permutation LM: its cached memory step differs from its full forward pass",
    "BertLMHeadModel": "bidirectional (is_decoder=False): a cached step cannot equal its full forward",
}


def config_fields(cls: type) -> set[str]:
    """The fields a config class declares (dataclass annotations and ``__init__`` parameters)."""
    out: set[str] = set()
    for k in cls.__mro__:
        out |= set(getattr(k, "__annotations__", {}))
    try:
        out |= set(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):
        pass
    return out


def tiny_config(name: str) -> Any:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type, over = ZOO[name]
    cls = CONFIG_MAPPING[model_type]
    fields = config_fields(cls)
    kw = {k: v for k, v in TINY.items() if k in fields}
    kw.update(over)
    return cls(**kw)


def tiny_model(name: str) -> Any:
    torch.manual_seed(0)
    return getattr(transformers, name)(tiny_config(name)).eval()


def reference_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    """transformers' own greedy ``generate`` (its generation config's cache settings, no logits processors
    beyond greedy selection -- BART-style configs force EOS at the last position -- and no stop token).
    The processors are switched off on ``model.generation_config`` itself: ``generate`` fills a passed
    config's unset fields from it."""
    gc = model.generation_config
    for k in ("forced_eos_token_id", "forced_bos_token_id", "no_repeat_ngram_size", "repetition_penalty",
              "bad_words_ids", "suppress_tokens", "begin_suppress_tokens", "min_length", "min_new_tokens"):
        if getattr(gc, k, None) is not None:
            setattr(gc, k, None)
    with torch.no_grad():
        g = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return g[0, len(ids):].tolist()


_MARKERS = re.compile(r"update_conv_state|update_recurrent_state|LinearAttention|ssm_state|recurrent_state")


def recurrent_causal_lms() -> list[str]:
    """The causal-LM classes of the installed transformers whose model keeps a recurrent / linear-attention
    state (their modeling source updates conv / recurrent states) or builds its own cache in ``forward``
    (no default ``DynamicCache``), registered as ``AutoModelForCausalLM`` classes."""
    from transformers.generation.utils import GenerationMixin
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    root = os.path.join(os.path.dirname(transformers.__file__), "models")
    out = set()
    for model_type, cls_name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        if not cls_name.endswith(("ForCausalLM", "LMHeadModel")):
            continue  # not a class the fallback takes (fallback_class)
        mod = model_type_to_module_name(model_type)
        path = os.path.join(root, mod, f"modeling_{mod}.py")
        try:
            with open(path, encoding="utf-8") as f:
                src = f.read()
        except OSError:
            continue
        # transformers decides this from the class name alone: ask it with a stand-in of that name (importing
        # every modeling module would take seconds)
        own_cache = not GenerationMixin._supports_default_dynamic_cache.__func__(type(cls_name, (), {}))
        if _MARKERS.search(src) or own_cache:
            out.add(cls_name)
    return sorted(out)
