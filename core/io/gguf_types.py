"""The tensor types ``seqzoo.io.gguf.to_gguf`` writes: a module of its own, with nothing heavy in it, so
the command line can offer them (``export-gguf --type``) without importing torch to build its help."""
from __future__ import annotations

#: F32 (exact), F16, BF16, and the block quantisations the gguf package writes (it cannot make
#: K-quants: those come from llama.cpp's own llama-quantize).
WRITABLE = ("F32", "F16", "BF16", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1")
