"""UTF-8 bytes as tokens: ids 0–255 are bytes, then pad, bos and eos. Any text, no vocabulary file.

``to_hf_files`` gives the same tokenizer as Hugging Face files (a byte-level tokenizer.json and a
tokenizer_config.json), so a model exported with ``to_hf`` works with ``AutoTokenizer`` and
pipelines; it needs the ``tokenizers`` package, imported only then.
"""
from __future__ import annotations

import json
from typing import ClassVar

from seqzoo.errors import InputError
from seqzoo.interfaces import Tokenizer
from seqzoo.registry import builtin


@builtin("UTF-8 bytes plus pad/bos/eos ids (259 ids, no vocabulary file)")
class BytesTokenizer(Tokenizer):
    """259 ids: 256 bytes, pad=256, bos=257, eos=258. No recipe parameters."""

    vocab_size = 259
    pad_id = 256
    bos_id = 257
    eos_id = 258
    #: The special tokens' text in the exported tokenizer (GPT-2 style, unlikely in real text).
    special_tokens: ClassVar[dict[str, str]] = {"pad_token": "<|pad|>", "bos_token": "<|bos|>", "eos_token": "<|eos|>"}

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        """Bytes back to text; special ids are dropped and broken UTF-8 is replaced, not raised."""
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def identity(self) -> str:
        return "bytes"

    def encode_documents(self, texts: list[str]) -> list:
        """Each text's UTF-8 bytes as a uint8 array, without a Python int per byte."""
        import numpy as np

        return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]

    def to_hf_files(self) -> dict[str, str]:
        """{file name: text} of this tokenizer for a Hugging Face folder: tokenizer.json and
        tokenizer_config.json. Encoding any text gives the same ids as ``encode``.

        The tokenizer.json is a BPE with no merges over GPT-2's byte alphabet: the ByteLevel
        pre-tokenizer turns each byte into one printable character, and each character's id is
        its byte (WordLevel would look up whole words instead). pad/bos/eos are special tokens with
        ids 256–258. tokenizer_config.json sets ``split_special_tokens`` so transformers encodes
        the text "<|eos|>" as its bytes too, as ``encode`` does.
        """
        try:
            from tokenizers import AddedToken, decoders, models, pre_tokenizers
            from tokenizers import Tokenizer as Backend
        except ImportError:
            raise InputError("the bytes tokenizer's Hugging Face form needs the 'tokenizers' "
                             "package: pip install tokenizers") from None
        # GPT-2's byte -> character map (bytes_to_unicode): printable bytes stand for themselves,
        # the others, in byte order, for chr(256), chr(257), ...; the alphabet says which is which.
        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        vocab: dict[str, int] = {}
        shifted = 0
        for byte in range(256):
            char = chr(byte)
            if char not in alphabet:
                char, shifted = chr(256 + shifted), shifted + 1
            vocab[char] = byte
        specials = {self.pad_id: self.special_tokens["pad_token"], self.bos_id: self.special_tokens["bos_token"],
                    self.eos_id: self.special_tokens["eos_token"]}
        vocab.update({text: token_id for token_id, text in specials.items()})
        backend = Backend(models.BPE(vocab=vocab, merges=[]))
        # No prefix space and no regex split: the text's bytes go through unchanged, in one piece
        # that the merge-less BPE cuts into single bytes.
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(text, special=True, normalized=False)
                                    for _, text in sorted(specials.items())])
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **self.special_tokens,
                  "split_special_tokens": True, "clean_up_tokenization_spaces": False}
        return {"tokenizer.json": backend.to_str(pretty=True) + "\n",
                "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}
