"""Mimetic initialisation of a state-space layer (Trockman et al., 2024, "Mimetic Initialization
Helps State Space Models Learn to Recall"), shared by Mamba and Mamba-2 (not a mixer of its own).

Unrolled, a selective SSM computes y_t = Σ_{s≤t} (C_t · B_s) · exp(Σ_{s<r≤t} Δ_r A) · Δ_s x_s: an
"attention map" C_t · B_s times a decay. A freshly initialised layer has independent B and C
projections and decays fast, so its map is noise that fades within a few tokens, and it must learn
both to keep the past and to match a query with its key before recall or copying pays at all. The
mimetic start removes both obstacles, as we read the paper:
- no decay to speak of: A = −A_MIMETIC in every entry, so at the largest initial Δ (0.1) a token
  still weighs exp(−0.001·t) after t steps (0.6 at t = 512) instead of vanishing;
- queries that match keys: C's projection starts as a copy of B's, so C_t · B_s = f(x_t) · f(x_s),
  a similarity of the two tokens' inputs (for inputs of one size, largest when they agree), as in
  linear attention with shared query and key maps.
Everything is trained from there; only the starting point differs.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

#: The magnitude of every A entry at a mimetic start (A = −exp(A_log)).
A_MIMETIC = 0.01


@torch.no_grad()
def mimic_linear_attention(A_log: Tensor, *b_onto_c: tuple[Tensor, Tensor]) -> None:
    """Set every A to −A_MIMETIC and copy each pair's B parameters onto its C parameters (the rows
    of the projection, and for Mamba-2 the conv channels, that make B and C)."""
    A_log.fill_(math.log(A_MIMETIC))
    for b, c in b_onto_c:
        c.copy_(b)
