"""LFM2 (Liquid AI, 2025) <-> ``decoder_lm``: gated short-conv layers and attention layers, each
followed by a SwiGLU FFN, pre-norm RMSNorm throughout: x + mixer(n₁(x)), then + FFN(n₂(·)).

- Layers: ``layer_types`` (``conv`` / ``full_attention``) or, without it, ``full_attn_idxs`` (every
  layer attends when neither is given, as Lfm2Config has it); the recipe's mixer is ``short_conv``
  and the attention layers are a layer type ``{mixer: attention}`` in the shortest repeating
  ``pattern``.
- Conv layers (``model.layers.i.conv``): ``in_proj`` (3·C rows [B | C | x]), the depthwise ``conv``
  of kernel ``conv_L_cache`` and ``out_proj``; ``conv_bias`` switches all three biases together
  (seqzoo's ``conv_bias`` and ``bias``). See docs/formulas.md §15.9.
- Attention layers (``self_attn``): separate q/k/v (seqzoo's fused ``qkv_proj``), ``out_proj``, GQA,
  no biases, a per-head RMSNorm on q and k (``q_layernorm`` / ``k_layernorm``: ``qk_norm`` over each
  head, ``norm_eps``), RoPE rotating halves (θ = 10⁶ by default); ``head_dim`` is C / H unless the
  config names one.
- FFN (``feed_forward``): ``w1`` gate, ``w3`` up, ``w2`` down. Its width is what transformers builds:
  with ``block_auto_adjust_ff_dim`` (the default) ⌊2/3 · ``intermediate_size``⌋, then, if
  ``block_ffn_dim_multiplier`` is set, times it (rounded down) and rounded up to a multiple of
  ``block_multiple_of`` — LFM2-350M's 6656 becomes 4608. Exports write the width itself with
  ``block_auto_adjust_ff_dim: false``.
- ``operator_norm`` / ``ffn_norm`` before the sublayers; ``model.embedding_norm`` is the final norm
  (applied after the last layer, whatever its name says); the head is tied by default.

Older configs say ``block_ff_dim`` for ``intermediate_size`` and ``tie_embedding`` for
``tie_word_embeddings``; transformers reads them first, and so does seqzoo. An attention-only stack
is also Qwen3's layout: it is exported as ``lfm2`` only when named.

Padding: transformers zeroes padded positions before ``in_proj``, seqzoo after it (§15.9); without
biases (every released LFM2) the two agree.
"""
from __future__ import annotations

from seqzoo.registry import builtin

from ._lfm2 import LFM2, Lfm2Family


@builtin("Hugging Face LFM2 <-> decoder_lm (gated short-conv and attention layers, q/k RMSNorm, SwiGLU)")
class Lfm2Converter(Lfm2Family):
    """config.json keys: vocab_size, hidden_size, intermediate_size (block_ff_dim), the block_* FFN
    keys above, num_hidden_layers, layer_types or full_attn_idxs, num_attention_heads,
    num_key_value_heads, head_dim, max_position_embeddings, norm_eps, rope_parameters (or
    rope_theta + rope_scaling), conv_L_cache, conv_bias, tie_word_embeddings (tie_embedding);
    the other block_* and conv_* keys of the released configs change nothing transformers
    computes."""

    gguf = LFM2  # conv layers are those with no KV heads
