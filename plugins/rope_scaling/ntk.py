"""Static NTK-aware RoPE scaling (bloc97, 2023; registered as ``"ntk"`` by some HF forks).

    b' = b · s^(d_r/(d_r − 2)),    ω'_k = b'^(−2k/d_r)

Instead of squeezing every frequency (linear), raise the base so the lowest frequency is slowed by
exactly s while the highest is untouched: b' = b · s^(d_r/(d_r − 2)), ω'_k = b'^(−2k/d_r).
Attention factor 1. Example d_r = 128, b = 1e4: s = 2, 4, 8 give b' ≈ 20221, 40890, 82685.
"""
from __future__ import annotations

from torch import Tensor

from seqzoo.errors import ConfigError
from seqzoo.interfaces import RopeScaling
from seqzoo.plugins.position.rope import rope_inv_freq
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat


def check_rotary_dim(name: str, rotary_dim: int) -> None:
    """The exponent d_r/(d_r − 2) needs d_r > 2 (with one pair there is nothing to spread)."""
    if rotary_dim <= 2:
        raise ConfigError(
            f"rope_scaling {name}: rotary_dim={rotary_dim} is too small, the NTK base change "
            f"b·s^(d_r/(d_r−2)) needs rotary_dim >= 4; use linear scaling or a larger rotary_dim")


@builtin("static NTK-aware base change b·s^(d/(d−2)) (bloc97)")
class NTKScaling(RopeScaling):
    """b' = b · factor^(d_r/(d_r − 2)); frequencies recomputed from b'.

    factor: s, the context-extension factor (required). s = 1 is the identity.
    """

    example_params = {"factor": 4.0}  # for the conformance kit: factor is required

    def __init__(self, factor: PositiveFloat) -> None:
        super().__init__()
        self.factor = factor

    def frequencies(self, inv_freq: Tensor, *, rotary_dim: int, base: float, max_seq_len: int,
                    positions: Tensor) -> tuple[Tensor, float]:
        """inv_freq (d_r/2,) float64 -> (ω' from the raised base, 1.0)."""
        check_rotary_dim("ntk", rotary_dim)
        new_base = base * self.factor ** (rotary_dim / (rotary_dim - 2))
        return rope_inv_freq(rotary_dim, new_base, inv_freq.device, inv_freq.dtype), 1.0

    def extra_repr(self) -> str:
        return f"factor={self.factor}"
