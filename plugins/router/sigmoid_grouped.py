"""DeepSeek-V3 routing (DeepSeek-AI, 2024): sigmoid affinities, a bias that steers only the
choice, and group-limited selection.

    s = σ(W_r x)                      (N, E), float32
    s' = s + b                        b: ``correction_bias``, for the choice only
    groups: E experts in G groups; a group's score is the sum of its two largest s';
            only the ``topk_groups`` best groups keep their experts (the rest s' = −∞)
    experts = top-k(s')               weights = s[experts], / Σ when ``normalize`` (+1e-20)

The bias never enters the weights: it balances the load without a gradient of its own. With
``bias_update`` γ > 0 the router does what DeepSeek-V3 calls auxiliary-loss-free balancing: after
each training forward, b_e ← b_e + γ·sign(mean load − load_e), so an overloaded expert gets
chosen less. ``probs`` (for a balancing loss, DeepSeek's sequence-wise one included) is s / Σ s.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.errors import ConfigError
from seqzoo.functional import upcast
from seqzoo.interfaces import Router, Routing
from seqzoo.registry import builtin
from seqzoo.schema import NonNegativeFloat, PositiveInt


@builtin("sigmoid scores, selection-only bias, group-limited top-k (DeepSeek-V3)")
class SigmoidGrouped(Router):
    """groups: G expert groups (1: no group limit). topk_groups: the groups kept per token (null =
    all). normalize: divide the k weights by their sum (true). bias_update: γ of the load-balancing
    bias update while training (0: the bias stays as loaded)."""

    recipe_example = """
        seqzoo: 1
        extends: tiny-llama
        model:
          ffn: {kind: moe, experts: 16, top_k: 4, expert: {kind: swiglu, hidden: 32},
                shared: {kind: swiglu, hidden: 32}, routed_scale: 2.5, balance_loss: 0.0,
                router: {kind: sigmoid_grouped, groups: 4, topk_groups: 2, bias_update: 0.001}}
        """

    def __init__(self, dim: int, experts: int, top_k: int, groups: PositiveInt = 1,
                 topk_groups: PositiveInt | None = None, normalize: bool = True,
                 bias_update: NonNegativeFloat = 0.0) -> None:
        super().__init__(dim, experts, top_k)
        topk_groups = topk_groups or groups
        if experts % groups or (groups > 1 and experts // groups < 2):
            raise ConfigError(f"sigmoid_grouped: experts={experts} must split into groups={groups} of at least "
                              f"2 (a group scores by its two best experts)")
        if topk_groups > groups or topk_groups * (experts // groups) < top_k:
            raise ConfigError(f"sigmoid_grouped: topk_groups={topk_groups} of groups={groups} must keep at least "
                              f"top_k={top_k} experts")
        self.groups, self.topk_groups, self.normalize, self.bias_update = groups, topk_groups, normalize, bias_update
        self.weight = nn.Parameter(torch.empty(experts, dim))
        self.register_buffer("correction_bias", torch.zeros(experts))
        nn.init.normal_(self.weight, std=dim ** -0.5)

    def forward(self, x: Tensor) -> Routing:
        """x (N, C) -> the k experts of each token and their weights."""
        logits = F.linear(upcast(x), upcast(self.weight))  # (N, E)
        scores = logits.sigmoid()
        choice = scores + self.correction_bias.float()
        if self.topk_groups < self.groups:
            grouped = choice.unflatten(-1, (self.groups, -1))  # (N, G, E / G)
            best = grouped.topk(2, dim=-1).values.sum(-1).topk(self.topk_groups, dim=-1).indices  # (N, kept)
            keep = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter_(1, best, True)  # (N, G)
            choice = grouped.masked_fill(~keep[..., None], float("-inf")).flatten(1)
        experts = choice.topk(self.top_k, dim=-1).indices  # (N, k)
        weights = scores.gather(1, experts)
        if self.normalize:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        if self.training and self.bias_update:
            self._balance(experts)
        return Routing(experts, weights, logits, scores / scores.sum(-1, keepdim=True))

    @torch.no_grad()
    def _balance(self, experts: Tensor) -> None:
        """b_e += γ·sign(mean load − load_e) from this batch's choices."""
        load = torch.bincount(experts.flatten(), minlength=self.experts).float()
        self.correction_bias.add_(self.bias_update * torch.sign(load.mean() - load))

    def extra_repr(self) -> str:
        return (f"experts={self.experts}, top_k={self.top_k}, groups={self.groups}, "
                f"topk_groups={self.topk_groups}, normalize={self.normalize}")
