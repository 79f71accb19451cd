"""Transformer-XL relative positional encoding (Dai, Yang, Yang, Carbonell, Le & Salakhutdinov, 2019),
without the segment-level memory.

    logits_ij = [(q_i + u)·k_j + (q_i + v)·W_R R_{p_i − p_j}] / √D

R is the sinusoid of the relative distance (model dim C), W_R ∈ R^{C × H·D} is learned, and so are
u, v ∈ R^{H × D}, the global content and position biases. One W_R serves every layer of the stack
(the paper has one per layer).

How it maps onto the hooks — a deliberate use of ``rotate``: ``rotate`` returns (q + u, k), so the
score's own q·k term becomes (q + u)·k / √D, and ``bias`` receives that shifted q' = q + u and
computes (q' − u + v)·W_R R_{p_i − p_j} / √D. Both terms therefore assume the score scales by 1/√D
(``scaled_dot`` with its default scale).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from seqzoo.interfaces import PositionScheme
from seqzoo.plugins.position.sinusoidal import sinusoid_table
from seqzoo.registry import builtin


@builtin("Transformer-XL relative sinusoid with learned u, v biases (Dai 2019)", aliases=("transformer_xl",))
class TransformerXLRelative(PositionScheme):
    """Sinusoidal relative distances projected per head, plus learned biases u (content) and v
    (position). No recipe parameters.

    Learned weights: ``proj`` = W_R (Linear C -> H·D, no bias), ``u`` and ``v`` (H, D), zero at init.
    """

    #: ``bias`` projects only the distances present, a range read off the positions each step.
    compiles_statically = False

    def __init__(self, dim: int, head_dim: int, heads: int, max_seq_len: int) -> None:
        super().__init__(dim, head_dim, heads, max_seq_len)
        self.proj = nn.Linear(dim, heads * head_dim, bias=False)  # W_R
        self.u = nn.Parameter(torch.zeros(heads, head_dim))
        self.v = nn.Parameter(torch.zeros(heads, head_dim))

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Not a rotation: shifts q (B, H, T, D) by u so the score computes (q + u)·k; k (B, K, T', D)
        is returned unchanged (keys are cached without any position information)."""
        return q + self.u[:, None, :].to(q.dtype), k

    def bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(q − u + v)·W_R R_{p_i − p_j} / √D for q = q + u (B, H, T, D) from ``rotate``, q_pos
        (B|1, T), k_pos (B|1, S) -> (B, H, T, S)."""
        q_pos, k_pos = torch.atleast_2d(q_pos), torch.atleast_2d(k_pos)
        distance = q_pos[:, :, None] - k_pos[:, None, :]  # (B|1, T, S)
        # Project only the distinct distances present (at most T + S − 1 of them), score every query
        # against those once, then pick per key: never a (T, S, D) tensor or a per-pair projection.
        low, high = int(distance.min()), int(distance.max())
        steps = torch.arange(low, high + 1, device=q.device)  # (n,)
        weight = self.proj.weight
        r = self.proj(sinusoid_table(steps, self.dim).to(weight.dtype))  # (n, H·D)
        r = r.view(-1, self.heads, self.head_dim).transpose(0, 1).to(q.dtype)  # (H, n, D)
        shifted = q + (self.v - self.u)[:, None, :].to(q.dtype)  # q + v, (B, H, T, D)
        per_distance = shifted @ r.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, n)
        b, h, t, _ = q.shape
        index = (distance - low)[:, None].expand(b, h, t, distance.shape[-1])  # (B, H, T, S)
        return per_distance.gather(-1, index)
