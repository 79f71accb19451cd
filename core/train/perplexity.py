"""Perplexity of a causal LM on a text: ``seqzoo.evaluate(model, text)`` and ``seqzoo eval CKPT
--text FILE``, with the sliding-window method that transformers documents ("Perplexity of
fixed-length models").

The text is tokenized once. Windows of ``context`` tokens start every ``stride`` tokens; each
window scores only the tokens no earlier window scored (its last ``end − previous end``), and
sees the tokens before them as context. With stride = context the windows are disjoint (each
token scored with less context on average); with a smaller stride every scored token has at least
context − stride tokens before it, at the cost of context / stride times the compute. Perplexity
is exp(Σ NLL / N) over the N scored tokens. The first token of the text is never scored (nothing
predicts it), nor, with disjoint windows, the first token of each window. Each window's mean loss
is weighted by the number of tokens it averaged: the guide's code subtracts one per window
(right for its disjoint first window, one too many for the overlapping ones, which moves its
figure by < 0.1%).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from ..interfaces import IGNORE, LanguageModel
from ..registry import tokenizer as tokenizer_of
from .progress import progress as progress_bar


@dataclass(frozen=True)
class Evaluation:
    """perplexity = exp(nll); nll: mean negative log-likelihood (nats per token) over ``tokens``
    scored tokens, in ``windows`` windows of ``context`` with ``stride``; ``seconds``."""

    perplexity: float
    nll: float
    tokens: int
    windows: int
    context: int
    stride: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")


def windows(length: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, scored) for each window over ``length`` tokens: tokens [begin, end) are the
    input, the last ``scored`` of them are scored (transformers' loop, verbatim in its logic)."""
    out, previous = [], 0
    for begin in range(0, length, stride):
        end = min(begin + context, length)
        out.append((begin, end, end - previous))
        previous = end
        if end == length:
            break
    return out


def evaluate(model: nn.Module, text: str | None = None, *, ids: torch.Tensor | None = None,
             context: int | None = None, stride: int | None = None, progress: bool = False) -> Evaluation:
    """Perplexity of ``model`` on ``text`` (or on token ``ids`` (T,)). ``context``: the window
    (default: the model's position limit, else 1024); ``stride`` (default: ``context``)."""
    if not isinstance(model, LanguageModel) or model.family != "causal":
        raise InputError(f"{type(model).__name__} is not a causal LM; perplexity needs a decoder")
    if ids is None:
        if text is None:
            raise InputError("evaluate needs a text or token ids")
        ids = torch.tensor(tokenizer_of(model).encode(text), dtype=torch.long)
    ids = ids.reshape(-1)
    if ids.numel() < 2:
        raise InputError(f"the text has {ids.numel()} token(s); perplexity needs at least 2")
    limit = model.max_positions
    context = min(limit or 1024, 1024 if limit is None else limit) if context is None else context
    stride = context if stride is None else stride  # 0 is refused below, not read as "the default"
    if context < 2 or stride < 1 or stride > context:
        raise InputError(f"context={context} and stride={stride}: need context >= 2 and 1 <= stride <= context")
    if limit is not None and context > limit:
        raise InputError(f"context={context} is longer than the model's {limit} positions; use --context {limit}")
    device = next(model.parameters()).device
    plan = windows(ids.numel(), context, stride)
    bar = progress_bar(len(plan), unit="window", show=progress, leave=False)
    total, count = 0.0, 0
    began = time.perf_counter()
    model.eval()
    with torch.inference_mode():
        for begin, end, scored in plan:
            window = ids[begin:end].to(device)[None]  # (1, L)
            targets = window[:, 1:].clone()  # (1, L − 1): target t is token t + 1
            # score only the last ``scored`` tokens (those no earlier window scored): token j is
            # target j − 1, so targets before L − scored − 1 are ignored
            targets[:, : max(0, window.shape[1] - scored - 1)] = IGNORE
            valid = int((targets != IGNORE).sum())
            if valid:
                inputs = window[:, :-1]
                if model.fused_loss:  # the LM head fused with the loss: no (L, V) logits
                    loss = model(inputs, targets=targets)
                else:
                    loss = F.cross_entropy(model(inputs).flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)
                total += float(loss) * valid
                count += valid
            bar.update(1)
            bar.set_postfix(ppl=f"{math.exp(total / max(count, 1)):.3f}")
    bar.close()
    nll = total / count
    return Evaluation(math.exp(nll), nll, count, len(plan), context, stride, time.perf_counter() - began)
