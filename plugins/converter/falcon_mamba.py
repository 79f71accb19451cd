"""Falcon-Mamba (Zuo et al., 2024) <-> ``decoder_lm``: Mamba's layout and tensor names, plus a
weightless RMS norm of Δ, B and C right after x_proj (each over its own features: Δ's R before
dt_proj, B's and C's N; in float32, cast back), ε = ``mixer_rms_eps``: the mamba mixer's
``bcdt_norm_eps``.

The norms' ``dt_layernorm`` / ``b_layernorm`` / ``c_layernorm.weight`` are non-persistent buffers
of ones in transformers (only for its fused kernels), so checkpoints hold no tensor for them.
Options, refusals and padding are Mamba's (see ``mamba``); ``use_falcon_mambapy``, an old name of
use_mambapy, is ignored with it.
"""
from __future__ import annotations

from typing import ClassVar

from seqzoo.registry import builtin

from ._mamba import DEFAULTS, MambaLayout, mamba_gguf


@builtin("Hugging Face Falcon-Mamba <-> decoder_lm (mamba mixer with B/C/Δ norms)")
class FalconMambaConverter(MambaLayout):
    """Mamba's config.json keys plus mixer_rms_eps (1e-6)."""

    model_type = "falcon_mamba"
    architecture = "FalconMambaForCausalLM"
    defaults: ClassVar[dict] = {**DEFAULTS, "mixer_rms_eps": 1e-6}
    mixer_norm = "mixer_rms_eps"
    gguf = mamba_gguf(dt_b_c_rms=True)
