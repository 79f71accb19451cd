"""Additive attention (Bahdanau, Cho & Bengio, 2015).

    score(q, k) = vᵀ tanh(W_q q + W_k k + b)        W_q ∈ R^{query_dim × A}, W_k ∈ R^{key_dim × A}

per head, with v ∈ R^A and A the alignment width. The paper has no b; most implementations add it
inside the tanh. q and k may have different sizes.

The (T, S) logits need a (T, S, A) tanh in between, too large to hold for long sequences. W_q q
(B, H, T, A) and W_k k (B, H, S, A) are projected once; the logits are then computed a chunk of
queries at a time, so the forward holds O(chunk · S · A) per batch row and head, never
O(T · S · A); while autograd records, each chunk is checkpointed (recomputed in backward), so the
backward holds no more than that either.
Attention itself is the core's masked softmax, in at least float32 (no fused kernel exists for it).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from seqzoo.interfaces import ScoreFunction
from seqzoo.registry import builtin
from seqzoo.schema import PositiveInt, Size


def _chunk_logits(q_proj: Tensor, k_proj: Tensor, v: Tensor) -> Tensor:
    """vᵀ tanh(q_proj + k_proj) for a chunk: q_proj (B, H, c, A), k_proj (B, H, S, A), v (H, A)
    -> (B, H, c, S). The (B, H, c, S, A) tanh lives only inside this call."""
    return torch.einsum("bhtsa,ha->bhts", torch.tanh(q_proj[:, :, :, None] + k_proj[:, :, None]), v)


@builtin("Bahdanau vᵀtanh(W_q q + W_k k + b) per head, chunked over queries")
class Additive(ScoreFunction):
    """vᵀ tanh(W_q q + W_k k + b), per head.

    hidden: the alignment width A (null, the default, means key_dim).
    bias: add the learnable b inside the tanh (true, the default; Bahdanau's paper has none).
    chunk: queries per chunk of the (T, S, A) computation (64); the largest temporary is
    (B, H, chunk, S, A).

    Weights are initialised here like ``nn.Linear`` (uniform ±1/√fan_in), b at zero, and left
    alone by the model (``own_init``).
    """

    own_init = True

    def __init__(self, query_dim: int, key_dim: int, heads: int, hidden: Size | None = None,
                 bias: bool = True, chunk: PositiveInt = 64) -> None:
        super().__init__(query_dim, key_dim, heads)
        self.hidden = key_dim if hidden is None else hidden
        self.chunk = chunk
        a = self.hidden
        self.query_weight = nn.Parameter(torch.empty(heads, query_dim, a))  # W_q per head
        self.key_weight = nn.Parameter(torch.empty(heads, key_dim, a))  # W_k per head
        self.bias = nn.Parameter(torch.zeros(heads, a)) if bias else None  # b per head
        self.vector = nn.Parameter(torch.empty(heads, a))  # v per head
        nn.init.uniform_(self.query_weight, -1 / math.sqrt(query_dim), 1 / math.sqrt(query_dim))
        nn.init.uniform_(self.key_weight, -1 / math.sqrt(key_dim), 1 / math.sqrt(key_dim))
        nn.init.uniform_(self.vector, -1 / math.sqrt(a), 1 / math.sqrt(a))

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """q (B, H, T, Dq), k (B, H, S, Dk) -> (B, H, T, S)."""
        q_proj = torch.einsum("bhtd,hda->bhta", q, self.query_weight.to(q.dtype))  # (B, H, T, A)
        if self.bias is not None:
            # b is the same for every key, so it can join the query side once.
            q_proj = q_proj + self.bias.to(q.dtype)[:, None, :]
        k_proj = torch.einsum("bhsd,hda->bhsa", k, self.key_weight.to(k.dtype))  # (B, H, S, A)
        v = self.vector.to(q.dtype)
        checkpointed = torch.is_grad_enabled() and any(
            t.requires_grad for t in (q_proj, k_proj, v))
        chunks = []
        for start in range(0, q_proj.shape[2], self.chunk):
            q_chunk = q_proj[:, :, start:start + self.chunk]  # (B, H, c, A)
            if checkpointed:
                # Without this autograd would keep every chunk's tanh: O(T · S · A) again.
                chunks.append(checkpoint(_chunk_logits, q_chunk, k_proj, v, use_reentrant=False))
            else:
                chunks.append(_chunk_logits(q_chunk, k_proj, v))
        return torch.cat(chunks, dim=2) if len(chunks) > 1 else chunks[0]  # (B, H, T, S)
