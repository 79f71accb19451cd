"""Task `tokens`: language modelling on a prepared corpus (``seqzoo data prepare``), read as
fixed-length windows of its memory-mapped token shards — no tokenization while training.

Documents are packed one after the other with the end token between them (prepare wrote them so).
Window k of a split is tokens ``[k·T, k·T + T + 1)``; training rows draw windows through a
seeded permutation per epoch (``seqzoo.data.shards.WindowSampler``), so row i of the run is a pure
function of (seed, i) and a resumed run reads exactly what the uninterrupted one would. The
held-out split is scored on a fixed set of windows spread evenly over it.

``document_mask``: no token attends across a document boundary (each row carries the document id
of every token; the model masks attention with it). ``restart_positions``: positions count from 0
at each document start (and at the row's start) instead of running across the row.
"""
from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.interfaces import Tokenizer, TokenTask
from seqzoo.registry import builtin
from seqzoo.schema import PositiveInt


@builtin("language modelling on prepared token shards (seqzoo data prepare)")
class TokensTask(TokenTask):
    """path: a folder written by ``seqzoo data prepare`` (required). seq_len: input tokens per row T
    (256). document_mask: keep packed documents from attending to each other (false).
    restart_positions: positions restart at every document start (false). verify: check every
    shard's SHA-256 against the manifest before training (true)."""

    def __init__(self, path: str, seq_len: PositiveInt = 256, document_mask: bool = False,
                 restart_positions: bool = False, verify: bool = True) -> None:
        self.path, self.seq_len = path, seq_len
        self.document_mask, self.restart_positions, self.verify = document_mask, restart_positions, verify
        self.shards = None  # the opened seqzoo.data.shards.TokenShards, once bound
        self.sampler = None  # its seqzoo.data.shards.WindowSampler

    def bind(self, tokenizer: Tokenizer, vocab_size: int, seed: int) -> None:
        # The data layer (numpy memmaps) loads here, not with the plugin: `import seqzoo` stays light.
        from seqzoo.data.shards import DataError, WindowSampler, open_shards

        shards = open_shards(self.path, verify=self.verify)
        data = shards.manifest["tokenizer"]
        if tokenizer.identity() != shards.tokenizer_identity:
            raise DataError(f"task tokens: {self.path} was prepared with the tokenizer {_name(data['spec'])} "
                            f"({shards.tokenizer_identity[:24]}, {shards.vocab_size:,} ids) but the model's is "
                            f"{type(tokenizer).__name__} ({tokenizer.identity()[:24]}, {tokenizer.vocab_size:,} ids); "
                            f"prepare the data with the model's tokenizer (--tokenizer), or give the model the "
                            f"data's: tokenizer: {_recipe_spec(data['spec'], self.path)}")
        if shards.vocab_size > vocab_size:
            raise DataError(f"task tokens: {self.path} holds ids up to {shards.vocab_size - 1} but the model has "
                            f"vocab_size={vocab_size}; set model.vocab_size={shards.vocab_size}")
        for split in (shards.train, shards.val):
            if split.window_count(self.seq_len) < 1:
                raise DataError(f"task tokens: the {split.name} split of {self.path} has {len(split.tokens):,} "
                                f"tokens, not one window of seq_len={self.seq_len} (+1); use a smaller seq_len or "
                                f"more data (for val: a larger --val)")
        self.shards = shards
        self.sampler = WindowSampler(shards.train.window_count(self.seq_len), seed)

    def identity(self) -> str:
        return self._shards().fingerprint

    def _shards(self):
        if self.shards is None:
            from seqzoo.data.shards import DataError

            raise DataError("task tokens: bind() it to the model's tokenizer before reading batches")
        return self.shards

    def batch(self, start: int, size: int) -> dict[str, Tensor]:
        shards = self._shards()
        return self._rows(shards.train, self.sampler.indices(start, size))

    def held_out(self, rows: int, batch_size: int):
        from seqzoo.data.shards import evaluation_windows

        split = self._shards().val
        windows = evaluation_windows(split.window_count(self.seq_len), rows)
        for first in range(0, len(windows), batch_size):
            yield "val", self._rows(split, windows[first:first + batch_size])

    def _rows(self, split, windows) -> dict[str, Tensor]:
        """The rows of ``windows`` (B,) of ``split`` as model inputs."""
        tokens = torch.from_numpy(split.windows(windows, self.seq_len))  # (B, T + 1)
        batch = {"ids": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous()}
        if self.document_mask or self.restart_positions:
            documents = split.document_ids(windows, self.seq_len)  # (B, T)
            if self.document_mask:
                batch["documents"] = torch.from_numpy(documents)
            if self.restart_positions:
                batch["positions"] = torch.from_numpy(_restarted(documents))
        return batch


def _restarted(documents):
    """Positions that count from 0 at each change of document id along a row: (B, T) -> (B, T)."""
    import numpy as np

    t = documents.shape[1]
    index = np.broadcast_to(np.arange(t), documents.shape)
    change = np.ones_like(documents, dtype=bool)
    change[:, 1:] = documents[:, 1:] != documents[:, :-1]
    starts = np.maximum.accumulate(np.where(change, index, 0), axis=1)
    return index - starts


def _name(spec: dict) -> str:
    return spec.get("kind", "?") if isinstance(spec, dict) else str(spec)


def _recipe_spec(spec: dict, folder: str) -> str:
    if spec.get("kind") == "hf":
        spec = {**spec, "path": f"{folder.rstrip('/')}/tokenizer.json"}
    return "{" + ", ".join(f"{k}: {v}" for k, v in spec.items()) + "}"
