"""The model contract: what ``build``, ``load`` and ``from_hf`` attach to a model and what
``save``, ``generate``, ``to_hf`` and the plots read from it."""
from __future__ import annotations

from typing import ClassVar, Literal, Protocol

from torch import Tensor, nn


class DecodeSession(Protocol):
    """One generation in progress (``LanguageModel.start_generation``): the decoding state of a
    batch, fed the tokens chosen at each step."""

    #: (B, T0): what every output row starts with — the prompt (causal models) or the decoder
    #: start token (seq2seq models).
    prefix: Tensor

    def next(self, tokens: Tensor | None) -> Tensor:
        """tokens (B,) chosen at the last step, or None for the first -> next logits (B, V)."""
        ...

    def reorder(self, rows: Tensor) -> None:
        """Keep batch rows ``rows`` (B',) in that order (beam search follows its beams)."""
        ...


class Model(nn.Module):
    """Every model a recipe builds (kind ``model``): what ``build``, ``load`` and ``from_hf``
    attach to it, and what ``save``, ``generate``, ``to_hf`` and the plots read, declared here
    (nothing is probed with ``hasattr``). ``LanguageModel`` and ``MaskedLanguageModel`` refine it.

    Constructor: ``(parts, **params)``. ``parts`` is the builder (``seqzoo.builder.Parts``) that
    turns the specs among the recipe's keys into modules: ``parts.stack(section, causal=True)``,
    ``parts.make("norm", spec, dim)``, ``parts.factory("cell", spec)``.
    """

    #: The resolved recipe the model was built from (``seqzoo.build`` sets it; ``save`` stores it).
    recipe: dict | None = None
    #: The tokenizer's serialised form when it has one (a tokenizer.json text), carried from a
    #: checkpoint or a Hugging Face folder so no file outside is needed; else None.
    tokenizer_state: str | None = None
    #: Which plugin, distribution and version provided each component the recipe names.
    components: dict | None = None
    #: ``causal`` (decoder-only), ``seq2seq`` (a source, then a decoder) or ``encoder``
    #: (bidirectional: hidden states, a masked-LM head).
    family: ClassVar[Literal["causal", "seq2seq", "encoder"]] = "encoder"
    #: Whether decoding records a source–target alignment in ``last_alignment`` (B, T, S): a
    #: recurrent seq2seq with an attention score (Bahdanau, Luong); Transformers' maps are read
    #: from their attention modules instead.
    records_alignment: bool = False
    last_alignment: Tensor | None = None

    @classmethod
    def check_recipe(cls, model: dict, path: tuple, validator) -> None:
        """Cross-field rules of the model section (``dim % heads``, per-layer patterns), run by
        recipe validation after each key is checked; raise ``SchemaError`` at the key that is
        wrong. Default: none."""

    @property
    def max_positions(self) -> int | None:
        """The most positions the model can read (a learned position table), or None."""
        return None

    def shard_units(self) -> list[nn.Module]:
        """The model's layers: FSDP shards them one by one before the whole model, and an optimizer
        that treats hidden matrices apart (Muon) takes its matrices from them alone — what lies
        outside (embeddings, the LM head, a pooler) trains with AdamW. Default: none."""
        return []


class LanguageModel(Model):
    """What ``seqzoo.generate``, beam search, ``seqzoo train`` and FSDP wrapping rely on in a
    model that generates text. The built-in ``decoder_lm``, ``encoder_decoder``, ``rnn_lm`` and
    ``rnn_seq2seq`` subclass it; a plugin's model subclasses it to be generated from and trained.

    ``forward`` takes the family's inputs — ``(input_ids, *, attention_mask=None, ...)`` for causal
    models, ``(src_ids, tgt_ids, src_mask=None)`` for seq2seq ones — and returns logits (B, T, V),
    or with ``targets=`` (when ``fused_loss``) the mean cross-entropy against them — and, given
    ``label_smoothing=ε`` and ``z_loss=λ`` (keywords the trainer passes only when not 0), the
    training objective (1 − ε)·CE + ε·mean over the vocabulary of −log p + λ·log²Z
    (``seqzoo.nn.losses``), still without the full logits.
    """

    #: ``causal``: the output continues the input (decoder-only); ``seq2seq``: the input is a
    #: source and the output starts with ``decoder_start_id``.
    family: ClassVar[Literal["causal", "seq2seq"]] = "causal"
    #: The first decoder token of seq2seq models.
    decoder_start_id: int = 0
    #: Where a batch of prompts of different lengths is padded: ``left``, ``right``, or None when
    #: the model cannot mask padding (prompts are then batched by length).
    prompt_padding: Literal["left", "right"] | None = "left"
    #: Whether ``forward`` takes ``targets=`` (and ``label_smoothing=``, ``z_loss=``) and returns the
    #: loss with the LM head fused in.
    fused_loss: bool = False
    #: Whether ``start_generation`` takes ``static``/``compile`` (a static KV cache, compiled steps).
    supports_compile: bool = False
    #: Whether ``forward`` takes ``documents=`` (B, T): ids of the packed documents each token
    #: belongs to, so no token attends across a document boundary (token-shard training).
    supports_documents: bool = False

    def start_generation(self, input_ids: Tensor, max_new_tokens: int, use_cache: bool = True,
                         attention_mask: Tensor | None = None, **options: bool) -> DecodeSession:
        """A decoding session for ``input_ids`` (B, T) and up to ``max_new_tokens`` new tokens;
        ``attention_mask`` (B, T) marks real tokens; ``options``: ``static``, ``compile`` (only
        when ``supports_compile``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement start_generation(...)")

    def tie_weights(self) -> None:
        """Re-tie shared weights (the LM head and the embedding) after a move or a load."""


class MaskedLanguageModel(Model):
    """What ``seqzoo.fill_mask`` and the masked-LM objective of ``seqzoo train`` rely on in a
    bidirectional model (the built-in ``encoder``; a plugin's model subclasses it to be trained
    and queried the same way).

    ``forward(input_ids, attention_mask=None, token_type_ids=None, *, head=False, select=None)``
    returns the hidden states (B, T, C); with ``head=True`` the masked-LM logits (B, T, V), or
    (N, V) at the N positions where ``select`` (B, T) is true (training scores only those).
    ``attention_mask`` (B, T) is 1 for real tokens.
    """

    #: Whether the model has a masked-LM head (an encoder built without one predicts nothing).
    has_mlm_head: bool = False
