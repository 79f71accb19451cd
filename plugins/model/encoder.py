"""Bidirectional Transformer encoder (BERT, Devlin et al., 2019): token + position + token-type
embeddings, a non-causal ``TransformerStack`` (post-norm in BERT) and an optional pooler,
tanh(W h_[CLS] + b)."""
from __future__ import annotations

import torch
from torch import Tensor, nn

import seqzoo
from seqzoo.nn.attention import AttentionConfig, check_attention
from seqzoo.nn.blocks import Placement, Residual
from seqzoo.nn.init import init_weights
from seqzoo.nn.layers import build_stack, check_layers
from seqzoo.schema import Depth, NonNegativeInt, PositiveFloat, Probability, Size, Spec, Validator


class Encoder(nn.Module):
    """Recipe keys: vocab_size V, dim C, layers, max_seq_len, attention, ffn (gelu), position
    (learned), norm (layernorm), placement (post), type_vocab_size (token types; 2, 0 = none),
    embed_norm (norm after the summed embeddings; BERT's LayerNorm; null), pooler (true),
    dropout (0), init_std (0.02); mixer, residual, layer_types, pattern, layer_overrides as in
    ``decoder_lm`` (recurrent mixers are causal and cannot serve an encoder)."""

    def __init__(self, vocab_size: Size, dim: Size, layers: Depth,
                 max_seq_len: Size, attention: AttentionConfig, ffn: Spec["ffn"] = "gelu",
                 position: Spec["position"] = "learned", norm: Spec["norm"] = "layernorm",
                 placement: Placement = "post", type_vocab_size: NonNegativeInt = 2,
                 embed_norm: Spec["norm"] | None = None, pooler: bool = True,
                 dropout: Probability = 0.0, init_std: PositiveFloat = 0.02,
                 mixer: Spec["mixer"] | None = None, residual: Residual = "sequential",
                 layer_types: dict[str, dict] | None = None, pattern: list[str] | None = None,
                 layer_overrides: dict | None = None) -> None:
        super().__init__()
        self.vocab_size, self.dim = vocab_size, dim
        self.embed = nn.Embedding(vocab_size, dim)
        self.token_type = nn.Embedding(type_vocab_size, dim) if type_vocab_size else None
        self.encoder = build_stack(dict(
            dim=dim, layers=layers, max_seq_len=max_seq_len, attention=attention, ffn=ffn, position=position,
            norm=norm, placement=placement, residual=residual, mixer=mixer, embed_norm=embed_norm,
            dropout=dropout, layer_types=layer_types, pattern=pattern, layer_overrides=layer_overrides), causal=False)
        self.pooler = nn.Linear(dim, dim) if pooler else None
        init_weights(self, init_std, layers, residual_names=("out_proj", "down"))

    @classmethod
    def check_recipe(cls, model: dict, path: tuple, validator: Validator) -> None:
        check_attention(model["attention"], model["dim"], (*path, "attention"))
        check_layers(model, path, validator, causal=False)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> Tensor:
        """input_ids (B, T) -> hidden states (B, T, C). attention_mask (B, T): 1 for real tokens
        (padding keys are hidden from every query). token_type_ids (B, T): segment ids (0)."""
        x = self.embed(input_ids)  # (B, T, C)
        if self.token_type is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type(token_type_ids)
        # BERT numbers positions 0..T-1 whatever the padding (right padding leaves real tokens
        # where they are).
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        return self.encoder(x, attention_mask=attention_mask, positions=positions)

    def pool(self, hidden: Tensor) -> Tensor:
        """BERT's pooler on the first token: hidden (B, T, C) -> (B, C)."""
        if self.pooler is None:
            raise seqzoo.InputError("this encoder was built with pooler: false; it has no pooled output")
        return torch.tanh(self.pooler(hidden[:, 0]))


@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("model", "encoder", Encoder, aliases=("bert",),
                             summary="bidirectional encoder with token types and pooler (BERT)")]
