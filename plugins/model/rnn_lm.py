"""Recurrent language model and sequence classifier/regressor: embedding → a stack of recurrent
cells (LSTM by default) → a head over the states.

Heads: ``lm`` predicts the next token at every step (cross-entropy); ``last`` classifies a sequence
from its last real state and ``mean`` from the mean of its real states (cross-entropy over
``num_classes``); ``regression`` predicts ``num_classes`` real values from the last real state (MSE).
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import seqzoo
from seqzoo.builder import Parts
from seqzoo.interfaces import LanguageModel
from seqzoo.nn.init import init_weights
from seqzoo.nn.linear import Linear
from seqzoo.nn.recurrent import RecurrentStack
from seqzoo.registry import builtin
from seqzoo.schema import Depth, PositiveFloat, Probability, SchemaError, Size, Spec


@builtin("recurrent LM / sequence classifier / regressor (LSTM, GRU, RNN)")
class RNNLM(LanguageModel):
    """Recipe keys: vocab_size V, dim (embedding width E), hidden (state width), layers (1),
    cell (lstm), dropout (embedding, inter-layer and output; 0), head (lm | last | mean |
    regression), num_classes (classes, or regression targets; required for last/mean),
    tie_embeddings (share the LM head with the embedding; needs dim == hidden; false),
    init_std (0.02 for the embedding and heads; cells keep their own init)."""

    prompt_padding = None  # the recurrence cannot skip left padding: prompts batch by length

    def __init__(self, parts: Parts, vocab_size: Size, dim: Size, hidden: Size,
                 layers: Depth = 1, cell: Spec["cell"] = "lstm", dropout: Probability = 0.0,
                 head: Literal["lm", "last", "mean", "regression"] = "lm",
                 num_classes: Size | None = None, tie_embeddings: bool = False,
                 init_std: PositiveFloat = 0.02) -> None:
        super().__init__()
        self.vocab_size, self.head_kind = vocab_size, head
        self.tie_embeddings = tie_embeddings and head == "lm"
        self.embed = nn.Embedding(vocab_size, dim)
        self.drop = nn.Dropout(dropout)
        self.rnn = RecurrentStack(dim, hidden, parts.factory("cell", cell), layers=layers, dropout=dropout)
        outputs = vocab_size if head == "lm" else (num_classes or 1)
        self.head = Linear(hidden, outputs, bias=head != "lm")
        init_weights(self, init_std, branches=1)  # no residual stream
        self.tie_weights()

    @classmethod
    def check_recipe(cls, model: dict, path: tuple, validator: object = None) -> None:
        if model["head"] in ("last", "mean") and model["num_classes"] is None:
            raise SchemaError((*path, "num_classes"),
                              f"head {model['head']!r} classifies sequences: set num_classes")
        if model["tie_embeddings"] and model["dim"] != model["hidden"]:
            raise SchemaError((*path, "tie_embeddings"),
                              f"tying needs dim == hidden, got dim={model['dim']} and hidden={model['hidden']}")

    def shard_units(self) -> list[nn.Module]:
        return [self.rnn]

    def tie_weights(self) -> None:
        if self.tie_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, input_ids: Tensor, lengths: Tensor | None = None, state=None,
                return_state: bool = False):
        """input_ids (B, T) -> lm: logits (B, T, V); last/mean: logits (B, num_classes);
        regression: values (B, num_classes). lengths (B,): real lengths (right padding).
        ``return_state`` also returns the stack's final states (to continue from)."""
        x = self.drop(self.embed(input_ids))
        hidden, state = self.rnn(x, state, lengths)  # (B, T, H)
        hidden = self.drop(hidden)
        if self.head_kind == "lm":
            out = self.head(hidden)
        elif self.head_kind == "mean":
            out = self.head(_masked_mean(hidden, lengths))
        else:
            out = self.head(_last_real(hidden, lengths))
        return (out, state) if return_state else out

    def loss(self, output: Tensor, target: Tensor, lengths: Tensor | None = None) -> Tensor:
        """The head's loss: cross-entropy for lm (ignoring padded steps) and last/mean; MSE for
        regression. target: (B, T) next tokens, (B,) classes or (B, num_classes) values."""
        if self.head_kind == "regression":
            return F.mse_loss(output, target.to(output.dtype).view_as(output))
        if self.head_kind == "lm":
            if lengths is not None:
                steps = torch.arange(target.shape[1], device=target.device)[None]
                target = target.masked_fill(steps >= lengths.to(target.device)[:, None], -100)
            return F.cross_entropy(output.flatten(0, 1), target.flatten(), ignore_index=-100)
        return F.cross_entropy(output, target)

    def start_generation(self, input_ids: Tensor, max_new_tokens: int, use_cache: bool = True,
                         attention_mask: Tensor | None = None) -> "RecurrentSession":
        if self.head_kind != "lm":
            raise seqzoo.InputError(f"generation needs head 'lm', this model has head {self.head_kind!r}")
        if attention_mask is not None:
            raise seqzoo.InputError("rnn_lm generation takes unpadded prompts (no attention_mask)")
        return RecurrentSession(self, input_ids, use_cache)


class RecurrentSession:
    """Decoding state: the stack's state after the prompt (cached), or the whole sequence, run
    again every step (uncached, the reference)."""

    def __init__(self, model: RNNLM, input_ids: Tensor, use_cache: bool) -> None:
        self.model, self.use_cache = model, use_cache
        self.prefix = self.ids = input_ids
        self.state = None

    def next(self, tokens: Tensor | None) -> Tensor:
        if tokens is not None:
            self.ids = torch.cat([self.ids, tokens[:, None]], dim=1)
        if not self.use_cache:
            return self.model(self.ids)[:, -1].float()
        feed = self.ids if tokens is None else tokens[:, None]
        logits, self.state = self.model(feed, state=self.state, return_state=True)
        return logits[:, -1].float()

    def reorder(self, rows: Tensor) -> None:
        self.ids = self.ids.index_select(0, rows)
        if self.state is not None:
            self.state = RecurrentStack.reorder_state(self.state, rows)


def _last_real(hidden: Tensor, lengths: Tensor | None) -> Tensor:
    """hidden (B, T, H) -> the state at each row's last real step (B, H)."""
    if lengths is None:
        return hidden[:, -1]
    index = (lengths.to(hidden.device) - 1).clamp(min=0)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), index]


def _masked_mean(hidden: Tensor, lengths: Tensor | None) -> Tensor:
    """Mean over each row's real steps: hidden (B, T, H) -> (B, H)."""
    if lengths is None:
        return hidden.mean(dim=1)
    steps = torch.arange(hidden.shape[1], device=hidden.device)[None]
    real = (steps < lengths.to(hidden.device)[:, None]).to(hidden.dtype)  # (B, T)
    return (hidden * real[..., None]).sum(1) / real.sum(1, keepdim=True).clamp(min=1)
