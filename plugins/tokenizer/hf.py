"""Hugging Face ``tokenizers`` (``tokenizer.json``: BPE, WordPiece, Unigram, WordLevel) as a seqzoo
tokenizer, so an imported checkpoint encodes and decodes text the way it was trained.

The ``tokenizers`` package is imported on first use, not with the plugin. A checkpoint saved with
``seqzoo.save`` carries the tokenizer.json text in its metadata (``seqzoo.tokenizer``) and rebuilds
the tokenizer from it (``from_str``), so it needs no other file.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from seqzoo.errors import InputError
from seqzoo.interfaces import Tokenizer
from seqzoo.registry import builtin
from seqzoo.schema import NonNegativeInt

#: The special tokens that masked-LM tokenizers mask with, in the order they are looked for.
MASK_TOKENS = ("[MASK]", "<mask>")


@builtin("Hugging Face tokenizers from a tokenizer.json (BPE, WordPiece, ...)", aliases=("huggingface",))
class HFTokenizer(Tokenizer):
    """path: a tokenizer.json (or the folder holding one); null for a model imported without one
    (then only token ids work). bos_id, eos_id, pad_id: the special ids (config.json's
    bos/eos/pad_token_id; null). add_special_tokens: let the tokenizer's post-processor add its
    special tokens ([CLS] … [SEP], a leading <s>), as transformers does by default (true)."""

    def __init__(self, path: str | None = None, bos_id: NonNegativeInt | None = None,
                 eos_id: NonNegativeInt | None = None, pad_id: NonNegativeInt | None = None,
                 add_special_tokens: bool = True) -> None:
        self.path = path
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.add_special_tokens = add_special_tokens
        self._text: str | None = None
        self._tokenizer = None

    @classmethod
    def from_str(cls, text: str, **params) -> HFTokenizer:
        """The tokenizer of a tokenizer.json text (as stored in a checkpoint); ``params`` are the
        recipe's (``path`` is then only a record of where it came from)."""
        tokenizer = cls(**params)
        tokenizer._text = text
        return tokenizer

    def to_str(self) -> str | None:
        """The tokenizer.json text, or None for a tokenizer with no source."""
        if self._text is None and self.path is not None:
            path = Path(self.path)
            if path.is_dir():
                path = path / "tokenizer.json"
            try:
                self._text = path.read_text(encoding="utf-8")
            except OSError as error:
                raise InputError(f"hf tokenizer: cannot read {path} ({error.strerror or error}); "
                                 f"point tokenizer.path at a tokenizer.json") from None
        return self._text

    @property
    def tokenizer(self):
        """The ``tokenizers.Tokenizer`` (built on first use)."""
        if self._tokenizer is None:
            text = self.to_str()
            if text is None:
                raise InputError("this model has no tokenizer (it was imported without a "
                                 "tokenizer.json); pass token ids (--ids) or set tokenizer.path")
            try:
                from tokenizers import Tokenizer as Backend
            except ImportError:
                raise InputError("the hf tokenizer needs the 'tokenizers' package: "
                                 "pip install tokenizers") from None
            try:
                backend = Backend.from_str(text)
            except Exception as error:  # the Rust side raises plain Exceptions
                raise InputError(f"hf tokenizer: not a valid tokenizer.json ({error})") from None
            # A tokenizer.json may pad or truncate every encoding to a fixed length (saved for
            # batched training); transformers turns both off unless asked, and so does seqzoo.
            backend.no_padding()
            backend.no_truncation()
            self._tokenizer = backend
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        """Ids back to text, special tokens dropped."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def identity(self) -> str:
        """``hf:`` and the SHA-256 of the tokenizer.json text (the vocabulary, merges, pre-tokenizer
        and special tokens; a reformatted but equal file counts as another tokenizer)."""
        text = self.to_str()
        if text is None:
            raise InputError("this model has no tokenizer (it was imported without a tokenizer.json), so "
                             "text cannot be tokenized for it; set tokenizer.path")
        return "hf:" + hashlib.sha256(text.encode("utf-8")).hexdigest()

    def encode_documents(self, texts: list[str]) -> list:
        """Batched (Rust threads), without the post-processor's special tokens: a document's ids
        are its text's alone."""
        backend = self.tokenizer
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets nobody reads here.
        encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
        return [encoding.ids for encoding in encode(texts, add_special_tokens=False)]

    def _specials(self) -> dict[str, int]:
        """{text: id} of the special tokens the tokenizer.json declares ({} without one)."""
        if self.to_str() is None:
            return {}
        added = self.tokenizer.get_added_tokens_decoder()
        return {token.content: token_id for token_id, token in added.items() if token.special}

    @property
    def mask_id(self) -> int | None:  # type: ignore[override]
        """The special token [MASK] (BERT) or <mask> (RoBERTa), or None."""
        specials = self._specials()
        return next((specials[t] for t in MASK_TOKENS if t in specials), None)

    def special_ids(self) -> set[int]:
        return super().special_ids() | set(self._specials().values())

    def token(self, token_id: int | None) -> str | None:
        """The text of one token id (None for None or an unknown id)."""
        return None if token_id is None else self.tokenizer.id_to_token(token_id)
