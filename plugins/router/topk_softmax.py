"""gpt-oss routing (OpenAI, 2025): logits r = W_r x + b, the k largest logits chosen, their
weights softmax over those k logits only. Equal to softmax top-k with renormalisation in exact
arithmetic (softmax is monotone, and renormalised p_top = softmax of the k logits); the bias and
the softmax over k alone are what the family stores and computes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.functional import upcast
from seqzoo.interfaces import Router, Routing
from seqzoo.registry import builtin


@builtin("top-k logits, then a softmax over the chosen (gpt-oss)")
class TopKSoftmax(Router):
    """bias: a bias on the router's projection (true, as gpt-oss)."""

    recipe_example = """
        seqzoo: 1
        extends: tiny-llama
        model:
          ffn: {kind: moe, experts: 8, top_k: 4, expert: {kind: swiglu, hidden: 32},
                router: {kind: topk_softmax, bias: true}}
        """

    def __init__(self, dim: int, experts: int, top_k: int, bias: bool = True) -> None:
        super().__init__(dim, experts, top_k)
        self.weight = nn.Parameter(torch.empty(experts, dim))
        self.bias = nn.Parameter(torch.zeros(experts)) if bias else None
        nn.init.normal_(self.weight, std=dim ** -0.5)

    def forward(self, x: Tensor) -> Routing:
        """x (N, C) -> the k experts of each token and their weights."""
        logits = F.linear(upcast(x), upcast(self.weight), None if self.bias is None else upcast(self.bias))
        chosen, experts = logits.topk(self.top_k, dim=-1)  # (N, k) each
        return Routing(experts, chosen.softmax(-1), logits, logits.softmax(-1))

    def extra_repr(self) -> str:
        return f"experts={self.experts}, top_k={self.top_k}"
