"""Qwen3-Next (Qwen team, 2025) <-> ``decoder_lm``: gated-delta and gated-attention layers, three to
one, each with a mixture of experts; pre-norm with Qwen3-Next's zero-centred RMSNorm, x̂ · (1 + w)
(``gemma_rmsnorm``) on the residual stream, the final output and q/k.

- Layer i is ``full_attention`` or ``linear_attention`` as ``layer_types`` lists (default: full
  attention at every ``full_attention_interval``-th layer, 4). The recipe names the kinds as layer
  types in the shortest repeating ``pattern``; the model's mixer is the gated-delta one.
- Gated delta (``linear_attn.``): ``gated_deltanet`` with G = ``linear_num_key_heads`` key heads of
  ``linear_key_head_dim``, H = ``linear_num_value_heads`` value heads of ``linear_value_head_dim``,
  conv ``linear_conv_kernel_dim``, its gated norm at ``rms_norm_eps``; ``in_proj_qkvz`` and
  ``in_proj_ba`` group their rows by key head (``_gated_delta``'s ``grouped`` layout).
- Attention (``self_attn.``): GQA with ``head_dim``, a per-head QK-norm and an output gate: the
  query projection is twice as wide, [q_h | gate_h] for each head h, and the heads' outputs are
  multiplied by σ(gate) before ``o_proj`` (``attention.output_gate``). RoPE rotates the first
  ``partial_rotary_factor`` of each head (0.25 when config.json names none).
- FFN: layer i is sparse iff ``num_experts`` > 0, i is not in ``mlp_only_layers`` and (i + 1) %
  ``decoder_sparse_step`` = 0: softmax top-``num_experts_per_tok`` over ``num_experts`` SwiGLU
  experts ``moe_intermediate_size`` wide, renormalised iff ``norm_topk_prob``, plus a shared
  SwiGLU expert ``shared_expert_intermediate_size`` wide scaled by σ(``shared_expert_gate``·x)
  (``shared_gate``); the other layers a SwiGLU of ``intermediate_size`` (layer types ``*_dense``).
  A model without experts exports as Qwen3.5 (``qwen3_5_text``), which it then is.
- ``mtp.*`` (the multi-token-prediction layer some checkpoints carry) is dropped with a warning,
  as transformers drops it.

Qwen3.5 (``qwen3_5_text``, ``qwen3_5_moe_text``) has the same layers with the projections split by
kind; the three converters are ``_qwen_next``'s, each with its layout and FFN rule.
"""
from __future__ import annotations

from seqzoo.registry import builtin

from ._delta_gguf import QWEN3NEXT
from ._qwen_next import QwenNextFamily


@builtin("Hugging Face Qwen3-Next <-> decoder_lm (gated DeltaNet and gated attention 3:1, (1 + w) RMSNorm, "
         "experts with a gated shared expert)")
class Qwen3NextConverter(QwenNextFamily):
    """config.json keys: LLaMA's (hidden_size, num_hidden_layers, num_attention_heads,
    num_key_value_heads, head_dim, hidden_act, max_position_embeddings, rms_norm_eps,
    rope_parameters, attention_bias, tie_word_embeddings), layer_types (or
    full_attention_interval), the linear_* keys, and the experts' keys (num_experts,
    num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size, norm_topk_prob,
    decoder_sparse_step, mlp_only_layers, router_aux_loss_coef, intermediate_size)."""

    model_type = "qwen3_next"
    architecture = "Qwen3NextForCausalLM"
    gguf = QWEN3NEXT
