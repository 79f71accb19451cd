"""Linear RoPE scaling, a.k.a. Position Interpolation (Chen et al., 2023; HF ``"linear"``).

    ω'_k = ω_k / s    (every position p read as p/s)

Positions are squeezed by the factor s so a longer context lands in the trained angle range:
p ↦ p/s, i.e. ω'_k = ω_k / s for every pair k; attention factor 1. Needs fine-tuning, and it
compresses the local resolution of the high-frequency pairs.
"""
from __future__ import annotations

from torch import Tensor

from seqzoo.interfaces import RopeScaling
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat


@builtin("position interpolation ω/s (Chen et al. 2023; HF linear)")
class LinearScaling(RopeScaling):
    """ω'_k = ω_k / factor.

    factor: s, the context-extension factor (required; HF ``rope_scaling.factor``). s = 1 is the
    identity, s = 4 makes position 4p rotate like position p did before.
    """

    example_params = {"factor": 4.0}  # for the conformance kit: factor is required

    def __init__(self, factor: PositiveFloat) -> None:
        super().__init__()
        self.factor = factor

    def frequencies(self, inv_freq: Tensor, *, rotary_dim: int, base: float, max_seq_len: int,
                    positions: Tensor) -> tuple[Tensor, float]:
        """inv_freq (d_r/2,) float64 -> (inv_freq / factor, 1.0)."""
        return inv_freq / self.factor, 1.0

    def extra_repr(self) -> str:
        return f"factor={self.factor}"
