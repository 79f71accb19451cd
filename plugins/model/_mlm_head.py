"""The masked-LM head of the ``encoder`` (BERT, Devlin et al., 2019): a transform, then a decoder
tied to the token embedding with a bias of its own,

    logits = LN(act(W h + b)) Eᵀ + b_V,

where E (V, C) is the token embedding. BERT's ``cls.predictions``, RoBERTa's ``lm_head`` and
ModernBERT's ``head`` + ``decoder`` all have this form; they differ only in the activation and in
which biases they keep.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.builder import Parts
from seqzoo.nn.linear import Linear
from seqzoo.schema import Spec


@dataclass(frozen=True)
class MaskedLMHeadConfig:
    """The ``mlm_head:`` section of an ``encoder`` recipe (``{}`` takes every default).

    activation: the transform's activation (gelu; BERT uses its ``hidden_act``, RoBERTa always the
    exact gelu). bias: a bias on the transform's dense layer (true; ModernBERT's
    ``classifier_bias``). norm: the transform's norm (null = the model's ``norm``). decoder_bias:
    the output bias b_V, one per token (true).
    """

    activation: Spec["activation"] = "gelu"  # noqa: F821
    bias: bool = True
    norm: Spec["norm"] | None = None  # noqa: F821
    decoder_bias: bool = True


class MaskedLMHead(nn.Module):
    """Submodules ``dense`` (C -> C), ``activation``, ``norm``; parameter ``bias`` (V,) or None.
    The decoder weight is the token embedding, passed to ``forward``: nothing here ties or
    re-ties, so moves, loads and parameter counts see one shared tensor."""

    def __init__(self, dim: int, vocab_size: int, activation: nn.Module, norm: nn.Module, *, bias: bool = True,
                 decoder_bias: bool = True) -> None:
        super().__init__()
        self.dense = Linear(dim, dim, bias=bias)
        self.activation = activation
        self.norm = norm
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if decoder_bias else None

    @classmethod
    def build(cls, parts: Parts, dim: int, vocab_size: int, config: MaskedLMHeadConfig,
              model_norm: Spec["norm"]) -> MaskedLMHead:  # noqa: F821
        """The head an ``mlm_head:`` section describes (its norm defaults to the model's)."""
        norm = config.norm if config.norm is not None else model_norm
        return cls(dim, vocab_size, parts.make("activation", config.activation), parts.make("norm", norm, dim),
                   bias=config.bias, decoder_bias=config.decoder_bias)

    def forward(self, hidden: Tensor, embedding: Tensor) -> Tensor:
        """hidden (..., C), embedding E (V, C) -> logits (..., V)."""
        return F.linear(self.norm(self.activation(self.dense(hidden))), embedding, self.bias)
