"""Bidirectional Transformer encoder (BERT, Devlin et al., 2019): token + position + token-type
embeddings, a non-causal ``TransformerStack`` (post-norm in BERT), an optional pooler,
tanh(W h_[CLS] + b), and an optional masked-LM head, LN(act(W h + b)) Eᵀ + b_V (tied to the token
embedding E)."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

import seqzoo
from seqzoo.builder import Parts, check_layers, stack_section
from seqzoo.interfaces import MaskedLanguageModel
from seqzoo.nn.attention import AttentionConfig
from seqzoo.nn.blocks import Placement, Residual
from seqzoo.nn.init import init_weights
from seqzoo.registry import builtin
from seqzoo.schema import Depth, NonNegativeInt, PositiveFloat, Probability, SchemaError, Size, Spec, Validator

from ._mlm_head import MaskedLMHead, MaskedLMHeadConfig


@builtin("bidirectional encoder with token types and pooler (BERT)", aliases=("bert",))
class Encoder(MaskedLanguageModel):
    """Recipe keys: vocab_size V, dim C, layers, max_seq_len, attention, ffn (gelu), position
    (learned), norm (layernorm), placement (post), type_vocab_size (token types; 2, 0 = none),
    embed_norm (norm after the summed embeddings; BERT's LayerNorm; null), pooler (true),
    dropout (0), init_std (0.02); mixer, residual, residual_multiplier, layer_types, pattern,
    layer_overrides as in ``decoder_lm`` (recurrent mixers are causal and cannot serve an encoder).

    mlm_head: the masked-LM head, a ``MaskedLMHeadConfig`` section (``{}`` = BERT's: dense, gelu,
    the model's norm, a decoder tied to the token embedding with its own bias), or null for none
    (the default). padding_idx: RoBERTa's position numbering (fairseq's ``make_positions``): real
    tokens get positions padding_idx + 1, padding_idx + 2, ... counting only tokens that are not
    padding_idx, and padding tokens get padding_idx itself, whatever the attention mask (so left
    padding shifts nothing); the table then needs max_seq_len = T + padding_idx + 1 rows (514 for
    512 tokens). null: positions 0..T-1 (BERT).

    ``model(ids)`` gives hidden states (B, T, C); ``model(ids, head=True)`` or
    ``model.mlm_logits(ids)`` the masked-LM logits (B, T, V); ``model.pool(hidden)`` the pooler.
    """

    def __init__(self, parts: Parts, vocab_size: Size, dim: Size, layers: Depth,
                 max_seq_len: Size, attention: AttentionConfig, ffn: Spec["ffn"] | None = "gelu",
                 position: Spec["position"] = "learned", norm: Spec["norm"] = "layernorm",
                 placement: Placement = "post", type_vocab_size: NonNegativeInt = 2,
                 embed_norm: Spec["norm"] | None = None, pooler: bool = True,
                 dropout: Probability = 0.0, init_std: PositiveFloat = 0.02,
                 mixer: Spec["mixer"] | None = None, residual: Residual = "sequential",
                 layer_types: dict[str, dict] | None = None, pattern: list[str] | None = None,
                 layer_overrides: dict[str, Any] | None = None, mlm_head: MaskedLMHeadConfig | None = None,
                 residual_multiplier: PositiveFloat = 1.0,
                 padding_idx: NonNegativeInt | None = None) -> None:
        super().__init__()
        self.vocab_size, self.dim = vocab_size, dim
        self.padding_idx = padding_idx
        self.embed = nn.Embedding(vocab_size, dim)
        self.token_type = nn.Embedding(type_vocab_size, dim) if type_vocab_size else None
        self.encoder = parts.stack(stack_section(locals()), causal=False)
        self.pooler = nn.Linear(dim, dim) if pooler else None
        self.mlm_head = MaskedLMHead.build(parts, dim, vocab_size, mlm_head, norm) if mlm_head is not None else None
        init_weights(self, init_std, self.encoder.residual_branches)

    @property
    def has_mlm_head(self) -> bool:
        return self.mlm_head is not None

    @property
    def max_positions(self) -> int | None:
        """The most tokens a sequence may have: the position table's rows, less RoBERTa's offset."""
        rows = self.encoder.position.max_positions
        return rows if rows is None or self.padding_idx is None else rows - self.padding_idx - 1

    def shard_units(self) -> list[nn.Module]:
        """The submodules FSDP shards one by one (each layer) before the whole model."""
        return list(self.encoder.blocks)

    @classmethod
    def check_recipe(cls, model: dict, path: tuple, validator: Validator) -> None:
        check_layers(model, path, validator, causal=False)
        pad = model.get("padding_idx")
        if pad is not None and pad >= model["vocab_size"]:
            raise SchemaError((*path, "padding_idx"), f"padding_idx={pad} must be a token id below "
                                                      f"vocab_size={model['vocab_size']}")
        if pad is not None and model["max_seq_len"] <= pad + 1:
            raise SchemaError((*path, "max_seq_len"), f"max_seq_len={model['max_seq_len']} leaves no "
                                                      f"position after padding_idx={pad}; needs > {pad + 1}")

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, *, head: bool = False,
                select: Tensor | None = None) -> Tensor:
        """input_ids (B, T) -> hidden states (B, T, C). attention_mask (B, T): 1 for real tokens
        (padding keys are hidden from every query). token_type_ids (B, T): segment ids (0).

        head: return the masked-LM logits (B, T, V) instead; with ``select`` (B, T) bool, only
        those of the N selected positions, (N, V) in row-major order (masked-LM training scores
        the masked 15% and skips the head's product for the rest)."""
        x = self.embed(input_ids)  # (B, T, C)
        if self.token_type is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type(token_type_ids)
        hidden = self.encoder(x, attention_mask=attention_mask, positions=self.positions(input_ids))
        if not head:
            return hidden
        if self.mlm_head is None:
            raise seqzoo.InputError("this encoder was built without an MLM head (model.mlm_head: null); "
                                    "it has no masked-LM logits — build it with mlm_head: {}")
        if select is not None:
            hidden = hidden[select]  # (N, C)
        return self.mlm_head(hidden, self.embed.weight)  # (B, T, V) or (N, V)

    def positions(self, input_ids: Tensor) -> Tensor:
        """Absolute positions (B|1, T) of input_ids (B, T): 0..T-1 (BERT), whatever the padding
        (right padding leaves real tokens where they are), or with ``padding_idx`` RoBERTa's
        padding_idx + (the count of real tokens so far) at real tokens and padding_idx at padding."""
        t = input_ids.shape[1]
        if self.padding_idx is None:
            return torch.arange(t, device=input_ids.device)[None]
        rows = self.encoder.position.max_positions
        if rows is not None and t + self.padding_idx + 1 > rows:
            raise seqzoo.InputError(
                f"sequence of {t} tokens needs positions up to {t + self.padding_idx} (they start after "
                f"padding_idx={self.padding_idx}), past the {rows} rows of the position table "
                f"(model.max_seq_len={rows}); give at most {rows - self.padding_idx - 1} tokens")
        real = input_ids.ne(self.padding_idx).long()
        return real.cumsum(1) * real + self.padding_idx

    def mlm_logits(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                   token_type_ids: Tensor | None = None) -> Tensor:
        """The masked-LM logits (B, T, V) of input_ids (B, T): ``forward(..., head=True)``."""
        return self(input_ids, attention_mask, token_type_ids, head=True)

    def pool(self, hidden: Tensor) -> Tensor:
        """BERT's pooler on the first token: hidden (B, T, C) -> (B, C)."""
        if self.pooler is None:
            raise seqzoo.InputError("this encoder was built with pooler: false; it has no pooled output")
        return torch.tanh(self.pooler(hidden[:, 0]))
