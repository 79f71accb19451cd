"""Dynamic NTK RoPE scaling (emozilla, 2023; HF ``"dynamic"``).

    b' = b · ((s·T/L) − (s − 1))^(d_r/(d_r − 2)) for T > L, else b;    ω'_k = b'^(−2k/d_r)

The NTK base change, sized to the length actually being processed: with T = max(positions) + 1,
b' = b · ((s·T/L) − (s − 1))^(d_r/(d_r − 2)) when T > L, else b' = b (at T = L it is b);
ω'_k = b'^(−2k/d_r), attention factor 1. Up to L the model is exactly the unscaled one.

**Inconsistent with a KV cache beyond L** (HF #25104 "Inconsistent Rotation Base for Dynamic NTK
Scaling RoPE"): cached keys keep the rotation of the base in force when they were written, while a
full forward pass rotates every key with the base of the final length. Past L, token-by-token
decoding therefore differs from recomputing the whole sequence (HF accepts this for speed; the
exact fix would be caching keys before RoPE). Within L both are the identity and agree exactly.
"""
from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.interfaces import RopeScaling
from seqzoo.plugins.position.rope import rope_inv_freq
from seqzoo.plugins.rope_scaling.ntk import check_rotary_dim
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, PositiveInt


@builtin("NTK base sized to the current length past L (emozilla; HF dynamic)")
class DynamicNTKScaling(RopeScaling):
    """Base raised with the current length once it exceeds L.

    factor: s, the extension factor at which the base change is calibrated (required).
    original_max_seq_len: L, the context the model was trained with (null, the default, means the
    model's ``max_seq_len``, as HF's ``max_position_embeddings``).

    Stateless: every call sizes the base from the positions it is given (HF instead keeps the
    largest base seen until the length drops below L again). Computed without a host sync, so it
    stays capturable by CUDA graphs / ``torch.compile``.
    """

    example_params = {"factor": 4.0}  # for the conformance kit: factor is required

    def __init__(self, factor: PositiveFloat, original_max_seq_len: PositiveInt | None = None) -> None:
        super().__init__()
        self.factor = factor
        self.original_max_seq_len = original_max_seq_len

    def frequencies(self, inv_freq: Tensor, *, rotary_dim: int, base: float, max_seq_len: int,
                    positions: Tensor) -> tuple[Tensor, float]:
        """inv_freq (d_r/2,) float64, positions (B|1, T) -> (ω' for the current length, 1.0)."""
        check_rotary_dim("dynamic", rotary_dim)
        original = self.original_max_seq_len or max_seq_len
        length = positions.max().to(inv_freq.dtype) + 1.0  # T, kept on the device
        ratio = self.factor * length / original - (self.factor - 1.0)
        # For T <= L the ratio is <= 1 (possibly negative, a NaN under the power); clamp it and
        # select the untouched frequencies there so the identity is exact.
        new_base = base * ratio.clamp(min=1.0) ** (rotary_dim / (rotary_dim - 2))
        scaled = rope_inv_freq(rotary_dim, new_base, inv_freq.device, inv_freq.dtype)
        return torch.where(length > original, scaled, inv_freq), 1.0

    def extra_repr(self) -> str:
        return f"factor={self.factor}, original_max_seq_len={self.original_max_seq_len}"
