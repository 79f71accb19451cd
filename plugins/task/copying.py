"""Task `copying`: copy a random string of tokens (Jelassi, Brandfonbrener, Kakade & Malach, 2024,
"Repeat After Me: Transformers are Better than State Space Models at Copying"), as token rows.

A row is a start token, a string of ℓ symbols drawn uniformly from an alphabet of A ids, a
separator, and the string again, then padding:

    ⟨s⟩ x₁ x₂ … x_ℓ ⟨copy⟩ x₁ x₂ … x_ℓ  0 0 …             (2ℓ + 2 tokens, padded to T)

The loss and the scores count only the copy (the label at ⟨copy⟩ is x₁, at the copy's x_i it is
x_{i+1}); the string itself is random, so nothing else can be predicted. A string holds
ℓ·log2(A) bits: a model whose state is finite must fit them in it, attention can look each symbol
up. Training lengths are drawn uniformly from min_len .. max_len for each row. Held-out rows come
in one group per length of ``eval_lengths`` (each group's rows exactly 2ℓ + 2 long, so lengths
past the training range test length generalisation), scored by the share of strings copied
exactly (every symbol's argmax right, which is what greedy decoding would copy) and per token.
"""
from __future__ import annotations

import random

import torch
from torch import Tensor

from seqzoo.errors import ConfigError
from seqzoo.interfaces import IGNORE, Tokenizer, TokenTask
from seqzoo.registry import builtin
from seqzoo.schema import NonNegativeInt, PositiveInt

#: The ids the layout itself uses: padding, the start token, the separator before the copy.
PAD, START, COPY = 0, 1, 2


def copying_rows(lengths: list[int], alphabet: int, first: int, generator: torch.Generator,
                 seq_len: int | None = None) -> tuple[Tensor, Tensor]:
    """(ids (B, T), labels (B, T)) for one string per entry of ``lengths`` (B of them), each of ids
    first .. first + alphabet − 1; T = ``seq_len`` or 2·max(lengths) + 2. Labels: the copy's
    symbols at the positions that predict them, IGNORE elsewhere."""
    longest = max(lengths)
    seq_len = 2 * longest + 2 if seq_len is None else seq_len
    symbols = torch.randint(alphabet, (len(lengths), longest), generator=generator) + first  # (B, L)
    length = torch.tensor(lengths)[:, None]                                                   # (B, 1)
    position = torch.arange(seq_len)[None, :]                                                 # (1, T)

    def symbol(index: Tensor, where: Tensor, otherwise: int) -> Tensor:
        """symbols[b, index[b, t]] where ``where`` holds, else ``otherwise``: (B, T)."""
        picked = symbols.gather(1, index.clamp(0, longest - 1).expand(len(lengths), seq_len))
        return torch.where(where, picked, torch.tensor(otherwise))

    string = (position >= 1) & (position <= length)
    copy = (position >= length + 2) & (position <= 2 * length + 1)
    ids = torch.where(string, symbol(position - 1, string, PAD), symbol(position - length - 2, copy, PAD))
    ids = ids.masked_fill(position == 0, START).masked_fill(position == length + 1, COPY)
    predicts_copy = (position >= length + 1) & (position <= 2 * length)  # position t predicts token t + 1
    labels = symbol(position - length - 1, predicts_copy, IGNORE)
    return ids, labels


@builtin("copy a random token string after a separator (Jelassi et al. 2024); exact copies per length")
class CopyingTask(TokenTask):
    """min_len/max_len: training string lengths, drawn uniformly per row (1, 32). eval_lengths:
    the held-out lengths, one group each ([8, 16, 32, 64, 128]). alphabet: how many symbols (26).
    first: the first symbol id (3; ids 0, 1, 2 are padding, start and separator)."""

    token_accuracy = True
    exact_match = True

    def __init__(self, min_len: PositiveInt = 1, max_len: PositiveInt = 32,
                 eval_lengths: tuple[PositiveInt, ...] = (8, 16, 32, 64, 128), alphabet: PositiveInt = 26,
                 first: NonNegativeInt = 3) -> None:
        if min_len > max_len:
            raise ConfigError(f"task copying: min_len={min_len} is larger than max_len={max_len}")
        if first <= COPY:
            raise ConfigError(f"task copying: first={first} would give symbols the ids 0..2 of padding, start "
                              f"and separator; use first >= 3")
        if not eval_lengths:
            raise ConfigError("task copying: eval_lengths is empty; give the string lengths to score, e.g. [16, 64]")
        self.min_len, self.max_len, self.alphabet, self.first = min_len, max_len, alphabet, first
        self.eval_lengths = sorted(int(n) for n in eval_lengths)
        self.seq_len = 2 * max_len + 2
        self.seed = 0

    def bind(self, tokenizer: Tokenizer, vocab_size: int, seed: int) -> None:
        if self.first + self.alphabet > vocab_size:
            raise ConfigError(f"task copying: symbols use ids {self.first}..{self.first + self.alphabet - 1}, beyond "
                              f"the model's vocab_size={vocab_size}; lower alphabet or first")
        self.seed = seed

    def batch(self, start: int, size: int) -> dict[str, Tensor]:
        choose = random.Random(f"copying:{self.seed}:{start}")
        lengths = [choose.randint(self.min_len, self.max_len) for _ in range(size)]
        generator = torch.Generator().manual_seed(choose.getrandbits(63))
        ids, labels = copying_rows(lengths, self.alphabet, self.first, generator, self.seq_len)
        return {"ids": ids, "labels": labels}

    def held_out(self, rows: int, batch_size: int):
        for length in self.eval_lengths:
            generator = torch.Generator().manual_seed(20_000 + self.seed)  # each length: its own fixed rows
            for first in range(0, rows, batch_size):
                ids, labels = copying_rows([length] * min(batch_size, rows - first), self.alphabet, self.first,
                                           generator)
                yield f"L={length}", {"ids": ids, "labels": labels}
