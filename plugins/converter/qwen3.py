"""Qwen3 (Qwen team, 2025) <-> ``decoder_lm``: Qwen2's layout with no q/k/v biases and a QK-norm
— an RMSNorm over each head's D features of q and of k (one weight of D shared by the heads),
after the projection and before RoPE (``attention.qk_norm`` with ``qk_norm_scope: head``).

Its configs give ``head_dim`` explicitly (128 unless set), which need not be ``hidden_size / heads``.
"""
from __future__ import annotations

from seqzoo.io.gguf import GGUFArch
from seqzoo.io.gguf.arch import no_window
from seqzoo.io.hf.decoder import DecoderFamily
from seqzoo.registry import builtin

from ._qwen import QWEN3_DEFAULTS, QwenWindow


@builtin("Hugging Face Qwen3 <-> decoder_lm (per-head QK RMSNorm, no q/k/v biases)")
class Qwen3Converter(QwenWindow):
    """Qwen2's keys plus attention_bias (false) and head_dim (128)."""

    family = DecoderFamily("qwen3", "Qwen3ForCausalLM", "Qwen3", defaults=QWEN3_DEFAULTS, qk_norm_scope="head")
    gguf = GGUFArch("qwen3", problem=no_window, config=lambda get: {"use_sliding_window": False})
