"""Scaled cosine attention (Liu et al., Swin Transformer V2, 2022).

    score(q, k) = cos(q, k) · exp(min(ℓ_h, ln 100)) = (q/‖q‖)·(k/‖k‖) / τ_h

with ℓ a learnable log-temperature per head, initialised to ln 10 (1/τ = 10); the clamp keeps
τ ≥ 0.01. There is no 1/√D. Swin's relative-position bias B arrives as the additive ``bias``.
``attend`` normalises q and k, multiplies q by exp(ℓ) and runs the fused
``scaled_dot_product_attention`` kernel with scale 1.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.errors import ConfigError
from seqzoo.plugins.score.scaled_dot import ScaledDot
from seqzoo.registry import builtin

# The clamp on ℓ: the temperature τ = exp(−ℓ) never drops below 0.01.
MAX_LOG_SCALE = math.log(100.0)


@builtin("cosine similarity × learned per-head temperature (Swin V2), fused SDPA")
class Cosine(ScaledDot):
    """cos(q, k) · exp(clamp(ℓ, max=ln 100)) with ℓ (H, 1, 1) learnable, initialised to ln 10.

    No recipe parameters. ℓ is initialised here, not by the model (``own_init``).
    """

    own_init = True

    def __init__(self, query_dim: int, key_dim: int, heads: int) -> None:
        if query_dim != key_dim:
            raise ConfigError(
                f"score cosine: query_dim={query_dim} must equal key_dim={key_dim} (cosine "
                f"similarity needs equal sizes); use score 'bilinear' for different sizes"
            )
        super().__init__(query_dim, key_dim, heads, scale=1.0)
        self.logit_scale = nn.Parameter(torch.full((heads, 1, 1), math.log(10.0)))

    def inverse_temperature(self, dtype: torch.dtype) -> Tensor:
        """1/τ = exp(clamp(ℓ, max=ln 100)) per head, (H, 1, 1)."""
        return self.logit_scale.clamp(max=MAX_LOG_SCALE).exp().to(dtype)

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """q (B, H, T, D), k (B, H, S, D) -> (B, H, T, S)."""
        cos = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        return cos * self.inverse_temperature(cos.dtype)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None = None,
               bias: Tensor | None = None, causal: bool = False, dropout: float = 0.0) -> Tensor:
        """q (B, H, T, D), k (B, K, S, D), v (B, K, S, Dv) -> (B, H, T, Dv), fused.

        mask boolean (B|1, H|1, T, S), True = may attend; bias additive (B|1, H|1, T, S).
        """
        # Folding the per-head temperature into q keeps the kernel's own scale at 1.
        q = F.normalize(q, dim=-1) * self.inverse_temperature(q.dtype)
        return super().attend(q, F.normalize(k, dim=-1), v, mask=mask, bias=bias, causal=causal,
                              dropout=dropout)
