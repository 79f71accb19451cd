"""Task `mqar`: multi-query associative recall (Arora et al., 2023, "Zoology"), as token rows.

A row lists N key–value pairs, then asks for every key again in a random order, each followed by
its value:

    k₁ v₁ k₂ v₂ … k_N v_N   q₁ v(q₁) q₂ v(q₂) … q_N v(q_N)

The loss and the accuracy count only the value after each queried key (the label at the key's
position; every other label is ignored): to predict it, the model must find that key among the
pairs and read the token after it. Keys are ``keys`` distinct ids from ``first``, values ``keys``
ids after them. Every batch draws one N from ``pairs`` (a row is 4N tokens); with a
``curriculum`` of R rows, the list of N the batch may draw from grows one entry at a time over the
first R rows (N = 4, then 4 or 8, ...). Held-out rows are scored per N (one group each), by the
share of queried values predicted by argmax.
"""
from __future__ import annotations

import random

import torch
from torch import Tensor

from seqzoo.errors import ConfigError
from seqzoo.interfaces import IGNORE, Tokenizer, TokenTask
from seqzoo.registry import builtin
from seqzoo.schema import NonNegativeInt, PositiveInt


def mqar_rows(batch: int, pairs: int, keys: int, first: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(ids (B, 4N), labels (B, 4N)): N pairs of distinct keys and random values, then every key
    again in a random order followed by its value; the label at each queried key is its value,
    IGNORE elsewhere."""
    key_ids = torch.rand(batch, keys, generator=generator).argsort(-1)[:, :pairs] + first   # (B, N)
    values = torch.randint(keys, (batch, pairs), generator=generator) + first + keys          # (B, N)
    order = torch.rand(batch, pairs, generator=generator).argsort(-1)                        # (B, N)
    asked, answers = key_ids.gather(1, order), values.gather(1, order)
    ids = torch.stack([torch.stack([key_ids, values], -1), torch.stack([asked, answers], -1)], 1).flatten(1)
    labels = torch.full_like(ids, IGNORE)
    labels[:, 2 * pairs::2] = answers  # at each queried key, the value that follows it
    return ids, labels


def allowed_pairs(pairs: list[int], row: int, curriculum: int) -> list[int]:
    """The N a batch starting at ``row`` may draw: over the first ``curriculum`` rows the list grows
    one entry at a time in equal stages, then it is all of ``pairs``."""
    if curriculum <= 0:
        return pairs
    return pairs[:min(len(pairs), 1 + len(pairs) * row // curriculum)]


@builtin("multi-query associative recall: N key-value pairs, then every key asked again")
class MQARTask(TokenTask):
    """pairs: the numbers of key–value pairs N a batch draws from ([4, 8, 16, 32]). keys: how many
    distinct keys there are, and as many values (64). first: the first key id (3); keys and values
    take ids first .. first + 2·keys − 1, which the model's vocabulary must hold. curriculum: rows
    over which the list of N grows from its first entry (0: every N from the start)."""

    token_accuracy = True

    def __init__(self, pairs: tuple[PositiveInt, ...] = (4, 8, 16, 32), keys: PositiveInt = 64,
                 first: NonNegativeInt = 3, curriculum: NonNegativeInt = 0) -> None:
        self.pairs = sorted(int(n) for n in pairs)
        if not self.pairs or self.pairs[0] < 1:
            raise ConfigError(f"task mqar: pairs={list(pairs)} must be positive numbers of pairs")
        if self.pairs[-1] > keys:
            raise ConfigError(f"task mqar: pairs up to {self.pairs[-1]} need at least as many keys; keys={keys}")
        self.keys, self.first, self.curriculum = keys, first, curriculum
        self.seq_len = 4 * self.pairs[-1]
        self.seed = 0

    def bind(self, tokenizer: Tokenizer, vocab_size: int, seed: int) -> None:
        needed = self.first + 2 * self.keys
        if needed > vocab_size:
            raise ConfigError(f"task mqar: keys and values use ids {self.first}..{needed - 1}, beyond the model's "
                              f"vocab_size={vocab_size}; lower keys or first")
        self.seed = seed

    def batch(self, start: int, size: int) -> dict[str, Tensor]:
        choose = random.Random(f"mqar:{self.seed}:{start}")
        pairs = choose.choice(allowed_pairs(self.pairs, start, self.curriculum))
        generator = torch.Generator().manual_seed(choose.getrandbits(63))
        ids, labels = mqar_rows(size, pairs, self.keys, self.first, generator)
        return {"ids": ids, "labels": labels}

    def held_out(self, rows: int, batch_size: int):
        for pairs in self.pairs:
            generator = torch.Generator().manual_seed(10_000 + self.seed)  # each N: its own fixed rows
            for first in range(0, rows, batch_size):
                ids, labels = mqar_rows(min(batch_size, rows - first), pairs, self.keys, self.first, generator)
                yield f"N={pairs}", {"ids": ids, "labels": labels}
