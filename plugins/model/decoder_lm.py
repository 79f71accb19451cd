"""Decoder-only language model (GPT-2, LLaMA, Mistral, BLOOM): token embedding, position scheme,
a stack of causal self-attention blocks, a final norm (pre-norm) and an LM head, optionally tied
to the embedding."""
from __future__ import annotations

import torch
from torch import Tensor, nn

import seqzoo
from seqzoo.attention import AttentionConfig, check_attention, self_attention_inputs
from seqzoo.blocks import Placement, TransformerBlock
from seqzoo.cache import KVCache
from seqzoo.errors import InputError
from seqzoo.generation import CausalSession
from seqzoo.init import init_weights
from seqzoo.schema import PositiveFloat, PositiveInt, Probability, Spec


class DecoderLM(nn.Module):
    """Recipe keys: vocab_size V, dim C, layers, max_seq_len, attention (see AttentionConfig),
    ffn (default gelu), position (default learned), norm (default layernorm), placement (pre|post),
    tie_embeddings (share the LM head with the token embedding; true), dropout (embedding and
    residual dropout; 0), init_std (N(0, init_std) weights; 0.02)."""

    def __init__(self, vocab_size: PositiveInt, dim: PositiveInt, layers: PositiveInt,
                 max_seq_len: PositiveInt, attention: AttentionConfig, ffn: Spec["ffn"] = "gelu",
                 position: Spec["position"] = "learned", norm: Spec["norm"] = "layernorm",
                 placement: Placement = "pre", tie_embeddings: bool = True,
                 dropout: Probability = 0.0, init_std: PositiveFloat = 0.02) -> None:
        super().__init__()
        reg = seqzoo.registry()
        self.vocab_size, self.dim, self.max_seq_len = vocab_size, dim, max_seq_len
        self.heads = attention.heads
        self.kv_heads = attention.kv_heads or attention.heads
        self.head_dim = attention.head_dim or dim // attention.heads
        self.window = attention.window
        self.tie_embeddings = tie_embeddings
        self.embed = nn.Embedding(vocab_size, dim)
        self.position = reg.create("position", position, dim, self.head_dim, self.heads, max_seq_len)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(dim, attention, ffn, norm, placement, dropout) for _ in range(layers)
        )
        # Post-norm blocks end in a norm already; pre-norm stacks need one before the head.
        self.final_norm = reg.create("norm", norm, dim) if placement == "pre" else nn.Identity()
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        init_weights(self, init_std, layers, residual_names=("out_proj", "down"))
        self.tie_weights()

    @classmethod
    def check_recipe(cls, model: dict, path: tuple) -> None:
        check_attention(model["attention"], model["dim"], (*path, "attention"))

    def tie_weights(self) -> None:
        if self.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """An empty KV cache for ``batch`` sequences of up to ``max_len`` tokens."""
        weight = self.embed.weight
        return KVCache(len(self.blocks), batch, self.kv_heads, self.head_dim, max_len,
                       device=weight.device, dtype=weight.dtype)

    def forward(self, input_ids: Tensor, *, attention_mask: Tensor | None = None,
                positions: Tensor | None = None, cache: KVCache | None = None,
                logits_to_keep: int = 0) -> Tensor:
        """input_ids (B, T) -> logits (B, T, V) (the last ``logits_to_keep`` positions if > 0).

        attention_mask (B, S): 1 for real tokens over all S = cached + T keys (left padding is
        fine: positions then count real tokens only). positions (B|1, T): explicit absolute
        positions. cache: a ``new_cache`` to read and extend.
        """
        b, t = input_ids.shape
        past = cache.length if cache is not None else 0
        if cache is not None:
            cache.check_room(t)
        if positions is None:
            if attention_mask is not None:
                positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -t:]
            else:
                positions = torch.arange(past, past + t, device=input_ids.device)[None]
        limit = self.position.max_positions
        if limit is not None and past + t > limit:
            raise InputError(f"sequence of {past + t} tokens exceeds the {limit} positions of "
                             f"the learned position table (model.max_seq_len={limit})")
        x = self.drop(self.position.embed(self.embed(input_ids), positions))  # (B, T, C)
        inputs = self_attention_inputs(self.position, positions, causal=True, cache=cache,
                                       key_padding=attention_mask, window=self.window)
        for layer, block in enumerate(self.blocks):
            x = block(x, inputs, layer)
        if cache is not None:
            cache.advance(positions)
        x = self.final_norm(x)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return self.lm_head(x)  # (B, T, V)

    def start_generation(self, input_ids: Tensor, max_new_tokens: int, use_cache: bool = True,
                         attention_mask: Tensor | None = None) -> CausalSession:
        return CausalSession(self, input_ids, max_new_tokens, use_cache, attention_mask)


@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("model", "decoder_lm", DecoderLM, aliases=("gpt",),
                             summary="decoder-only causal LM (GPT-2, LLaMA, Mistral, BLOOM)")]
