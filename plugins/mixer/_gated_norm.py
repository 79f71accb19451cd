"""The gated RMSNorm at the output of the recurrent mixers (not a mixer of its own): Mamba-2
gates, then normalises each group; gated DeltaNet, KDA and GLA normalise each head, then gate
(fla's ``FusedRMSNormGated``, transformers' ``Qwen3NextRMSNormGated``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class GatedRMSNorm(nn.Module):
    """Over each of ``groups`` equal slices of the last dimension (E features in all):

    - ``norm_before_gate=False`` (Mamba-2): RMSNorm(y ⊙ SiLU(z)) · w, w of E features;
    - ``norm_before_gate=True`` (gated DeltaNet): RMSNorm(y) · w ⊙ SiLU(z), w of E / groups features
      shared by the slices (one head's width; ``weight_per_group``).

    Statistics in float32 whatever the inputs' dtype. ``activation`` replaces SiLU for the gate
    (KDA gates with a sigmoid)."""

    def __init__(self, dim: int, groups: int, eps: float, *, norm_before_gate: bool = False,
                 weight_per_group: bool = False, activation: str = "silu") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim // groups if weight_per_group else dim))
        self.groups, self.eps, self.norm_before_gate = groups, eps, norm_before_gate
        self.activation = {"silu": F.silu, "sigmoid": torch.sigmoid}[activation]

    def forward(self, y: Tensor, z: Tensor) -> Tensor:
        """y, z (..., E) -> (..., E) in y's dtype. The weight multiplies the normalised values
        after they are cast back to y's dtype, and the gate (norm first) multiplies in float32,
        as transformers' Mamba-2 and Qwen3-Next norms do, so bfloat16 outputs match them exactly."""
        wide = torch.promote_types(y.dtype, torch.float32)  # bf16 in, float32 statistics
        gate = self.activation(z.to(wide))
        x = y.to(wide) if self.norm_before_gate else y.to(wide) * gate
        x = x.unflatten(-1, (self.groups, -1))
        normed = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(y.dtype)
        if self.weight.numel() == y.shape[-1]:
            out = self.weight * normed.flatten(-2)
        else:
            out = (self.weight * normed).flatten(-2)  # one head's weight, shared by the heads
        return (out * gate).to(y.dtype) if self.norm_before_gate else out
