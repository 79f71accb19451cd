"""GGUF files (llama.cpp's format) in and out for every family llama.cpp runs that seqzoo converts:
``from_gguf(path)`` and ``to_gguf(model, path)``, through the ``gguf`` package
(``pip install 'seqzoo[gguf]'``).

A family's GGUF form is a ``GGUFArch`` declared beside its Hugging Face names in its converter
plugin (``seqzoo.io.gguf.arch``); the conversion itself goes through the HF converter
(``seqzoo.io.gguf.convert``), so GGUF and HF cannot disagree about a tensor. Tokenizers are
byte-level BPE, or seqzoo's ``bytes`` written so llama.cpp tokenizes the same way
(``seqzoo.io.gguf.tokenizer``). docs/gguf.md has the table of families, types and checks.
"""
from .arch import EXPERT_KEYS, LLAMA_KEYS, GGUFArch, Key, Transform
from .convert import families, from_gguf, gguf_summary, to_gguf
from .reader import GGUFFile

__all__ = ["EXPERT_KEYS", "GGUFArch", "GGUFFile", "Key", "LLAMA_KEYS", "Transform", "families", "from_gguf",
           "gguf_summary", "to_gguf"]
