"""LongRoPE scaling (Ding et al., 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million
Tokens"; Phi-3, Phi-3.5, Phi-4-mini; HF ``"longrope"``).

    ω'_k = ω_k / f_k,   f = long_factor if T > L else short_factor,   cos and sin × √(1 + ln s / ln L)

Every rotary pair k has its own searched rescale factor f_k: ``short_factor`` (d_r/2 numbers)
serves sequences within the pre-training context L, ``long_factor`` longer ones. T = max(positions)
+ 1 is the length being processed, so one forward rotates all its tokens with one list. cos and sin
are multiplied by the attention factor √(1 + ln s / ln L), s = max_seq_len / L (1 when s ≤ 1),
for short and long sequences alike, so logits scale by its square.

**The switch and the KV cache.** Keys cached before T passes L were rotated with the short list.
transformers' Phi-3 ``generate`` therefore drops its cache at the step that first takes the
sequence past L (L + 1 tokens, padding included, with at most L cached) and re-encodes the whole
sequence, now with the long list; later steps extend that cache. seqzoo's ``generate`` does the same
(``stale_after`` = L), so cached decoding gives the tokens of the uncached one. A cache driven by
hand (the model called with ``cache=`` step by step) is not refreshed: past L its old keys keep
the short rotation, as they do when a transformers forward is handed an old cache.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from seqzoo.errors import ConfigError
from seqzoo.interfaces import RopeScaling
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, PositiveInt


@builtin("per-pair short/long frequency divisors switched at L (Ding 2024; HF longrope)")
class LongRopeScaling(RopeScaling):
    """Per-pair frequency divisors, a short list within L and a long one beyond it.

    short_factor: f_k for sequences of at most L tokens, one per rotary pair (d_r/2; required).
    long_factor: f_k for longer sequences, as many (required).
    original_max_seq_len: L, the pre-training context where the lists switch (required; HF
        ``original_max_position_embeddings``, Phi-3-mini-128k: 4096).
    factor: s in the default attention factor (null, the default: the model's max_seq_len / L,
        as HF derives it from max_position_embeddings).
    attention_factor: the cos/sin amplitude (null, the default: √(1 + ln s / ln L), 1 for s ≤ 1).
    """

    # For the conformance kit (head dim 8: four pairs). L = 64, the kit model's max_seq_len,
    # keeps its hand-driven cache checks within the short list; its length-200 frequencies
    # check reaches the long one.
    example_params = {"short_factor": [1.0, 1.1, 1.3, 1.6], "long_factor": [1.0, 2.0, 4.0, 8.0],
                      "original_max_seq_len": 64}

    def __init__(self, short_factor: list[PositiveFloat], long_factor: list[PositiveFloat],
                 original_max_seq_len: PositiveInt, factor: PositiveFloat | None = None,
                 attention_factor: PositiveFloat | None = None) -> None:
        super().__init__()
        if len(short_factor) != len(long_factor) or not short_factor:
            raise ConfigError(
                f"rope_scaling longrope: short_factor has {len(short_factor)} entries and long_factor "
                f"{len(long_factor)}; give both one factor per rotary pair (rotary_dim / 2)")
        self.short_factor = [float(f) for f in short_factor]
        self.long_factor = [float(f) for f in long_factor]
        self.original_max_seq_len = original_max_seq_len
        self.factor = factor
        self.attention_factor = attention_factor
        #: Keys cached before the sequence passes L are stale: ``generate`` re-encodes there.
        self.stale_after = original_max_seq_len

    def amplitude(self, max_seq_len: int) -> float:
        """The attention factor: the given one, else √(1 + ln s / ln L) (1 for s ≤ 1)."""
        if self.attention_factor is not None:
            return float(self.attention_factor)
        original = self.original_max_seq_len
        scale = self.factor if self.factor is not None else max_seq_len / original
        if scale <= 1.0:
            return 1.0
        if original == 1:
            raise ConfigError(
                "rope_scaling longrope: original_max_seq_len=1 makes the default attention factor "
                "√(1 + ln s / ln L) divide by ln 1 = 0; set attention_factor")
        return math.sqrt(1.0 + math.log(scale) / math.log(original))

    def frequencies(self, inv_freq: Tensor, *, rotary_dim: int, base: float, max_seq_len: int,
                    positions: Tensor) -> tuple[Tensor, float]:
        """inv_freq (d_r/2,) float64, positions (B|1, T) -> (ω / f of the list for T, amplitude)."""
        if len(self.short_factor) != inv_freq.shape[0]:
            raise ConfigError(
                f"rope_scaling longrope: short_factor and long_factor have {len(self.short_factor)} "
                f"entries but rotary_dim={rotary_dim} has {inv_freq.shape[0]} pairs; give one factor "
                f"per pair")
        short = inv_freq / torch.tensor(self.short_factor, dtype=inv_freq.dtype, device=inv_freq.device)
        long = inv_freq / torch.tensor(self.long_factor, dtype=inv_freq.dtype, device=inv_freq.device)
        length = positions.max() + 1  # T, kept on the device: no host sync, capturable
        return torch.where(length > self.original_max_seq_len, long, short), self.amplitude(max_seq_len)

    def extra_repr(self) -> str:
        return (f"pairs={len(self.short_factor)}, original_max_seq_len={self.original_max_seq_len}, "
                f"factor={self.factor}, attention_factor={self.attention_factor}")
