"""Hard ALiBi (Jelassi, Brandfonbrener, Kakade & Malach, 2024, "Repeat After Me"): ALiBi's
per-head bias made a hard window.

    bias[h, i, j] = 0      if |p_i − p_j| < w_h
                    −10⁴   otherwise                (w_h = ∞: no position bias at all)

A head with a window w sees only the last w keys (itself included), so it can read the last few
tokens as an n-gram; a head without one sees every key alike (no position information, "NoPE").
That pair is what lets a transformer copy strings far longer than it was trained on: the local
heads hash the current n-gram, the global heads find where it occurred before. No learned
weights; the windows are the recipe's ``windows``, one per head.

Outside the window the bias is −10⁴ rather than −∞: exp(−10⁴) is exactly 0 in float32, bfloat16
and float16 alike, so the softmax is the same as a hard mask for any logits below ~5·10³ in size,
and a row whose keys all lie outside (a padded query) stays finite instead of turning into NaN.
FlexAttention's ``score_mod`` uses the same value, so both paths agree to the last bit.
"""
from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.errors import ConfigError
from seqzoo.interfaces import PositionBias
from seqzoo.registry import builtin
from seqzoo.schema import PositiveInt

from ._distance import distance_at

#: The bias of a key outside a head's window: a weight of exactly 0 after softmax, never NaN.
OUTSIDE = -1e4


def default_windows(heads: int) -> list[int | None]:
    """Half the heads (rounded down) local with windows 2, 4, 8, …; the rest without a bias."""
    local = heads // 2
    return [None] * (heads - local) + [2 ** (h + 1) for h in range(local)]


@builtin("per-head hard windows: some heads see the last w keys, the rest all keys (Jelassi 2024)")
class HardAlibi(PositionBias):
    """windows: one entry per head, the number of most recent keys the head sees (itself
    included), or null for a head without position bias (default: the first half of the heads
    null, the others 2, 4, 8, …)."""

    def __init__(self, dim: int, head_dim: int, heads: int, max_seq_len: int,
                 windows: tuple[PositiveInt | None, ...] | None = None) -> None:
        super().__init__(dim, head_dim, heads, max_seq_len)
        windows = default_windows(heads) if windows is None else list(windows)
        if len(windows) != heads:
            raise ConfigError(f"position hard_alibi: windows has {len(windows)} entries for {heads} heads; "
                              f"give one per head (null: the head sees every key)")
        self.windows = windows

    def _reach(self, device: torch.device) -> Tensor:
        """(H,) float32: each head's window, +∞ for a head without one."""
        return torch.tensor([float("inf") if w is None else float(w) for w in self.windows], device=device)

    def by_distance(self, distances: Tensor) -> Tensor:
        """distances (R,) int64 -> (H, R) float32: 0 inside each head's window, ``OUTSIDE`` beyond it."""
        inside = distances.abs().to(torch.float32) < self._reach(distances.device)[:, None]
        return torch.zeros(inside.shape, device=distances.device).masked_fill(~inside, OUTSIDE)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor, prepared: object = None):
        """The same windows for FlexAttention, one logit at a time."""
        reach = self._reach(q_pos.device)
        distance = distance_at(q_pos, k_pos)

        def hard_alibi(score, b, h, q, kv):
            return torch.where(distance(b, q, kv) < reach[h], score, score + OUTSIDE)

        return hard_alibi
