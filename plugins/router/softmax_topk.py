"""Softmax top-k routing (Shazeer et al., 2017; Mixtral, Jiang et al., 2024; Qwen-MoE, OLMoE,
Jamba): p = softmax(W_r x) over all E experts, the k largest chosen, their weights p_top — or
p_top / Σ p_top when ``normalize`` (Mixtral always; Qwen's ``norm_topk_prob``, off by default
there and in Jamba).

The router weight is ``weight`` (E, C), as in transformers' ``*TopKRouter``; logits and the softmax
are float32, so a bfloat16 model picks the experts a float32 one would.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.functional import upcast
from seqzoo.interfaces import Router, Routing
from seqzoo.registry import builtin


@builtin("softmax over experts, top-k, optionally renormalised (Mixtral, Qwen-MoE)", aliases=("softmax",))
class SoftmaxTopK(Router):
    """normalize: renormalise the k chosen probabilities to sum to 1 (true). bias: a bias on the
    router's projection (false)."""

    recipe_example = """
        seqzoo: 1
        extends: tiny-llama
        model:
          ffn: {kind: moe, experts: 8, top_k: 2, expert: {kind: swiglu, hidden: 64},
                router: {kind: softmax_topk, normalize: false}}   # Qwen-MoE's default
        """

    def __init__(self, dim: int, experts: int, top_k: int, normalize: bool = True, bias: bool = False) -> None:
        super().__init__(dim, experts, top_k)
        self.normalize = normalize
        self.weight = nn.Parameter(torch.empty(experts, dim))
        self.bias = nn.Parameter(torch.zeros(experts)) if bias else None
        nn.init.normal_(self.weight, std=dim ** -0.5)

    def forward(self, x: Tensor) -> Routing:
        """x (N, C) -> the k experts of each token and their weights."""
        logits = F.linear(upcast(x), upcast(self.weight), None if self.bias is None else upcast(self.bias))
        probs = logits.softmax(-1)  # (N, E)
        weights, experts = probs.topk(self.top_k, dim=-1)  # (N, k) each
        if self.normalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return Routing(experts, weights, logits, probs)

    def extra_repr(self) -> str:
        return f"experts={self.experts}, top_k={self.top_k}, normalize={self.normalize}"
