"""Cross-entropy fused with the LM head: the (N, V) logits are never materialised.

``F.cross_entropy(head(hidden), targets)`` writes N·V logits, reads them back for log-softmax,
writes an N·V gradient and reads it twice more in the head's backward — at N = 1024 tokens and a
vocabulary of 8192 that is four passes over 32 MiB, more than the head's matmuls cost on a CPU.
Here the rows go through the head in chunks small enough to stay in cache: each chunk's logits
become its softmax in place, the softmax minus the one-hot target is the logits' gradient, and that
gradient is multiplied straight into the hidden states' and the head's gradients. The loss is a
scalar, so its backward only scales the gradients computed in the forward (the approach of Liger
Kernel's and torchtune's chunked losses).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

#: Chunks hold at most about this many logits (32 MiB in float32): large enough that each chunk's
#: matmuls run at full speed (on a CPU, smaller chunks cost more in matmul efficiency than they
#: save in cache misses), small enough to bound the memory of a 100k+ vocabulary.
CHUNK_ELEMENTS = 2 ** 23


def _chunked(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, ignore_index: int,
             rows: int, need: tuple[bool, bool, bool]) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """Summed loss over rows (N, C) and, for the inputs ``need`` names (hidden, weight, bias), the
    gradients of that sum — chunk by chunk."""
    need_hidden, need_weight, need_bias = need
    exact = torch.promote_types(weight.dtype, torch.float32)  # softmax and sums: float32 or better
    total = torch.zeros((), dtype=exact, device=hidden.device)
    grad_hidden = torch.empty_like(hidden) if need_hidden else None
    grad_weight = torch.empty_like(weight, dtype=exact) if need_weight else None
    grad_bias = torch.zeros_like(bias, dtype=exact) if need_bias else None
    # Plain float32 writes every chunk's logits into one reused buffer; mixed precision goes
    # through the autocast-aware ops.
    reuse = hidden.dtype == weight.dtype == torch.float32 and bias is None \
        and not torch.is_autocast_enabled(hidden.device.type)
    vocab = weight.shape[0]
    buffer = hidden.new_empty(vocab * min(rows, hidden.shape[0])) if reuse else None
    for start in range(0, hidden.shape[0], rows):
        h, t = hidden[start:start + rows], targets[start:start + rows]
        n = h.shape[0]
        # Vocabulary-major logits (V, n): W @ hᵀ runs ~25% faster than h @ Wᵀ on CPU BLAS for a
        # tall W, and both gradient products below then read it without a transpose.
        if reuse:
            logits = torch.mm(weight, h.t(), out=buffer[:vocab * n].view(vocab, n))
        elif bias is None:
            logits = (weight @ h.t()).to(exact)
        else:
            logits = torch.addmm(bias[:, None], weight, h.t()).to(exact)
        real = t != ignore_index
        safe = torch.where(real, t, 0)[None, :]
        picked = logits.gather(0, safe)[0]
        # One exp over the chunk: shift by each column's max, exponentiate in place, normalise.
        top = logits.amax(dim=0, keepdim=True)
        grad = logits.sub_(top).exp_()
        mass = grad.sum(dim=0, keepdim=True)
        total += ((top + mass.log())[0] - picked).mul_(real).sum()
        if not any(need):
            continue
        # d(sum of losses)/d(logits) = softmax - one_hot(target), zero on ignored positions.
        grad.div_(mass)
        grad.scatter_add_(0, safe, -real[None].to(grad.dtype))
        grad.mul_(real[None])
        grad = grad.to(hidden.dtype)
        if need_hidden and reuse:
            torch.mm(grad.t(), weight, out=grad_hidden[start:start + n])
        elif need_hidden:
            grad_hidden[start:start + n] = grad.t() @ weight.to(grad.dtype)
        if need_weight and start == 0:
            torch.mm(grad.to(exact), h.to(exact), out=grad_weight)
        elif need_weight:
            grad_weight.addmm_(grad.to(exact), h.to(exact))
        if need_bias:
            grad_bias += grad.sum(1, dtype=exact)
    return total, grad_hidden, grad_weight, grad_bias


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                ignore_index: int, rows: int) -> Tensor:
        total, grad_hidden, grad_weight, grad_bias = _chunked(
            hidden, weight, bias, targets, ignore_index, rows, tuple(ctx.needs_input_grad[:3]))
        count = (targets != ignore_index).sum()
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias, count)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return total / count  # 0/0 = nan when every target is ignored, as F.cross_entropy

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        grad_hidden, grad_weight, grad_bias, count = ctx.saved_tensors
        scale = grad_output / count
        weight_dtype, bias_dtype = ctx.dtypes
        return (None if grad_hidden is None else grad_hidden * scale.to(grad_hidden.dtype),
                None if grad_weight is None else (grad_weight * scale).to(weight_dtype),
                None if grad_bias is None else (grad_bias * scale).to(bias_dtype),
                None, None, None)


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None = None,
                         *, ignore_index: int = -100, chunk_rows: int | None = None) -> Tensor:
    """Mean cross-entropy of ``hidden @ weight.T + bias`` against ``targets``, never building the
    logits: equal to ``F.cross_entropy(F.linear(hidden, weight, bias), targets,
    ignore_index=ignore_index)`` (softmax in float32), with the same gradients.

    hidden (..., C); weight (V, C); bias (V,) or None; targets (...) class ids, ``ignore_index``
    where a position carries no loss. ``chunk_rows``: rows per chunk (default: about
    ``CHUNK_ELEMENTS`` logits per chunk). The gradients are computed during the forward, so
    autograd keeps (N, C) + (V, C) floats instead of the (N, V) logits.
    """
    hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1)
    if targets.shape[0] != hidden.shape[0]:
        raise ValueError(f"targets hold {targets.shape[0]} positions but hidden holds {hidden.shape[0]}")
    rows = chunk_rows or max(1, CHUNK_ELEMENTS // weight.shape[0])
    inputs = (hidden, weight) if bias is None else (hidden, weight, bias)
    if torch.is_grad_enabled() and any(x.requires_grad for x in inputs):
        return _LinearCrossEntropy.apply(hidden, weight, bias, targets, ignore_index, rows)
    total = _chunked(hidden, weight, bias, targets, ignore_index, rows, (False, False, False))[0]
    return total / (targets != ignore_index).sum()
