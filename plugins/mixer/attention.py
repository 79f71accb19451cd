"""Multi-head attention as a registered token mixer (Vaswani et al., 2017):
softmax(score(q, k) + bias, masked) · v over H query heads and K ≤ H key/value heads.

In a model recipe the attention mixer is the default (``mixer: null`` or ``mixer: attention``) and
takes its parameters from the model's ``attention:`` section; this component exists so that the
registry, the conformance kit and third-party stacks can build one on its own.
"""
from __future__ import annotations

from typing import Literal

from seqzoo.nn.attention import MultiHeadAttention
from seqzoo.registry import builtin
from seqzoo.schema import Depth, PositiveFloat, PositiveInt, Probability, Size, Spec


@builtin("multi-head attention (MHA/GQA/MQA) with any score and position scheme", aliases=("mha",))
class AttentionMixer(MultiHeadAttention):
    """heads H (4), kv_heads K (null = H), head_dim D (null = dim // H), score (scaled_dot), bias
    on the projections (true) and out_bias (null = bias), window (null), dropout on the weights
    (0), qk_norm (null) over qk_norm_scope (head | projection), softcap (null), sinks (false):
    see the ``attention:`` section of a model recipe."""

    def __init__(self, dim: int, heads: Depth = 4, kv_heads: Depth | None = None, head_dim: Size | None = None,
                 score: Spec["score"] = "scaled_dot", bias: bool = True, out_bias: bool | None = None,
                 window: PositiveInt | None = None, dropout: Probability = 0.0,
                 qk_norm: Spec["norm"] | None = None, qk_norm_scope: Literal["head", "projection"] = "head",
                 softcap: PositiveFloat | None = None, sinks: bool = False) -> None:
        # score and qk_norm arrive as factories of the recipe's components
        d, k = head_dim or dim // heads, kv_heads or heads
        whole = qk_norm_scope == "projection"  # OLMo 2 normalises all heads' features together
        super().__init__(dim, heads=heads, kv_heads=kv_heads, head_dim=head_dim, bias=bias, out_bias=out_bias,
                         window=window, dropout=dropout, score=score(d, d, heads),
                         q_norm=qk_norm(heads * d if whole else d) if qk_norm is not None else None,
                         k_norm=qk_norm(k * d if whole else d) if qk_norm is not None else None,
                         qk_norm_scope=qk_norm_scope, softcap=softcap, sinks=sinks)
