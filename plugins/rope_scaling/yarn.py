"""YaRN RoPE scaling (Peng, Quesnelle, Fan, Shippole, 2023; HF ``"yarn"``, ref ``jquesnelle/yarn``).

    ω'_k = (ω_k/s)·ramp_k + ω_k·(1 − ramp_k),    cos and sin × (0.1·ln(s) + 1)

Pairs that turn many times within the trained context L keep their frequency, pairs that turn less
than once are interpolated (ω/s), and a linear ramp over the pair index blends in between:
fcd(n) = d_r·ln(L/(2π·n)) / (2·ln b), low = ⌊fcd(β_fast)⌋, high = ⌈fcd(β_slow)⌉,
ramp_k = clamp((k − low)/(high − low), 0, 1), ω'_k = (ω_k/s)·ramp_k + ω_k·(1 − ramp_k).
cos and sin are multiplied by the attention factor 0.1·ln(s) + 1, so logits scale by its square.
This is the code form (reference repo, HF, vLLM), not the paper's ramp in rotation count.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from seqzoo.errors import ConfigError
from seqzoo.interfaces import RopeScaling
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, PositiveInt


def get_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's amplitude 0.1·m·ln(s) + 1 (1 for s <= 1); m = 1 is the paper's √(1/t)."""
    if factor <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


def find_correction_dim(rotations: float, rotary_dim: int, base: float, original: int) -> float:
    """The fractional pair index whose wavelength fits ``rotations`` full turns in L positions."""
    return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))


def find_correction_range(beta_fast: float, beta_slow: float, rotary_dim: int, base: float,
                          original: int, truncate: bool) -> tuple[float, float]:
    """(low, high) pair indices of the ramp, clamped to [0, d_r − 1] (d_r − 1, not d_r/2 − 1, as
    the reference code does; the ramp's clamp makes the difference harmless)."""
    low = find_correction_dim(beta_fast, rotary_dim, base, original)
    high = find_correction_dim(beta_slow, rotary_dim, base, original)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, rotary_dim - 1)


@builtin("YaRN ramp between ω and ω/s plus attention temperature (Peng 2023)")
class YarnScaling(RopeScaling):
    """YaRN: keep fast pairs, interpolate slow ones, ramp in between, and sharpen the softmax.

    factor: s, the context-extension factor (required).
    original_max_seq_len: L, the pre-training context that sets the ramp (null, the default, means
        the model's ``max_seq_len``; HF ``original_max_position_embeddings``).
    beta_fast: rotations in L at and above which a pair keeps ω (32).
    beta_slow: rotations in L below which a pair is fully interpolated (1). Must be < beta_fast.
    attention_factor: the cos/sin amplitude (null, the default: 0.1·ln(s) + 1 for s > 1, else 1).
    truncate: floor/ceil the ramp ends to whole pairs (true; gpt-oss uses false).
    mscale, mscale_all_dim: the DeepSeek variant (both null by default; give both or neither).
        Then the amplitude is get_mscale(s, mscale) / get_mscale(s, mscale_all_dim) with
        get_mscale(s, m) = 0.1·m·ln(s) + 1, and DeepSeek additionally multiplies the softmax scale
        of the *whole* logit by get_mscale(s, mscale_all_dim)², exposed as
        ``softmax_scale_factor``. The attention core does not apply it: set the score's ``scale``
        to D^(−1/2)·softmax_scale_factor yourself, or YaRN's temperature is silently lost.
    """

    example_params = {"factor": 4.0}  # for the conformance kit: factor is required

    def __init__(self, factor: PositiveFloat, original_max_seq_len: PositiveInt | None = None,
                 beta_fast: PositiveFloat = 32.0, beta_slow: PositiveFloat = 1.0,
                 attention_factor: PositiveFloat | None = None, truncate: bool = True,
                 mscale: PositiveFloat | None = None, mscale_all_dim: PositiveFloat | None = None) -> None:
        super().__init__()
        if beta_fast <= beta_slow:
            raise ConfigError(
                f"rope_scaling yarn: beta_fast={beta_fast} must be greater than beta_slow={beta_slow} "
                f"(rotations in L of the fastest and slowest ramp ends; defaults 32 and 1); "
                f"swap them")
        if (mscale is None) != (mscale_all_dim is None):
            given, value, other = (("mscale", mscale, "mscale_all_dim") if mscale is not None
                                   else ("mscale_all_dim", mscale_all_dim, "mscale"))
            raise ConfigError(
                f"rope_scaling yarn: {given}={value} is set without {other}; the DeepSeek "
                f"amplitude needs both (DeepSeek-V3: mscale: 1.0, mscale_all_dim: 1.0), or drop "
                f"{given} for the plain 0.1·ln(s) + 1")
        if attention_factor is not None and mscale is not None:
            raise ConfigError(
                f"rope_scaling yarn: attention_factor={attention_factor} and mscale={mscale} both "
                f"set the cos/sin amplitude; keep one of them")
        self.factor = factor
        self.original_max_seq_len = original_max_seq_len
        self.beta_fast = beta_fast
        self.beta_slow = beta_slow
        self.truncate = truncate
        self.mscale = mscale
        self.mscale_all_dim = mscale_all_dim
        if attention_factor is None:
            if mscale is not None:
                attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
            else:
                attention_factor = get_mscale(factor)
        self.attention_factor = float(attention_factor)
        #: DeepSeek's multiplier of the softmax scale (1 unless mscale_all_dim is set); see above.
        self.softmax_scale_factor = get_mscale(factor, mscale_all_dim) ** 2 if mscale_all_dim else 1.0

    def ramp(self, rotary_dim: int, base: float, original: int,
             device: torch.device | None = None, dtype: torch.dtype = torch.float64) -> Tensor:
        """ramp_k (d_r/2,): 0 keeps ω_k, 1 takes ω_k/s."""
        low, high = find_correction_range(self.beta_fast, self.beta_slow, rotary_dim, base,
                                          original, self.truncate)
        if low == high:
            high += 0.001  # avoid 0/0 when both ends land on the same pair
        k = torch.arange(rotary_dim // 2, dtype=dtype, device=device)
        return ((k - low) / (high - low)).clamp(0.0, 1.0)

    def frequencies(self, inv_freq: Tensor, *, rotary_dim: int, base: float, max_seq_len: int,
                    positions: Tensor) -> tuple[Tensor, float]:
        """inv_freq (d_r/2,) float64 -> (blended ω', attention_factor)."""
        original = self.original_max_seq_len or max_seq_len
        ramp = self.ramp(rotary_dim, base, original, inv_freq.device, inv_freq.dtype)
        extrapolation = 1.0 - ramp  # weight of the original frequency
        blended = (inv_freq / self.factor) * (1.0 - extrapolation) + inv_freq * extrapolation
        return blended, self.attention_factor

    def extra_repr(self) -> str:
        return (f"factor={self.factor}, original_max_seq_len={self.original_max_seq_len}, "
                f"beta_fast={self.beta_fast}, beta_slow={self.beta_slow}, "
                f"attention_factor={self.attention_factor:.4f}")
