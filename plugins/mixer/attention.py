"""Multi-head attention as a registered token mixer (Vaswani et al., 2017):
softmax(score(q, k) + bias, masked) · v over H query heads and K ≤ H key/value heads.

Its recipe parameters are one dataclass, ``AttentionConfig``: a model recipe's ``attention:``
section is shorthand for ``mixer: {kind: attention, …}`` with the same keys, and both build this
mixer through the registry, the one path every mixer takes.
"""
from __future__ import annotations

from collections.abc import Callable

from torch import nn

from seqzoo.nn.attention import AttentionConfig, MultiHeadAttention
from seqzoo.registry import builtin
from seqzoo.schema import Configured


@builtin("multi-head attention (MHA/GQA/MQA) with any score and position scheme", aliases=("mha",))
class AttentionMixer(MultiHeadAttention, Configured):
    """The keys of ``AttentionConfig``: heads H (required), kv_heads K (null = H), head_dim D
    (null = dim // H), score (scaled_dot), bias on the projections (true) and out_bias (null =
    bias), window (null), dropout on the weights (0), qk_norm (null) over qk_norm_scope (head |
    projection), softcap (null), sinks (false), output_gate (false)."""

    Config = AttentionConfig
    example_params = {"heads": 4}

    @classmethod
    def position_dims(cls, spec: dict, dim: int) -> tuple[int, int]:
        """The position scheme rotates or biases H heads of D features."""
        return spec.get("head_dim") or dim // spec["heads"], spec["heads"]

    def __init__(self, dim: int, config: AttentionConfig, *, score: Callable[..., nn.Module],
                 qk_norm: Callable[[int], nn.Module] | None = None, cross: bool = False,
                 memory_dim: int | None = None) -> None:
        # score and qk_norm are factories of the components the config names
        d = config.head_dim or dim // config.heads
        heads, kv_heads = config.heads, config.kv_heads or config.heads
        whole = config.qk_norm_scope == "projection"  # OLMo 2 normalises all heads' features together
        super().__init__(dim, config, score=score(d, d, heads),
                         q_norm=qk_norm(heads * d if whole else d) if qk_norm is not None else None,
                         k_norm=qk_norm(kv_heads * d if whole else d) if qk_norm is not None else None,
                         cross=cross, memory_dim=memory_dim)
