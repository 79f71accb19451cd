"""Qwen2 (Qwen team, 2024) <-> ``decoder_lm``: LLaMA with biases on q/k/v but not on the output
projection (``attention.out_bias: false``), and Qwen's window rule (see ``_qwen``).
"""
from __future__ import annotations

from seqzoo.io.gguf import GGUFArch
from seqzoo.io.gguf.arch import first, heads_fill_width, no_window
from seqzoo.io.hf.decoder import DecoderFamily
from seqzoo.registry import builtin

from ._qwen import QWEN2_DEFAULTS, QwenWindow


@builtin("Hugging Face Qwen2 <-> decoder_lm (q/k/v biases, no output bias)")
class Qwen2Converter(QwenWindow):
    """LLaMA's keys (no attention_bias / mlp_bias) plus use_sliding_window, sliding_window,
    max_window_layers, layer_types."""

    family = DecoderFamily("qwen2", "Qwen2ForCausalLM", "Qwen2", defaults=QWEN2_DEFAULTS,
                           qkv_bias=True, out_bias=False)
    gguf = GGUFArch("qwen2", problem=first(no_window, heads_fill_width),
                    config=lambda get: {"use_sliding_window": False})
