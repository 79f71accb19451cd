"""OLMo 2 (Team OLMo, 2024) <-> ``decoder_lm``: LLaMA's projections and SwiGLU with no pre-norms —
a norm on each sublayer's output before the residual add, x + n(F(x)) (``placement: output``) —
and QK-norm over the whole q and k projections, H·D and K·D features, before the head split and
RoPE (``attention.qk_norm`` with ``qk_norm_scope: projection``).
"""
from __future__ import annotations

from seqzoo.io.gguf import GGUFArch
from seqzoo.io.gguf.arch import heads_fill_width
from seqzoo.io.hf.decoder import LLAMA_DEFAULTS, DecoderConverter, DecoderFamily
from seqzoo.registry import builtin


@builtin("Hugging Face OLMo 2 <-> decoder_lm (output norms, whole-projection QK-norm)")
class Olmo2Converter(DecoderConverter):
    """LLaMA's keys (rms_norm_eps 1e-5, vocab 50304; no mlp_bias)."""

    family = DecoderFamily(
        "olmo2", "Olmo2ForCausalLM", "OLMo 2", defaults={**LLAMA_DEFAULTS, "vocab_size": 50304, "rms_norm_eps": 1e-5},
        placement="output", qk_norm_scope="projection",
        norms={"mixer_out_norm": "post_attention_layernorm", "ffn_out_norm": "post_feedforward_layernorm"})
    gguf = GGUFArch("olmo2", output="required", problem=heads_fill_width)
