"""Luong dot attention (Luong, Pham & Manning, 2015): the unscaled dot product, as T5 uses it.

    score(q, k) = scale · q·k        (scale = 1.0 by default: no 1/√D)

``attend`` runs the same fused ``scaled_dot_product_attention`` code as ``scaled_dot`` (this class
subclasses it), so only the default scale differs.
"""
from __future__ import annotations

from seqzoo.errors import ConfigError
from seqzoo.plugins.score.scaled_dot import ScaledDot
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat


@builtin("Luong dot q·k, unscaled by default (T5), fused SDPA kernel")
class Dot(ScaledDot):
    """scale · q·k, fused.

    scale: the logit scale; 1.0 (default) is Luong's / T5's unscaled dot product, null means
    1/√D (then identical to ``scaled_dot``).
    """

    def __init__(self, query_dim: int, key_dim: int, heads: int,
                 scale: PositiveFloat | None = 1.0) -> None:
        if query_dim != key_dim:
            raise ConfigError(
                f"score dot: query_dim={query_dim} must equal key_dim={key_dim} (a dot product needs "
                f"equal sizes); use score 'bilinear' for different query and key sizes"
            )
        super().__init__(query_dim, key_dim, heads, scale=scale)
