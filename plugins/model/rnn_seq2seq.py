"""Recurrent sequence-to-sequence model (Sutskever et al., 2014) with optional attention
(Bahdanau et al., 2015; Luong et al., 2015).

The encoder is a recurrent stack (optionally bidirectional, its states projected to the decoder's
width). ``attention: none`` is the classic Seq2Seq: the encoder's final state becomes the decoder's
initial state, the only link between the two. ``attention: <score>`` (any registered score —
``additive`` is Bahdanau's, ``dot``/``bilinear`` Luong's) computes a context at every step from the
previous decoder state s_{t−1} over all encoder states:

    c_t = Σ_j softmax_j(score(s_{t−1}, h_j)) h_j,   s_t = cell([e_{t−1}; c_t], s_{t−1}),
    logits_t = W_o tanh(W_r [s_t; c_t; e_{t−1}])

Decoding runs one step at a time because each step's input depends on the previous state; without
attention and with full teacher forcing the whole target goes through the fused kernel at once.
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.builder import Parts
from seqzoo.interfaces import LanguageModel
from seqzoo.nn.init import init_weights
from seqzoo.nn.linear import Linear
from seqzoo.nn.recurrent import RecurrentStack
from seqzoo.registry import builtin
from seqzoo.schema import Depth, NonNegativeInt, PositiveFloat, Probability, SchemaError, Size, Spec, UnitInterval


@builtin("recurrent encoder–decoder, optional Bahdanau/Luong attention")
class RNNSeq2Seq(LanguageModel):
    """Recipe keys: vocab_size V (shared by source and target), dim (embedding width E), hidden
    (state width H), layers (encoder and decoder; 1), cell (gru), bidirectional (encoder; false),
    attention (none, or a score name/mapping; none), dropout (0), teacher_forcing (probability of
    feeding the gold previous token while training, else the model's own argmax; 1.0),
    decoder_start_id (0), tie_embeddings (output layer shares the embedding; false),
    init_std (0.02)."""

    family = "seq2seq"
    prompt_padding = "right"

    def __init__(self, parts: Parts, vocab_size: Size, dim: Size, hidden: Size,
                 layers: Depth = 1, cell: Spec["cell"] = "gru", bidirectional: bool = False,
                 attention: Literal["none"] | Spec["score"] = "none", dropout: Probability = 0.0,
                 teacher_forcing: UnitInterval = 1.0,
                 decoder_start_id: NonNegativeInt = 0, tie_embeddings: bool = False,
                 init_std: PositiveFloat = 0.02) -> None:
        super().__init__()
        self.vocab_size, self.hidden = vocab_size, hidden
        self.teacher_forcing = teacher_forcing
        self.decoder_start_id = decoder_start_id
        self.tie_embeddings = tie_embeddings
        self.embed = nn.Embedding(vocab_size, dim)
        self.drop = nn.Dropout(dropout)
        self.encoder = RecurrentStack(dim, hidden, parts.factory("cell", cell), layers=layers, dropout=dropout,
                                      bidirectional=bidirectional)
        directions = 2 if bidirectional else 1
        # A bidirectional encoder's states are 2H wide: project them to the decoder's H.
        self.memory_proj = Linear(directions * hidden, hidden) if bidirectional else None
        self.bridge = Linear(directions * hidden, hidden) if bidirectional else None
        self.attention = None
        context = 0
        if attention != "none":
            self.attention = parts.make("score", attention, hidden, hidden, 1)
            context = hidden
        self.decoder = RecurrentStack(dim + context, hidden, parts.factory("cell", cell), layers=layers,
                                      dropout=dropout)
        self.readout = Linear(hidden + context + dim, dim)
        self.lm_head = Linear(dim, vocab_size, bias=False)
        init_weights(self, init_std, branches=1)  # no residual stream
        self.tie_weights()
        self.records_alignment = self.attention is not None  # last_alignment: (B, T, S), for the plots

    @classmethod
    def check_recipe(cls, model: dict, path: tuple, validator: object = None) -> None:
        if model["decoder_start_id"] >= model["vocab_size"]:
            raise SchemaError((*path, "decoder_start_id"),
                              f"{model['decoder_start_id']} is not a token id (vocab_size={model['vocab_size']})")

    def shard_units(self) -> list[nn.Module]:
        return [self.encoder, self.decoder]

    def tie_weights(self) -> None:
        if self.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    # -- encoder -----------------------------------------------------------------------------------
    def encode(self, src_ids: Tensor, src_lengths: Tensor | None = None):
        """src_ids (B, S) -> (memory (B, S, H), memory mask (B, S) or None, decoder initial state)."""
        outputs, states = self.encoder(self.drop(self.embed(src_ids)), None, src_lengths)
        if self.memory_proj is not None:
            outputs = self.memory_proj(outputs)
        mask = None
        if src_lengths is not None:
            steps = torch.arange(src_ids.shape[1], device=src_ids.device)[None]
            mask = steps < src_lengths.to(src_ids.device)[:, None]
        return outputs, mask, self._bridge(states)

    def _bridge(self, states: list):
        """Encoder final states -> decoder initial states, layer by layer. Bidirectional: the two
        directions' states are concatenated and projected (each part of an LSTM state alike)."""
        if self.bridge is None:
            return [directions[0] for directions in states]
        merged = []
        for forward, backward in states:
            if isinstance(forward, tuple):
                merged.append(tuple(self.bridge(torch.cat(p, dim=-1)) for p in zip(forward, backward)))
            else:
                merged.append(self.bridge(torch.cat([forward, backward], dim=-1)))
        return merged

    # -- decoder -----------------------------------------------------------------------------------
    def _context(self, state: list, memory: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """c_t from the previous top-layer state s_{t−1}: -> context (B, H), weights (B, S)."""
        query = RecurrentStack.output(state[-1])[:, None, None, :]  # (B, 1, 1, H)
        keys = memory[:, None]  # (B, 1, S, H)
        logits = self.attention.scores(query, keys)[:, 0, 0].float()  # (B, S)
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        weights = logits.softmax(-1).to(memory.dtype)
        return (weights[:, None] @ memory)[:, 0], weights

    def step(self, prev_tokens: Tensor, state: list, memory: Tensor, mask: Tensor | None):
        """One decoder step: prev_tokens (B,) -> (logits (B, V), new state, weights (B, S) | None)."""
        embedded = self.drop(self.embed(prev_tokens))  # (B, E)
        parts, weights = [embedded], None
        if self.attention is not None:
            context, weights = self._context(state, memory, mask)
            parts = [embedded, context]
        out, state = self.decoder(torch.cat(parts, dim=-1)[:, None], state)  # (B, 1, H)
        s_t = self.drop(out[:, 0])
        features = [s_t, *parts[1:], embedded]
        logits = self.lm_head(torch.tanh(self.readout(torch.cat(features, dim=-1))))
        return logits, state, weights

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, src_lengths: Tensor | None = None,
                src_mask: Tensor | None = None) -> Tensor:
        """Logits for tgt_ids (B, T) given src_ids (B, S) -> (B, T, V). tgt_ids are the decoder
        inputs (start token first); while training, each step feeds the gold token with
        probability ``teacher_forcing``, else the previous step's argmax. Source padding (right)
        is given as src_lengths (B,) or, as for ``encoder_decoder``, src_mask (B, S)."""
        if src_lengths is None and src_mask is not None:
            src_lengths = src_mask.long().sum(-1)
        memory, mask, state = self.encode(src_ids, src_lengths)
        sampled = self.training and self.teacher_forcing < 1.0
        if self.attention is None and not sampled:
            return self._decode_teacher_forced(tgt_ids, state)
        logits, weights = [], []
        prev = tgt_ids[:, 0]
        for t in range(tgt_ids.shape[1]):
            step_logits, state, step_weights = self.step(prev, state, memory, mask)
            logits.append(step_logits)
            weights.append(step_weights)
            if t + 1 < tgt_ids.shape[1]:
                prev = tgt_ids[:, t + 1]
                if sampled:
                    own = step_logits.argmax(-1)
                    gold = torch.rand(prev.shape, device=prev.device) < self.teacher_forcing
                    prev = torch.where(gold, prev, own)
        if self.attention is not None:
            self.last_alignment = torch.stack(weights, dim=1).detach()  # (B, T, S)
        return torch.stack(logits, dim=1)

    def _decode_teacher_forced(self, tgt_ids: Tensor, state: list) -> Tensor:
        """Without attention every decoder input is known: one fused pass over the target."""
        embedded = self.drop(self.embed(tgt_ids))  # (B, T, E)
        out, _ = self.decoder(embedded, state)
        features = torch.cat([self.drop(out), embedded], dim=-1)
        return self.lm_head(torch.tanh(self.readout(features)))

    def loss(self, logits: Tensor, target: Tensor, pad_id: int | None = None) -> Tensor:
        """Cross-entropy of logits (B, T, V) against target (B, T), ignoring ``pad_id``."""
        return F.cross_entropy(logits.flatten(0, 1), target.flatten(),
                               ignore_index=-100 if pad_id is None else pad_id)

    def start_generation(self, src_ids: Tensor, max_new_tokens: int, use_cache: bool = True,
                         attention_mask: Tensor | None = None) -> "RecurrentSeq2SeqSession":
        lengths = attention_mask.long().sum(-1) if attention_mask is not None else None
        return RecurrentSeq2SeqSession(self, src_ids, lengths, use_cache)


class RecurrentSeq2SeqSession:
    """Decoding state: the source encoded once and the decoder state (cached), or the whole
    target so far decoded again every step (uncached, the reference)."""

    def __init__(self, model: RNNSeq2Seq, src_ids: Tensor, src_lengths: Tensor | None,
                 use_cache: bool) -> None:
        self.model, self.use_cache = model, use_cache
        self.memory, self.mask, self.initial = model.encode(src_ids, src_lengths)
        self.state = self.initial
        self.prefix = self.ids = torch.full((src_ids.shape[0], 1), model.decoder_start_id,
                                            dtype=torch.long, device=src_ids.device)
        self.weights: list[Tensor] = []

    def next(self, tokens: Tensor | None) -> Tensor:
        if tokens is not None:
            self.ids = torch.cat([self.ids, tokens[:, None]], dim=1)
        if not self.use_cache:
            state = self.initial
            for t in range(self.ids.shape[1]):
                logits, state, _ = self.model.step(self.ids[:, t], state, self.memory, self.mask)
            return logits.float()
        logits, self.state, weights = self.model.step(self.ids[:, -1], self.state, self.memory, self.mask)
        if weights is not None:
            self.weights.append(weights)
            self.model.last_alignment = torch.stack(self.weights, dim=1)
        return logits.float()

    def reorder(self, rows: Tensor) -> None:
        self.ids = self.ids.index_select(0, rows)
        self.memory = self.memory.index_select(0, rows)
        if self.mask is not None:
            self.mask = self.mask.index_select(0, rows)
        self.initial = RecurrentStack.reorder_state(self.initial, rows)
        self.state = RecurrentStack.reorder_state(self.state, rows)
        self.weights = [w.index_select(0, rows) for w in self.weights]
