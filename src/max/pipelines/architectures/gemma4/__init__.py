"""Gemma 4 text (``Gemma4ForCausalLM``): Gemma 3's layout (scaled embeddings, norms before and after
attention and MLP, GeGLU, sliding-window and global layers, final soft-capping) with Gemma 4's
attention -- per-head RMSNorm of q and k (plain weight) and a weightless one of v, softmax scale 1,
global layers with their own head size and KV heads (``per_layer_config`` / ``global_head_dim``),
proportional RoPE (a fraction of each head rotated), keys doubling as values (``attention_k_eq_v``) --
and a learned scalar on each layer's output (``layer_scalar``); E2B/E4B's per-layer input embeddings
(``hidden_size_per_layer_input``: a second table gathered per token, mixed with a projection of the
token embedding, gated into each layer's output) and KV sharing (the last ``num_kv_shared_layers``
layers attend over the cache entries of the last earlier layer of their attention type, writing none;
``use_double_wide_mlp`` doubles their MLPs); 26B-A4B's MoE block (``enable_moe_block``: routed
experts beside each layer's dense MLP, see ``moe.py``).

Not supported yet (a clear error at load): bidirectional attention (``use_bidirectional_attention``)."""

from max.pipelines.architectures.gemma4.arch import gemma4_arch

ARCHITECTURES = [gemma4_arch]
