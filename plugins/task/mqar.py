"""Task `mqar`: multi-query associative recall, laid out as Zoology lays it out (Arora, Eyuboglu
et al., 2023, "Zoology", Figure 2).

A row of T tokens holds N key–value pairs, then the N keys again as queries, and filler:

    k₁ v₁ k₂ v₂ … k_N v_N   0 0 q 0 0 0 q 0 … 0        (T tokens, T ≥ 4N)

- Keys are N distinct ids of ``keys`` key ids; values N distinct ids of as many value ids after
  them (the two halves of the task's vocabulary, as Zoology draws keys from the lower half and
  values from the upper half).
- After the 2N context tokens come (T − 2N) / 2 query slots, slot s at position 2N + 2s. Each key
  is asked once, in a slot drawn without replacement with weight (s + 1)^(a − 1), a = ``power``
  (0.01): most queries land close to the context's end, as repeated bigrams do in text.
- Every other position holds the ``filler`` id (0). **The answers are never part of the input:**
  the label at a query is its key's value, and every other label is ignored. The only strategy
  that does not bind keys to values is a guess among the N values in context, worth 1/N.

Every batch draws one N from ``pairs``. All rows have the same T (``seq_len``), so a small N
leaves more filler; or, with ``length_per_pair`` = r, a batch of N pairs has rows of r·N tokens,
as Zoology pairs each N with its own T (its (T, N) cells keep T/N fixed), which makes a small N's
batch cheap and its held-out rows as long as its training rows. With a ``curriculum`` of R rows,
the list of N a batch may draw from grows one entry at a time over the first R rows. Held-out rows
are scored per N (one group each), by the share of queried values predicted by argmax; they come
from a generator of their own, so no held-out row is a training row's twin by construction.
"""
from __future__ import annotations

import random

import torch
from torch import Tensor

from seqzoo.errors import ConfigError
from seqzoo.interfaces import IGNORE, Tokenizer, TokenTask
from seqzoo.registry import builtin
from seqzoo.schema import NonNegativeInt, PositiveInt


def query_slot_weights(slots: int, power: float) -> Tensor:
    """The (unnormalised) chance of each query slot s = 0 .. slots − 1: (s + 1)^(power − 1)."""
    return torch.arange(1, slots + 1, dtype=torch.float64) ** (power - 1.0)


def mqar_rows(batch: int, pairs: int, keys: int, first: int, generator: torch.Generator, seq_len: int | None = None,
              filler: int = 0, power: float = 0.01) -> tuple[Tensor, Tensor]:
    """(ids (B, T), labels (B, T)), T = ``seq_len`` (4N when None): N pairs of distinct keys (ids
    first .. first + keys − 1) and distinct values (the next ``keys`` ids), then each key once in a
    query slot drawn by ``query_slot_weights``; the label at each query is its value, IGNORE
    elsewhere; every other input position holds ``filler``."""
    seq_len = 4 * pairs if seq_len is None else seq_len
    slots = (seq_len - 2 * pairs) // 2
    key_ids = torch.rand(batch, keys, generator=generator).argsort(-1)[:, :pairs] + first            # (B, N)
    values = torch.rand(batch, keys, generator=generator).argsort(-1)[:, :pairs] + first + keys      # (B, N)
    weights = query_slot_weights(slots, power).expand(batch, slots)
    where = torch.multinomial(weights, pairs, replacement=False, generator=generator)  # (B, N): key i's slot
    ids = torch.full((batch, seq_len), filler, dtype=torch.long)
    ids[:, :2 * pairs] = torch.stack([key_ids, values], -1).flatten(1)
    positions = 2 * pairs + 2 * where                                                            # (B, N)
    ids.scatter_(1, positions, key_ids)
    labels = torch.full_like(ids, IGNORE).scatter_(1, positions, values)
    return ids, labels


def allowed_pairs(pairs: list[int], row: int, curriculum: int) -> list[int]:
    """The N a batch starting at ``row`` may draw: over the first ``curriculum`` rows the list grows
    one entry at a time in equal stages, then it is all of ``pairs``."""
    if curriculum <= 0:
        return pairs
    return pairs[:min(len(pairs), 1 + len(pairs) * row // curriculum)]


@builtin("multi-query associative recall (Zoology's layout): N key-value pairs, then every key asked once")
class MQARTask(TokenTask):
    """pairs: the numbers of key–value pairs N a batch draws from ([4, 8, 16, 32]). keys: how many
    distinct keys there are, and as many values (64). first: the first key id (3); keys and values
    take ids first .. first + 2·keys − 1, which the model's vocabulary must hold. seq_len: tokens
    per row (null: 4 × the largest N; at least that). filler: the id of every position that is
    neither a pair nor a query (0). power: the query gaps' power law, p(s) ∝ (s+1)^(power−1)
    (0.01). curriculum: rows over which the list of N grows from its first entry (0: every N from
    the start). length_per_pair: r > 0 gives a batch of N pairs rows of r·N tokens (at least 4)
    instead of seq_len, which is then the longest row, r times the largest N (null: fixed T)."""

    token_accuracy = True

    def __init__(self, pairs: tuple[PositiveInt, ...] = (4, 8, 16, 32), keys: PositiveInt = 64,
                 first: NonNegativeInt = 3, seq_len: PositiveInt | None = None, filler: NonNegativeInt = 0,
                 power: float = 0.01, curriculum: NonNegativeInt = 0,
                 length_per_pair: PositiveInt | None = None) -> None:
        self.pairs = sorted(int(n) for n in pairs)
        if not self.pairs:
            raise ConfigError("task mqar: pairs is empty; give the numbers of key-value pairs, e.g. [4, 8, 16]")
        if self.pairs[-1] > keys:
            raise ConfigError(f"task mqar: pairs up to {self.pairs[-1]} need at least as many keys; keys={keys}")
        if length_per_pair is not None:
            if length_per_pair < 4:
                raise ConfigError(f"task mqar: length_per_pair={length_per_pair} cannot hold N pairs and their "
                                  f"queries in r·N tokens; it needs r >= 4")
            if seq_len is not None and seq_len != length_per_pair * self.pairs[-1]:
                raise ConfigError(f"task mqar: seq_len={seq_len} and length_per_pair={length_per_pair} disagree: "
                                  f"the longest row is {length_per_pair} × {self.pairs[-1]} tokens; drop seq_len")
            seq_len = length_per_pair * self.pairs[-1]
        self.length_per_pair = length_per_pair
        self.seq_len = 4 * self.pairs[-1] if seq_len is None else seq_len
        if self.seq_len < 4 * self.pairs[-1]:
            raise ConfigError(f"task mqar: seq_len={self.seq_len} cannot hold N={self.pairs[-1]} pairs and their "
                              f"queries; it needs seq_len >= 4N = {4 * self.pairs[-1]}")
        if first <= filler < first + 2 * keys:
            raise ConfigError(f"task mqar: filler={filler} is one of the key/value ids "
                              f"{first}..{first + 2 * keys - 1}; choose a filler outside them")
        if not 0.0 < power <= 1.0:
            raise ConfigError(f"task mqar: power={power} must be in (0, 1] (1: every query slot equally likely)")
        self.keys, self.first, self.filler, self.power, self.curriculum = keys, first, filler, power, curriculum
        self.seed = 0

    def bind(self, tokenizer: Tokenizer, vocab_size: int, seed: int) -> None:
        needed = max(self.first + 2 * self.keys, self.filler + 1)
        if needed > vocab_size:
            raise ConfigError(f"task mqar: keys and values use ids {self.first}..{self.first + 2 * self.keys - 1}, "
                              f"beyond the model's vocab_size={vocab_size}; lower keys or first")
        self.seed = seed

    def rows(self, size: int, pairs: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        length = self.seq_len if self.length_per_pair is None else self.length_per_pair * pairs
        return mqar_rows(size, pairs, self.keys, self.first, generator, length, self.filler, self.power)

    def batch(self, start: int, size: int) -> dict[str, Tensor]:
        choose = random.Random(f"mqar:{self.seed}:{start}")
        pairs = choose.choice(allowed_pairs(self.pairs, start, self.curriculum))
        ids, labels = self.rows(size, pairs, torch.Generator().manual_seed(choose.getrandbits(63)))
        return {"ids": ids, "labels": labels}

    def held_out(self, rows: int, batch_size: int):
        for pairs in self.pairs:
            generator = torch.Generator().manual_seed(10_000 + self.seed)  # each N: its own fixed rows
            for first in range(0, rows, batch_size):
                ids, labels = self.rows(min(batch_size, rows - first), pairs, generator)
                yield f"N={pairs}", {"ids": ids, "labels": labels}
