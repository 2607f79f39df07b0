"""Code every decoder family shares; a family's folder holds only what is its own.

A family folder ``architectures/<name>/`` has ``config.py`` (Hugging Face config dict ->
:class:`DecoderConfig`, and GGUF metadata -> Hugging Face config dict via :func:`gguf_hf_config`),
``weight_adapters.py`` (checkpoint names -> module names, for safetensors and GGUF), ``model.py``
(its :class:`DecoderPipelineModel` subclass and, where it differs, its graph builder) and
``arch.py`` (one ``SupportedArchitecture``); its ``__init__`` exports ``ARCHITECTURES``, which
``register_all_models()`` picks up without any list to edit.

Interfaces other work builds on (keep them stable):

1. **Weight factory** (``weights.WeightFactory``): every checkpoint-weight-bearing projection and
   embedding of the shared decoder and of every family is made by
   ``factory.linear(name, in_dim, out_dim, has_bias=False, tied_to=None)`` or
   ``factory.embedding(name, vocab_size, dim)``, and MoE experts by
   ``factory.experts(name, num_experts, in_dim, out_dim, has_bias=False)`` (weight
   ``[num_experts, out_dim, in_dim]``), where ``name`` is the module path
   (``layers.0.mlp.gate_proj``, ``embed_tokens``, ``lm_head``) = the checkpoint tensor's name after
   the family adapter, minus ``.weight``.  ``factory.fuse(linears)`` returns a function equal to
   concatenating their outputs (q/k/v run as one matmul when the factory can fuse them).  The
   factory gets the adapter's output as ``factory.checkpoint`` (module name -> tensor handle with
   ``dtype``, ``shape`` and ``quantization_encoding``), so it can choose a representation per
   tensor.  Today it returns plain float ``max.nn.Linear`` / ``Embedding`` in the compute dtype.
   No family constructs ``Linear``/``Embedding`` for checkpoint weights itself.
2. **Weight conversion** (``weights.convert_weight(name, value, target_weight)``): the one function
   turning a renamed checkpoint tensor into the value a module's ``Weight`` binds; every family's
   weights pass through it (``weights.load_weights_into``).  Today it dequantises GGML blocks and
   casts to the ``Weight``'s dtype.
3. **Dtype policy** (``weights.compute_dtype(encoding, device)``): the compute dtype of every model
   (decoders and BERT) for a weight encoding on a device.
4. **KV-cache sizing** (``max.nn.kv_cache.kv_cache_budget``, called by ``model.DecoderPipelineModel``):
   the bytes of paged KV cache a decoder model allocates (``max_batch_size`` sequences of
   ``max_length``, capped by ``device_memory_utilization`` of free memory, or ``kv_cache_memory``).
"""

from max.pipelines.architectures.common.config import (
    DecoderConfig,
    NormPlan,
    gguf_hf_config,
    hf_common,
    kv_heads,
    rope_defaults,
    whole_head_dim,
    with_defaults,
)
from max.pipelines.architectures.common.weights import (
    Derived,
    WeightFactory,
    compute_dtype,
    convert_weight,
    load_weights_into,
    rename_gguf,
    rename_hf,
)

__all__ = [
    "DecoderConfig",
    "Derived",
    "NormPlan",
    "WeightFactory",
    "compute_dtype",
    "convert_weight",
    "gguf_hf_config",
    "hf_common",
    "kv_heads",
    "load_weights_into",
    "rename_gguf",
    "rename_hf",
    "rope_defaults",
    "whole_head_dim",
    "with_defaults",
]
