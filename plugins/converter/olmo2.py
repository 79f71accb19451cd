"""OLMo 2 (Team OLMo, 2024) <-> ``decoder_lm``: LLaMA's projections and SwiGLU with no pre-norms —
a norm on each sublayer's output before the residual add, x + n(F(x)) (``placement: output``) —
and QK-norm over the whole q and k projections, H·D and K·D features, before the head split and
RoPE (``attention.qk_norm`` with ``qk_norm_scope: projection``).
"""
from __future__ import annotations

from torch import nn

from seqzoo.io.hf import first_problem
from seqzoo.registry import builtin

from .llama import LlamaConverter


@builtin("Hugging Face OLMo 2 <-> decoder_lm (output norms, whole-projection QK-norm)")
class Olmo2Converter(LlamaConverter):
    """LLaMA's keys (rms_norm_eps 1e-5, vocab 50304; no mlp_bias)."""

    model_type = "olmo2"
    architecture = "Olmo2ForCausalLM"
    defaults = {**LlamaConverter.defaults, "vocab_size": 50304, "rms_norm_eps": 1e-5}
    placement = "output"
    qk_norm_scope = "projection"
    norms = {"attn_out_norm": "post_attention_layernorm", "ffn_out_norm": "post_feedforward_layernorm"}

    def biases(self, c: dict) -> tuple[bool, bool, bool]:
        return c["attention_bias"], c["attention_bias"], False

    def attention_problem(self, m: dict) -> str | None:
        attn = m["attention"]
        return first_problem(
            (attn["window"] is None, "model.attention.window: OLMo 2 has no sliding window"),
            (attn["out_bias"] in (None, attn["bias"]), "model.attention: OLMo 2 has q/k/v and output biases alike"),
            (not m["ffn"]["bias"], "model.ffn: OLMo 2's MLP has no biases"),
        )

    def family_config(self, model: nn.Module) -> dict:
        return {"attention_bias": model.recipe["model"]["attention"]["bias"]}
