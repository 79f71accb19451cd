"""UTF-8 bytes as tokens: ids 0–255 are bytes, then pad, bos and eos. Any text, no vocabulary file."""
from __future__ import annotations

import seqzoo
from seqzoo.interfaces import Tokenizer


class BytesTokenizer(Tokenizer):
    """259 ids: 256 bytes, pad=256, bos=257, eos=258. No recipe parameters."""

    vocab_size = 259
    pad_id = 256
    bos_id = 257
    eos_id = 258

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        """Bytes back to text; special ids are dropped and broken UTF-8 is replaced, not raised."""
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("tokenizer", "bytes", BytesTokenizer,
                             summary="UTF-8 bytes plus pad/bos/eos ids (259 ids, no vocabulary file)")]
