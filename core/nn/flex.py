"""FlexAttention behind the score interface: softcaps, position biases, windows, document and
padding masks and sinks without a (T × S) table.

The materialised path builds the logits, the bias and the mask as (B, H, T, S) tensors: quadratic
memory, and at T = 8192 most of a forward's time. ``torch.nn.attention.flex_attention`` takes them
as functions of (batch, head, query, key) instead — a ``score_mod`` that edits one logit and a
``mask_mod`` that says whether a key is visible — and compiles them into one blockwise kernel that
skips every block its mask hides (a window of 1024 at T = 8192 reads 1/8 of the keys).

What becomes a modification:
- the score's own scale and, for a third-party score, its ``ScoreFunction.flex`` hook;
- the softcap c·tanh(z/c), after the scale and before the bias, as the materialised path does;
- a position scheme's bias through its ``PositionScheme.score_mod`` hook (ALiBi, T5 buckets);
- the mask: the context's boolean mask, read one element at a time (causal slots, windows, key
  padding, packed documents, a prefix-LM's visible prefix: whatever built it), or causality alone;
- sinks: flex returns each row's log-sum-exp L, and a sink logit s in the denominator scales the
  row's output by e^L / (e^L + e^s) = σ(L − s), with no extra column.

When it runs (``MultiHeadAttention`` asks ``usable``): the layer would otherwise materialise
(softcap, sinks, a bias or a mask), no dropout, at least ``MIN_KEYS`` keys and ``MIN_QUERIES``
queries (measured in docs/performance.md: below that the compiled kernel's fixed cost wins), on
CUDA, or on the CPU without autograd and without sinks (torch compiles flex on the CPU for
inference only, and without the log-sum-exp the sinks need: training on the CPU keeps the
materialised path). ``SEQZOO_FLEX=0`` turns it off. The kernel is compiled once per process
(one kernel for the first length, one shared by every later length); if compiling fails (no C++
compiler for inductor on the CPU) it says so once and the materialised path runs from then on.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from ..errors import PerformanceWarning
from ..interfaces import MaskSpec, MixerContext

#: The fewest keys and queries for which flex replaces the materialised path.
MIN_KEYS = 1024
MIN_QUERIES = 512
#: FlexAttention's block of queries and of keys.
BLOCK = 128

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]

#: Compile the kernel (False runs flex_attention eagerly: the same modifications, materialised by
#: torch's reference implementation — for checking them quickly, never for speed).
COMPILE = True
_kernel = None          # torch.compile(flex_attention), made at the first use
_failed: str | None = None  # why flex cannot run in this process, once it failed


def usable(q: Tensor, keys: int, *, grad: bool, sinks: bool = False) -> bool:
    """Whether flex can and should take this call: q (B, H, T, D) against ``keys`` keys, with
    autograd recording (``grad``) and attention sinks (``sinks``, which need the log-sum-exp)."""
    if _failed is not None or os.environ.get("SEQZOO_FLEX", "1") == "0":
        return False
    if q.shape[-2] < MIN_QUERIES or keys < MIN_KEYS:
        return False
    if q.device.type == "cuda":
        return True
    # torch compiles flex on the CPU for inference only, and without the log-sum-exp
    return q.device.type == "cpu" and not grad and (not sinks or not COMPILE)


def compose(*mods: ScoreMod | None) -> ScoreMod | None:
    """One score_mod applying ``mods`` in order (None entries skipped), or None if all are None."""
    mods = tuple(m for m in mods if m is not None)
    if not mods:
        return None

    def modified(score: Tensor, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        for mod in mods:
            score = mod(score, b, h, q, kv)
        return score

    return modified


def softcap_mod(cap: float) -> ScoreMod:
    """c·tanh(z/c) of each logit (Gemma 2)."""
    return lambda score, b, h, q, kv: torch.tanh(score / cap) * cap


def block_mask(context: MixerContext, queries: int, keys: int, device: torch.device):
    """The BlockMask of the context's mask, or of a top-left causal one when it has none and is
    causal; None when nothing is hidden. Built ``BLOCK`` query rows at a time (never the whole
    (T × S) mask) and kept in ``context.shared`` for the forward's other layers."""
    if not context.masked and not context.causal:
        return None
    key = ("flex_block_mask", queries, keys)
    if key not in context.shared:
        spec = context.mask_spec
        if spec is None and not context.masked:
            spec = MaskSpec(queries, keys, keys - queries, True, device=device)
        if spec is not None:
            context.shared[key] = _from_rows(spec.rows, spec.batch, queries, keys, spec.visible, device)
        else:  # a mask given whole (a caller's own): read it one element at a time
            dense = context.mask
            rows = dense.shape[0]

            def visible(b, h, q, kv):
                inside = (q < queries) & (kv < keys)
                q, kv = q.clamp(max=queries - 1), kv.clamp(max=keys - 1)
                return inside & dense[b if rows > 1 else 0, 0, q, kv]

            context.shared[key] = _from_rows(context.mask_rows, rows, queries, keys, visible, device)
    return context.shared[key]


def _from_rows(rows_of: Callable[[int, int], Tensor], batch: int, queries: int, keys: int,
               mask_mod: Callable, device: torch.device):
    """A BlockMask from ``rows_of(start, stop)`` -> (B|1, 1, R, S) boolean, ``BLOCK`` rows at a
    time: a block of keys is full (no mask_mod), partial (mask_mod per element) or skipped."""
    from torch.nn.attention.flex_attention import BlockMask

    q_blocks, kv_blocks = -(-queries // BLOCK), -(-keys // BLOCK)
    partial = torch.zeros(batch, q_blocks, kv_blocks, dtype=torch.bool, device=device)
    full = torch.zeros_like(partial)
    for i in range(q_blocks):
        chunk = rows_of(i * BLOCK, min(queries, (i + 1) * BLOCK))[:, 0].expand(batch, -1, -1)  # (B, R, S)
        chunk = torch.cat([chunk, chunk.new_zeros(batch, chunk.shape[1], kv_blocks * BLOCK - keys)], -1)
        per_block = chunk.unflatten(-1, (kv_blocks, BLOCK))  # (B, R, blocks, BLOCK)
        seen, every = per_block.any(-1).any(1), per_block.all(-1).all(1)
        partial[:, i], full[:, i] = seen & ~every, every

    def listed(flags: Tensor) -> tuple[Tensor, Tensor]:  # (B, 1, Qb) counts, (B, 1, Qb, KVb) indices first
        order = torch.argsort((~flags).to(torch.int8), dim=-1, stable=True)
        return flags.sum(-1, dtype=torch.int32)[:, None], order.to(torch.int32)[:, None]

    return BlockMask.from_kv_blocks(*listed(partial), *listed(full), BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
                                    seq_lengths=(queries, keys))


def _compile_failures() -> tuple[type[BaseException], ...]:
    """What torch.compile raises when it cannot build the kernel on this machine (no C++ compiler
    for inductor's CPU code, an unsupported device)."""
    from torch._dynamo.exc import BackendCompilerFailed
    from torch._inductor.exc import InductorError

    return BackendCompilerFailed, InductorError


def attend(q: Tensor, k: Tensor, v: Tensor, *, scale: float, score_mod: ScoreMod | None, blocks,
           sink: Tensor | None = None) -> Tensor | None:
    """Attention through the compiled flex kernel: q (B, H, T, D), k/v (B, K, S, D) -> (B, H, T, D),
    or None when compiling failed (the caller then takes the materialised path). Rows that see no
    key are zeros, as on the materialised path."""
    global _kernel, _failed
    try:
        from torch.nn.attention.flex_attention import AuxRequest, flex_attention
        if _kernel is None and COMPILE:
            # torch's automatic dynamic shapes: the second length compiles a kernel every later
            # length reuses (dynamic=False would compile per length and fall back to the slow
            # eager path after torch's recompile limit)
            _kernel = torch.compile(flex_attention)
        extra = {} if sink is None else {"return_aux": AuxRequest(lse=True)}
        out = (_kernel if COMPILE else flex_attention)(q, k, v, score_mod=score_mod, block_mask=blocks, scale=scale,
                                                       enable_gqa=k.shape[1] != q.shape[1], **extra)
    except _compile_failures() as error:
        _failed = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        warnings.warn(f"FlexAttention is unavailable here ({_failed}); attention materialises its scores instead",
                      PerformanceWarning, stacklevel=2)
        return None
    if sink is not None:  # σ(L − s): the share of each row's softmax mass the keys keep beside the sink
        out, lse = out[0], out[1].lse
        out = out * torch.sigmoid(lse - sink.to(lse.dtype)[None, :, None])[..., None].to(out.dtype)
    return out
