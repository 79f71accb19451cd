"""Tokenizers and tasks: text to token ids, and the examples or token rows a model trains on."""
from __future__ import annotations

from torch import Tensor


class Tokenizer:
    """Text <-> ids. Registered under kind ``tokenizer`` and named by a recipe's ``tokenizer:``."""

    #: The number of ids (a class attribute when it is fixed, as the bytes tokenizer's; a property
    #: of a tokenizer read from a file). Recipes check model.vocab_size against a fixed one.
    vocab_size: int | None = None
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    #: The id of the mask token masked-LM models predict ([MASK], <mask>), or None.
    mask_id: int | None = None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError(f"{type(self).__name__} must implement encode(text)")

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError(f"{type(self).__name__} must implement decode(ids)")

    def special_ids(self) -> set[int]:
        """The ids of special tokens ([CLS], [SEP], padding, ...), which masked-LM training never
        masks: pad, bos, eos and mask here; tokenizers with more special tokens add theirs."""
        return {i for i in (self.pad_id, self.bos_id, self.eos_id, self.mask_id) if i is not None}

    @classmethod
    def from_str(cls, text: str, **params) -> Tokenizer:
        """The tokenizer whose serialised form (``to_str``) is ``text``, with the recipe's ``params``
        (a checkpoint rebuilds its tokenizer so). Default: a tokenizer that has no such form."""
        return cls(**params)

    def to_str(self) -> str | None:
        """The tokenizer's own serialised form (an hf tokenizer's tokenizer.json text), which a
        checkpoint stores; None for a tokenizer that needs none (bytes)."""
        return None

    def to_hf_files(self) -> dict[str, str] | None:
        """{file name: text} of this tokenizer for a Hugging Face folder, or None when it has no
        such form (``to_hf`` then writes the model without one, and says so)."""
        text = self.to_str()
        return None if text is None else {"tokenizer.json": text}

    def token(self, token_id: int | None) -> str | None:
        """The text of one id, as the vocabulary names it (None for None). Default: the id decoded."""
        return None if token_id is None else self.decode([token_id])

    def identity(self) -> str:
        """What makes two tokenizers encode every text alike, as a short string: token shards
        record it and training refuses shards whose identity is not the model's tokenizer's.
        Default: the class's qualified name, right for a tokenizer with no vocabulary file;
        tokenizers built from a file return a hash of its contents."""
        return f"{type(self).__module__}.{type(self).__qualname__}"

    def encode_documents(self, texts: list[str]) -> list:
        """The ids of whole documents of a corpus (``seqzoo data prepare``), each a sequence of
        ints or an integer numpy array: no special tokens added (prepare puts the end token
        between documents itself). Default: ``encode`` each; tokenizers with a batched or
        zero-copy path override it."""
        return [self.encode(text) for text in texts]


class Task:
    """Training data (kind ``task``): a generator of (prompt, answer) text pairs.

    Constructor: ``(**params)``. ``example(rng, split)`` draws one pair for ``split`` ("train" or
    "eval"; eval may use other lengths, so held-out examples also test generalisation).
    ``exact_match`` says whether answers can be scored by exact match of greedy generations
    (false for free text, which is scored by loss only). Decoder LMs see ``prompt=answer``; seq2seq
    models see the pair. Prompts must not contain ``separator``.
    """

    exact_match: bool = True
    separator: str = "="

    def example(self, rng, split: str = "train") -> tuple[str, str]:
        raise NotImplementedError(f"{type(self).__name__} must implement example(rng, split)")


IGNORE = -100  # the label of a position that carries no loss (PyTorch's cross-entropy ignore_index)


class TokenTask(Task):
    """Training data given as token ids rather than text pairs (kind ``task``): windows of a
    prepared corpus (``tokens``), synthetic token sequences (``mqar``).

    The trainer asks for rows by their index in the run's stream — row ``i`` is the ``i``-th row
    the run trains on, over all ranks and micro-batches — so the stream's position is one integer,
    which checkpoints keep, and two ranks never read the same row. Scored by held-out loss and
    perplexity, per group of held-out rows; with ``token_accuracy`` also by the argmax accuracy at
    the labelled positions, and with ``exact_match`` by the share of rows right at every one.
    """

    #: Whether evaluation also scores whole rows: the share of held-out rows whose every labelled
    #: token the argmax predicts right. Under teacher forcing that equals greedy decoding's exact
    #: match, since each right prediction is the input the next one would have been fed.
    exact_match = False
    #: Whether evaluation also scores the argmax prediction at every labelled position.
    token_accuracy: bool = False
    #: Input tokens per row (T): every row of ``batch`` and ``held_out`` has this length.
    seq_len: int = 0

    def bind(self, tokenizer: Tokenizer, vocab_size: int, seed: int) -> None:
        """Called once before training with the model's tokenizer and vocabulary size: refuse data
        they cannot read; ``seed`` (``train.seed``) fixes the stream."""

    def batch(self, start: int, size: int) -> dict[str, Tensor]:
        """Rows ``start .. start + size − 1`` of the training stream: ``ids`` (B, T) and ``labels``
        (B, T) int64, the label of position t being the token after it (IGNORE: no loss); and,
        when the task packs documents with masking on, ``documents`` (B, T) (equal ids share a
        document within a row) and ``positions`` (B, T) when positions restart per document."""
        raise NotImplementedError(f"{type(self).__name__} must implement batch(start, size)")

    def held_out(self, rows: int, batch_size: int):
        """The fixed held-out data, about ``rows`` rows in all, as (group name, batch) pairs; the
        same every call. Each group is scored on its own (MQAR: one group per number of pairs)."""
        raise NotImplementedError(f"{type(self).__name__} must implement held_out(rows, batch_size)")

    def identity(self) -> str:
        """What identifies the data beyond the recipe (a prepared folder's fingerprint), recorded in
        checkpoints so a run is not resumed on other data; "" when the recipe says it all."""
        return ""

    def example(self, rng, split: str = "train") -> tuple[str, str]:
        raise NotImplementedError(f"{type(self).__name__} gives token batches (batch), not text pairs")
