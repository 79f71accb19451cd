"""Attention that never holds a (T × S) table: FlashAttention-2's algorithm (Dao, 2023) in plain
torch, for the layers whose logits the fused kernels cannot take (a softcap, a position bias,
attention sinks, a window or a document mask) when they train at long context on the CPU.

Queries and keys go in blocks of ``BLOCK``. For each query block the forward keeps a running
maximum m, a running denominator l and a running output, over the key blocks it can see:

    s = cap·tanh(q kᵀ·scale / cap) + bias, masked     (B, H, Bq, Bk)
    m' = max(m, rowmax s),  l ← l·e^{m − m'} + Σ e^{s − m'},  o ← o·e^{m − m'} + e^{s − m'} v

and ends with o / l (a sink adds e^{sink − m} to l) and the log-sum-exp m + log l. The backward
recomputes each block's probabilities from that log-sum-exp, p = e^{s − lse}, and with
Δ = rowsum(dO ⊙ O):

    dv += pᵀ dO,  ds = p ⊙ (dO vᵀ − Δ),  dz = ds ⊙ (1 − tanh²) (softcap),  dq += dz k·scale,
    dk += dzᵀ q·scale,  d(bias) = ds summed by distance,  d(sink) = −Σ e^{sink − lse} Δ

Memory is O(T·D) plus one block's (B, H, Bq, Bk) tables, all of one size — which matters on the
CPU, where blocks of varying size fragment the allocator's heap (the query-block path this replaces
peaked at 2 GB for one capped layer at T 8192, most of it heap left behind, not live tensors).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

#: Queries and keys per block: (B, H, 256, 256) float32 tables are 1 MiB a head, small enough for
#: the CPU's caches and large enough that the products, not Python, take the time.
BLOCK = 256


@dataclass
class BlockedPlan:
    """What the blocks need besides q, k, v: ``scale`` of the logits, ``softcap`` c (None: none),
    ``reach(q0, q1) -> (k0, k1)`` the keys queries q0:q1 can see at all, ``mask(q0, q1, k0, k1)``
    a boolean (B|1, 1, q1 − q0, k1 − k0) table of what they may see within it (None: all of it),
    and a bias that is a function of the distance between positions: the (H, R) table
    ``bias_by_distance`` (None: no bias; it may hold learned parameters, and gets its gradient like
    any input) and ``distance(q0, q1, k0, k1)``, the (B|1, q1 − q0, k1 − k0) int64 index into it."""

    scale: float
    softcap: float | None
    reach: Callable[[int, int], tuple[int, int]]
    mask: Callable[[int, int, int, int], Tensor | None]
    distance: Callable[[int, int, int, int], Tensor] | None = None
    block: int = BLOCK

    def logits(self, q: Tensor, k: Tensor, q0: int, k0: int, work: Workspace, bias_by_distance: Tensor | None,
               keep_tanh: bool = False) -> tuple[Tensor, Tensor | None]:
        """One block pair's logits s, masked with −inf, and (``keep_tanh``) tanh(z/c), None without
        a softcap. ``q`` comes pre-multiplied by ``factor`` (the scale, over c with a softcap),
        which saves a pass over every (Bq × Bk) table; the tables are ``work``'s, reused."""
        shape = (*q.shape[:-1], k.shape[-2])
        s = torch.matmul(q, k.transpose(-2, -1), out=work.table("s", shape, q))
        t = None
        if self.softcap is not None:
            if keep_tanh:
                t = torch.tanh(s, out=work.table("tanh", shape, q))
                s = torch.mul(t, self.softcap, out=s)
            else:
                s = s.tanh_().mul_(self.softcap)
        q1, k1 = q0 + q.shape[-2], k0 + k.shape[-2]
        if bias_by_distance is not None:
            index = self.distance(q0, q1, k0, k1)  # (B|1, Bq, Bk)
            bias = bias_by_distance.index_select(1, index.flatten()).view(-1, *index.shape)  # (H, B|1, Bq, Bk)
            s = s.add_(bias.transpose(0, 1))
        visible = self.mask(q0, q1, k0, k1)
        if visible is not None:
            s = s.masked_fill_(~visible, float("-inf"))
        return s, t

    @property
    def factor(self) -> float:
        """What q is multiplied by before its products: the scale (over c with a softcap)."""
        return self.scale if self.softcap is None else self.scale / self.softcap


class Workspace:
    """The (Bq × Bk) tables of one call, allocated once per shape and reused by every block pair.
    A fresh table per product was what made the first training step slow: each 1 MiB table was
    mapped and unmapped by the allocator (page faults on every product) until something larger was
    freed, and the first capped step at T 8192 took 30× its later ones."""

    def __init__(self) -> None:
        self._tables: dict[tuple, Tensor] = {}

    def table(self, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
        key = (name, shape)
        if key not in self._tables:
            self._tables[key] = like.new_empty(shape)
        return self._tables[key]


def blocked_attention(q: Tensor, k: Tensor, v: Tensor, plan: BlockedPlan, sink: Tensor | None = None,
                      bias_by_distance: Tensor | None = None) -> Tensor:
    """q (B, H, T, D), k (B, K, S, D), v (B, K, S, Dv) with K dividing H; ``sink`` (H,) logits in
    every softmax denominator; ``bias_by_distance`` (H, R), read through ``plan.distance`` -> (B, H,
    T, Dv) in q's dtype, computed in float32 (or wider)."""
    if k.shape[1] != q.shape[1]:  # grouped heads: query head h reads kv head h // (H / K)
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    dtype = q.dtype
    wide = torch.promote_types(dtype, torch.float32)  # bfloat16 in, float32 arithmetic (float64 stays)
    q, k, v = (x.to(wide) for x in (q, k, v))
    no_sink = sink is None
    sink = q.new_zeros(q.shape[1]) if no_sink else sink.to(wide)
    if bias_by_distance is not None:
        bias_by_distance = bias_by_distance.to(wide)
    return _Blocked.apply(q, k, v, sink, bias_by_distance, plan, no_sink).to(dtype)


class _Blocked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, sink: Tensor, bias: Tensor | None, plan: BlockedPlan,
                no_sink: bool) -> Tensor:
        b, h, t, _ = q.shape
        out = q.new_empty(b, h, t, v.shape[-1])
        lse = q.new_empty(b, h, t)
        work = Workspace()
        for q0 in range(0, t, plan.block):
            qb = q[:, :, q0:q0 + plan.block] * plan.factor
            rows = qb.shape[-2]
            m = qb.new_full((b, h, rows, 1), float("-inf"))
            l = qb.new_zeros(b, h, rows, 1)
            acc = qb.new_zeros(b, h, rows, v.shape[-1])
            first, last = plan.reach(q0, q0 + rows)
            for k0 in range(first, last, plan.block):
                k1 = min(last, k0 + plan.block)
                s, _ = plan.logits(qb, k[:, :, k0:k1], q0, k0, work, bias)
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                safe = m_new.nan_to_num(neginf=0.0)  # a row that has seen nothing yet: any finite shift
                p = s.sub_(safe).exp_()
                rescale = (m - safe).exp_()
                l = l.mul_(rescale).add_(p.sum(-1, keepdim=True))
                acc = acc.mul_(rescale).add_(p @ v[:, :, k0:k1])
                m = m_new
            safe = m.nan_to_num(neginf=0.0)
            if not no_sink:  # the sink joins the denominator and attends to nothing
                l = l + torch.exp(sink.view(1, h, 1, 1) - safe)
            empty = l == 0  # no visible key and no sink: the row attends to nothing
            out[:, :, q0:q0 + rows] = torch.where(empty, 0.0, acc / torch.where(empty, 1.0, l))
            lse[:, :, q0:q0 + rows] = torch.where(empty, float("inf"), safe + torch.log(l))[..., 0]
        ctx.save_for_backward(q, k, v, sink, bias, out, lse)
        ctx.plan, ctx.no_sink = plan, no_sink
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, sink, bias, out, lse = ctx.saved_tensors
        plan: BlockedPlan = ctx.plan
        grad_out = grad_out.to(q.dtype)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = (grad_out * out).sum(-1)  # (B, H, T): Δ_i = dO_i · O_i
        h, t = q.shape[1], q.shape[-2]
        dsink = None if ctx.no_sink else -(torch.exp(sink.view(1, h, 1) - lse) * delta).sum((0, 2))
        dbias = torch.zeros_like(bias) if bias is not None and ctx.needs_input_grad[4] else None
        work = Workspace()
        for q0 in range(0, t, plan.block):
            qb = q[:, :, q0:q0 + plan.block]
            scaled = qb * plan.factor
            rows = qb.shape[-2]
            dob, deltab = grad_out[:, :, q0:q0 + rows], delta[:, :, q0:q0 + rows, None]
            lseb = lse[:, :, q0:q0 + rows, None]
            dqb = torch.zeros_like(qb)
            first, last = plan.reach(q0, q0 + rows)
            for k0 in range(first, last, plan.block):
                k1 = min(last, k0 + plan.block)
                kb, vb = k[:, :, k0:k1], v[:, :, k0:k1]
                s, tanh = plan.logits(scaled, kb, q0, k0, work, bias, keep_tanh=True)
                p = s.sub_(lseb).exp_()  # 0 where masked (−inf) and for rows that saw nothing (lse = inf)
                dv[:, :, k0:k1] += p.transpose(-2, -1) @ dob
                ds = torch.matmul(dob, vb.transpose(-2, -1), out=work.table("ds", p.shape, p)).sub_(deltab).mul_(p)
                if dbias is not None:  # d(bias) = ds, summed into the distance each logit reads
                    index = plan.distance(q0, q0 + rows, k0, k1)  # (B|1, Bq, Bk)
                    per_head = ds.sum(0) if index.shape[0] == 1 else ds.transpose(0, 1)
                    dbias.index_add_(1, index.flatten(), per_head.reshape(h, -1))
                dz = ds if tanh is None else ds.mul_(tanh.mul_(tanh).neg_().add_(1.0))
                dqb += dz @ kb
                dk[:, :, k0:k1] += dz.transpose(-2, -1) @ qb
            dq[:, :, q0:q0 + rows] = dqb
        return dq.mul_(plan.scale), dk.mul_(plan.scale), dv, dsink, dbias, None, None

