"""Mamba (Gu & Dao, 2023) <-> ``decoder_lm``: every layer a ``mamba`` mixer alone (``ffn: null``),
pre-norm RMSNorm, no position scheme, the head tied unless ``tie_word_embeddings`` is false.

``backbone.layers.i.norm`` is the layer's ``mixer_norm``; ``mixer.{in_proj, conv1d, x_proj, dt_proj,
A_log, D, out_proj}`` keep their names and shapes (conv1d (E, 1, K) in both); ``backbone.norm_f``
is the final norm. The width E is ``intermediate_size`` (which transformers reads over ``expand``
when both are given), written as the mixer's ``expand`` = E / hidden_size.

Config options and what becomes of them:
- read: hidden_size, intermediate_size (or expand), state_size, conv_kernel, time_step_rank
  ("auto" = ⌈hidden_size / 16⌉), use_bias, use_conv_bias, layer_norm_epsilon, num_hidden_layers,
  vocab_size, tie_word_embeddings; time_step_min / time_step_max and initializer_range (init only)
  become the mixer's dt_min / dt_max and init_std.
- refused: hidden_act other than silu (the conv's activation; seqzoo's is SiLU), an
  intermediate_size that is not a multiple of hidden_size (seqzoo's mixer is expand·C wide; every
  published Mamba is 2·C).
- ignored, as they leave float32 outputs as they are: use_mambapy and use_associative_scan (which
  scan runs), rescale_prenorm_residual, time_step_scale, time_step_floor, time_step_init_scheme
  (initialisation), residual_in_fp32 (transformers then keeps the residual stream in float32 when
  the weights are bfloat16/float16; seqzoo keeps it in the weights' dtype, so only low-precision
  runs drift apart). Exports write residual_in_fp32: true, the family's default.

Padding: transformers multiplies the normed input by the mask before in_proj and the conv output
after the conv; seqzoo zeroes the conv input (in_proj's x half) and takes a zero step (Δ = 0) at
padded positions. Without in_proj biases (use_bias false, the default) both feed the conv zeros and
the scan nothing at a pad, so left-padded rows agree at every real token. With use_bias true,
transformers' masked input still leaves in_proj's bias at the pads, which its conv carries into the
first K − 1 real tokens (and through them the state): its padded row differs from the same row
unpadded, seqzoo's does not.
"""
from __future__ import annotations

from seqzoo.registry import builtin

from ._mamba import MambaLayout, mamba_gguf


@builtin("Hugging Face Mamba <-> decoder_lm (mamba mixer layers, no FFN)")
class MambaConverter(MambaLayout):
    """config.json keys: hidden_size, intermediate_size (or expand), state_size, conv_kernel,
    time_step_rank, use_bias, use_conv_bias, hidden_act (silu), layer_norm_epsilon,
    num_hidden_layers, tie_word_embeddings, time_step_min/max."""

    gguf = mamba_gguf(dt_b_c_rms=False)
