"""Llama 3.1 RoPE scaling (Meta, 2024; HF ``"llama3"``).

    ω'_k = ω_k (λ_k < λ_hi),    ω_k/s (λ_k > λ_lo),    (1 − σ)·ω_k/s + σ·ω_k (in between)

Wavelength bands of the pre-training context L, with λ_k = 2π/ω_k, λ_lo = L/low_freq_factor and
λ_hi = L/high_freq_factor: λ_k < λ_hi keeps ω_k; λ_k > λ_lo takes ω_k/s; in between
σ = (L/λ_k − low_freq_factor)/(high_freq_factor − low_freq_factor),
ω'_k = (1 − σ)·ω_k/s + σ·ω_k.
A YaRN-style ramp, linear in rotation count, with attention factor 1.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from seqzoo.errors import ConfigError
from seqzoo.interfaces import RopeScaling
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, PositiveInt


@builtin("Llama 3.1 wavelength bands: keep, blend, divide by s (HF llama3)")
class Llama3Scaling(RopeScaling):
    """Piecewise by wavelength; defaults are Llama 3.1's (use them with ``base: 500000``).

    factor: s, divisor of the low frequencies (8; Llama 3.2 uses 32).
    low_freq_factor: L / low_freq_factor is the wavelength above which ω is divided by s (1).
    high_freq_factor: L / high_freq_factor is the wavelength below which ω is kept (4). Must be
        greater than low_freq_factor.
    original_max_seq_len: L, the pre-training context (8192; HF ``original_max_position_embeddings``).
    """

    def __init__(self, factor: PositiveFloat = 8.0, low_freq_factor: PositiveFloat = 1.0,
                 high_freq_factor: PositiveFloat = 4.0, original_max_seq_len: PositiveInt = 8192) -> None:
        super().__init__()
        if high_freq_factor <= low_freq_factor:
            raise ConfigError(
                f"rope_scaling llama3: high_freq_factor={high_freq_factor} must be greater than "
                f"low_freq_factor={low_freq_factor} (Llama 3.1: 4 and 1); swap them")
        self.factor = factor
        self.low_freq_factor = low_freq_factor
        self.high_freq_factor = high_freq_factor
        self.original_max_seq_len = original_max_seq_len

    def frequencies(self, inv_freq: Tensor, *, rotary_dim: int, base: float, max_seq_len: int,
                    positions: Tensor) -> tuple[Tensor, float]:
        """inv_freq (d_r/2,) float64 -> (banded ω', 1.0)."""
        original = self.original_max_seq_len
        low_wavelen = original / self.low_freq_factor   # longer than this: interpolate
        high_wavelen = original / self.high_freq_factor  # shorter than this: keep
        wavelen = 2 * math.pi / inv_freq
        sigma = (original / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        blended = (1.0 - sigma) * inv_freq / self.factor + sigma * inv_freq
        out = torch.where(wavelen > low_wavelen, inv_freq / self.factor, blended)
        return torch.where(wavelen < high_wavelen, inv_freq, out), 1.0

    def extra_repr(self) -> str:
        return (f"factor={self.factor}, low_freq_factor={self.low_freq_factor}, "
                f"high_freq_factor={self.high_freq_factor}, "
                f"original_max_seq_len={self.original_max_seq_len}")
