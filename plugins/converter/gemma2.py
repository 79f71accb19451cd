"""Gemma 2 (Gemma Team, 2024) <-> ``decoder_lm``: LLaMA's projections and GQA with (see ``_gemma``)

- local (sliding-window) and global layers, from config.json's ``layer_types`` (even layers local
  by default): ``layer_types`` ``local`` / ``global`` and a ``pattern`` in the recipe;
- softcapping, c·tanh(z/c), of the attention logits (``attention.softcap``, after the scale and
  before the mask) and of the final logits (``final_softcap``);
- four norms per layer, x + n₂(F(n₁(x))) (``placement: sandwich``): HF's ``post_attention_layernorm``
  normalises the attention *output* here, not the FFN input as in LLaMA;
- RMSNorm scaled by (1 + w) (``gemma_rmsnorm``), GeGLU with the tanh GELU, embeddings times √C
  rounded to the weights' dtype (``scale_embeddings``);
- logits scaled by query_pre_attn_scalar^(-1/2), not head_dim^(-1/2) (``score.scale``).

``accepts`` and ``hf_config`` read the resolved per-layer plan, so config.json's ``layer_types``
is rebuilt from the pattern: a layer with a window is ``sliding_attention``.
"""
from __future__ import annotations

from seqzoo.io.gguf import LLAMA_KEYS, GGUFArch, Key
from seqzoo.io.gguf.arch import GEMMA_NORMS, sliding_flags
from seqzoo.io.hf.decoder import DecoderFamily
from seqzoo.registry import builtin

from ._gemma import GEMMA2_DEFAULTS, NORMS, GemmaConverter, gguf_gemma_config, gguf_scale_problem


def gemma2_gguf_problem(config) -> str | None:
    if config["attn_logit_softcapping"] is None or config["final_logit_softcapping"] is None:
        return "llama.cpp's gemma2 always softcaps attention and final logits; this model leaves one uncapped"
    return gguf_scale_problem(config, wide_layers=46)


@builtin("Hugging Face Gemma 2 <-> decoder_lm (local/global layers, softcaps, sandwich (1+w) norms, √C embeddings)")
class Gemma2Converter(GemmaConverter):
    """config.json keys: LLaMA's (hidden_activation for hidden_act; no mlp_bias) plus
    query_pre_attn_scalar, sliding_window, layer_types, attn_logit_softcapping,
    final_logit_softcapping, use_bidirectional_attention (refused when true)."""

    family = DecoderFamily("gemma2", "Gemma2ForCausalLM", "Gemma 2", defaults=GEMMA2_DEFAULTS,
                           placement="sandwich", norms=NORMS)
    # llama.cpp's gemma2: (1 + w) norms stored as 1 + w, the output head always the embedding,
    # both softcaps (50 and 30 when absent) and a per-layer window flag.
    gguf = GGUFArch("gemma2", keys=LLAMA_KEYS + (Key("attn_logit_softcapping", "attn_logit_softcapping", "f32", 50.0),
                                                 Key("final_logit_softcapping", "final_logit_softcapping", "f32", 30.0),
                                                 Key("attention.sliding_window", "sliding_window")),
                    transforms=GEMMA_NORMS, output="never",
                    export=lambda c: {"attention.sliding_window_pattern": sliding_flags(c)},
                    config=lambda get: gguf_gemma_config(get, wide_layers=46, default_period=2),
                    problem=gemma2_gguf_problem)
