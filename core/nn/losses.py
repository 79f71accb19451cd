"""Cross-entropy fused with the LM head: the logits exist one bounded chunk at a time.

``F.cross_entropy(head(hidden), targets)`` keeps the (N, V) logits, their log-softmax and an
(N, V) gradient — 12 GiB in float32 for 8k tokens and a 128k vocabulary. Here the rows go through
the head in chunks of at most ``CHUNK_ELEMENTS`` logits: each chunk's logits become their
exponentials in place and the gradient softmax − one_hot goes straight into the hidden states' and
the head's gradients, so nothing of size (N, V) outlives its chunk. The loss is a scalar, so its
backward only scales the gradients computed in the forward (the approach of Liger Kernel's and
torchtune's chunked losses). On a CPU it is also faster than the unfused loss: two passes over the
logits instead of log-softmax's forward and backward, and vocabulary-major products
(docs/performance.md).

Two terms of the training objective ride along, per labelled position with log-partition
lse = log Σ_v exp(x_v) and target t:

    loss = (1 − ε)·(lse − x_t) + ε·(lse − mean_v x_v) + λ·lse²

label smoothing ε (Szegedy et al., 2016; the Transformer's 0.1: the target's share spread evenly
over the vocabulary, as ``F.cross_entropy(label_smoothing=ε)``) and the z-loss λ (PaLM's 1e-4,
Chowdhery et al., 2022), which keeps the logits' scale from drifting. Their gradient with respect
to the logits is p·(1 + 2λ·lse) − (1 − ε)·one_hot(t) − ε/V: the factor (1 + 2λ·lse) joins the
per-position scale, ε/V is one subtraction per chunk. ``cross_entropy`` is the same objective
on logits a model has already made.
"""
from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

#: Chunks hold at most about this many logits (32 MiB in float32): large enough that each chunk's
#: matmuls run at full speed (on a CPU, smaller chunks cost more in matmul efficiency than they
#: save in cache misses), small enough to bound the memory of a 100k+ vocabulary.
CHUNK_ELEMENTS = 2 ** 23


_local = threading.local()


def _workspace(numel: int, like: Tensor) -> Tensor:
    """A float32 buffer of ``numel`` elements on like's device. On the CPU one buffer per thread is
    kept between calls: a fresh 32 MiB allocation is mmap'd and page-faulted anew every step,
    which costs more than the softmax; CUDA's caching allocator already reuses memory. Buffers
    beyond ``CHUNK_ELEMENTS`` (an explicit large ``chunk_rows``) are not kept."""
    if like.device.type != "cpu" or numel > CHUNK_ELEMENTS:
        return like.new_empty(numel)
    buffer = getattr(_local, "buffer", None)
    if buffer is None or buffer.numel() < numel:
        # A normal tensor even when first made under inference_mode, so later calls with
        # autograd on may still write into it.
        with torch.inference_mode(False):
            buffer = _local.buffer = like.new_empty(numel)
    return buffer[:numel]


#: exp without a max shift is exact while a column's sum of exponentials stays in this range;
#: columns outside it (a logit above ~88, or all below ~-46) are recomputed with the shift.
_SAFE_MASS = (1e-20, 1e30)


def _logits(h: Tensor, weight: Tensor, bias: Tensor | None, exact: torch.dtype,
            out: Tensor | None) -> Tensor:
    """Vocabulary-major logits (V, n) for rows h (n, C): W @ hᵀ runs ~25% faster than h @ Wᵀ on
    CPU BLAS for a tall W, and both gradient products then read it without a transpose."""
    if out is not None:
        return torch.mm(weight, h.t(), out=out)
    if bias is None:
        return (weight @ h.t()).to(exact)
    return torch.addmm(bias[:, None], weight, h.t()).to(exact)


def _chunked(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, ignore_index: int,
             rows: int, need: tuple[bool, bool, bool], smoothing: float = 0.0,
             z_loss: float = 0.0) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """Summed loss over rows (N, C) and, for the inputs ``need`` names (hidden, weight, bias), the
    gradients of that sum — chunk by chunk; ``smoothing`` (ε) and ``z_loss`` (λ) as in the
    module docstring.

    Per chunk the logits are exponentiated in place (one pass) and summed per position (one
    more); the one-hot part of the gradient softmax − one_hot is subtracted at the targets, and
    (in float32) the normalisation 1/Σexp is folded into the small (n, C) operands and results
    instead of a pass over the logits. Ignored positions get a zero scale.
    """
    need_hidden, need_weight, need_bias = need
    exact = torch.promote_types(weight.dtype, torch.float32)  # softmax and sums: float32 or better
    total = torch.zeros((), dtype=exact, device=hidden.device)
    grad_hidden = torch.empty_like(hidden) if need_hidden else None
    # The first chunk's product overwrites grad_weight; with no rows at all nothing would.
    new_weight_grad = torch.empty_like if hidden.shape[0] else torch.zeros_like
    grad_weight = new_weight_grad(weight, dtype=exact) if need_weight else None
    grad_bias = torch.zeros_like(bias, dtype=exact) if need_bias else None
    # Plain float32 writes every chunk's logits into one reused buffer and multiplies the
    # unnormalised exponentials directly; lower precisions normalise before casting down.
    plain = hidden.dtype == weight.dtype == exact == torch.float32 and bias is None \
        and not torch.is_autocast_enabled(hidden.device.type)
    vocab = weight.shape[0]
    buffer = _workspace(vocab * min(rows, hidden.shape[0]), hidden) if plain else None
    terms = bool(smoothing or z_loss)
    if smoothing:  # mean_v x_v = h · mean_v W_v (+ mean b): a product with one (C,) vector, not a pass over V
        mean_row = weight.to(exact).mean(dim=0)
        mean_bias = bias.to(exact).mean() if bias is not None else 0.0
    for start in range(0, hidden.shape[0], rows):
        h, t = hidden[start:start + rows], targets[start:start + rows]
        n = h.shape[0]
        logits = _logits(h, weight, bias, exact, buffer[:vocab * n].view(vocab, n) if plain else None)
        real = t != ignore_index
        safe = torch.where(real, t, 0)
        picked = logits.gather(0, safe[None])[0]
        expo = logits.exp_()
        mass = expo.sum(dim=0)
        shift = torch.zeros_like(mass)
        unsafe = ~((mass >= _SAFE_MASS[0]) & (mass <= _SAFE_MASS[1]))
        if bool(unsafe.any()):  # rare: redo those positions shifted by their largest logit
            cols = unsafe.nonzero()[:, 0]
            redo = _logits(h[cols], weight, bias, exact, None)
            shift[cols] = redo.amax(dim=0)
            expo[:, cols] = (redo - shift[cols]).exp_()
            mass[cols] = expo[:, cols].sum(dim=0)
        if not terms:
            total += ((mass.log() + shift - picked) * real).sum()
        else:
            lse = mass.log() + shift
            row = lse - (1 - smoothing) * picked + z_loss * lse.square()
            if smoothing:
                row = row - smoothing * (h.to(exact) @ mean_row + mean_bias)
            total += (row * real).sum()
        if not any(need):
            continue
        # d(loss)/d(logits) = expo / mass − one_hot(target), zero on ignored positions. The one-hot
        # part is subtracted from expo first (mass at each real target), so the cancellation
        # p − 1 of a confident prediction happens once, in float32, as in torch's own gradient.
        if not terms:
            expo.scatter_add_(0, safe[None], -(mass * real)[None])
            scale = torch.where(real, mass.reciprocal(), 0.0)  # (n,)
        else:  # expo·a/mass − (1 − ε)·one_hot − ε/V with a = 1 + 2λ·lse: both subtractions scaled by mass/a
            a = 1 + 2 * z_loss * lse
            expo.scatter_add_(0, safe[None], -((1 - smoothing) * mass / a * real)[None])
            if smoothing:
                expo.sub_((smoothing / vocab * mass / a)[None])
            scale = torch.where(real, a / mass, 0.0)
        if plain:  # fold 1/mass into the small operands instead of a pass over (V, n)
            probs, hs = expo, h * scale[:, None]
        else:  # normalise before casting down: every entry in [-1, 1]
            probs, hs = expo.mul_(scale).to(hidden.dtype), h
        if need_hidden and plain:
            torch.mm(probs.t(), weight, out=grad_hidden[start:start + n]).mul_(scale[:, None])
        elif need_hidden:
            grad_hidden[start:start + n] = probs.t() @ weight.to(probs.dtype)
        if need_weight:  # the first chunk writes, later ones add
            grad_weight.addmm_(probs.to(exact), hs.to(exact), beta=1 if start else 0)
        if need_bias:
            grad_bias += probs.sum(1, dtype=exact)
    return total, grad_hidden, grad_weight, grad_bias


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                ignore_index: int, rows: int, smoothing: float, z_loss: float) -> Tensor:
        total, grad_hidden, grad_weight, grad_bias = _chunked(
            hidden, weight, bias, targets, ignore_index, rows, tuple(ctx.needs_input_grad[:3]), smoothing, z_loss)
        count = (targets != ignore_index).sum()
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias, count)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return total / count  # 0/0 = nan when every target is ignored, as F.cross_entropy

    @staticmethod
    @once_differentiable  # the gradients are precomputed numbers: no double backward
    def backward(ctx, grad_output: Tensor):
        grad_hidden, grad_weight, grad_bias, count = ctx.saved_tensors
        # With every target ignored the loss is nan (as torch's) but the gradients are zeros.
        scale = grad_output / count.clamp(min=1)
        weight_dtype, bias_dtype = ctx.dtypes
        return (None if grad_hidden is None else grad_hidden * scale.to(grad_hidden.dtype),
                None if grad_weight is None else (grad_weight * scale).to(weight_dtype),
                None if grad_bias is None else (grad_bias * scale).to(bias_dtype),
                None, None, None, None, None)


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None = None,
                         *, ignore_index: int = -100, chunk_rows: int | None = None,
                         label_smoothing: float = 0.0, z_loss: float = 0.0) -> Tensor:
    """Mean cross-entropy of ``hidden @ weight.T + bias`` against ``targets``, never building the
    logits: equal to ``F.cross_entropy(F.linear(hidden, weight, bias), targets,
    ignore_index=ignore_index)`` (softmax in float32), with the same gradients; with
    ``label_smoothing`` ε and ``z_loss`` λ, equal to ``cross_entropy`` of those logits.

    hidden (..., C); weight (V, C); bias (V,) or None; targets (...) class ids, ``ignore_index``
    where a position carries no loss. ``chunk_rows``: rows per chunk (default: about
    ``CHUNK_ELEMENTS`` logits per chunk). The gradients are computed during the forward, so
    autograd keeps (N, C) + (V, C) floats instead of the (N, V) logits; there is no double
    backward. Under ``torch.compile`` the check for extreme logits is a graph break. When fewer
    than half the positions carry a label, only those rows go through the head (not under
    ``torch.compile``, whose shapes must not depend on the data).
    """
    hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1)
    if targets.shape[0] != hidden.shape[0]:
        raise ValueError(f"targets hold {targets.shape[0]} positions but hidden holds {hidden.shape[0]}")
    labelled = targets != ignore_index
    if not torch.compiler.is_compiling() and int(labelled.sum()) * 2 < targets.shape[0]:
        # Mostly ignored positions (recall queries, copies, prompt-masked answers): only the
        # labelled rows go through the head; the mean is over them either way.
        hidden, targets = hidden[labelled], targets[labelled]
    rows = chunk_rows or max(1, CHUNK_ELEMENTS // weight.shape[0])
    inputs = (hidden, weight) if bias is None else (hidden, weight, bias)
    if torch.is_grad_enabled() and any(x.requires_grad for x in inputs):
        return _LinearCrossEntropy.apply(hidden, weight, bias, targets, ignore_index, rows, label_smoothing, z_loss)
    total = _chunked(hidden, weight, bias, targets, ignore_index, rows, (False, False, False), label_smoothing,
                     z_loss)[0]
    return total / (targets != ignore_index).sum()


def cross_entropy(logits: Tensor, targets: Tensor, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                  z_loss: float = 0.0) -> Tensor:
    """The training objective on logits (..., V) against targets (...): the mean over labelled
    positions of (1 − ε)·CE + ε·(lse − mean_v x_v) + λ·lse² (the module docstring), in float32.
    With ε = λ = 0 exactly ``F.cross_entropy(logits.float(), targets)``."""
    logits, targets = logits.flatten(0, -2).float(), targets.flatten()
    loss = F.cross_entropy(logits, targets, ignore_index=ignore_index, label_smoothing=label_smoothing)
    if z_loss:
        real = targets != ignore_index
        loss = loss + z_loss * (torch.logsumexp(logits, dim=-1).square() * real).sum() / real.sum()
    return loss
