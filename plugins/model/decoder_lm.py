"""Decoder-only language model (GPT-2, LLaMA, Mistral, BLOOM): token embedding, a causal
``TransformerStack`` with its position scheme, and an LM head, optionally tied to the embedding."""
from __future__ import annotations

import math

from torch import Tensor, nn

import seqzoo
from seqzoo.attention import AttentionConfig, check_attention
from seqzoo.blocks import Placement, TransformerStack
from seqzoo.cache import KVCache
from seqzoo.errors import InputError
from seqzoo.generation import CausalSession
from seqzoo.init import init_weights
from seqzoo.linear import Linear
from seqzoo.losses import linear_cross_entropy
from seqzoo.schema import Depth, PositiveFloat, Probability, Size, Spec


class DecoderLM(nn.Module):
    """Recipe keys: vocab_size V, dim C, layers, max_seq_len, attention (see AttentionConfig),
    ffn (default gelu), position (default learned), norm (default layernorm), placement (pre|post),
    tie_embeddings (share the LM head with the token embedding; true), embed_norm (a norm right
    after the embeddings, BLOOM; null), scale_embeddings (multiply token embeddings by √C,
    Vaswani/Gemma; false), dropout (embedding and residual dropout; 0), init_std (N(0, init_std)
    weights; 0.02)."""

    #: Where a batch of prompts of different lengths is padded (see ``seqzoo.generate``).
    prompt_padding = "left"

    def __init__(self, vocab_size: Size, dim: Size, layers: Depth,
                 max_seq_len: Size, attention: AttentionConfig, ffn: Spec["ffn"] = "gelu",
                 position: Spec["position"] = "learned", norm: Spec["norm"] = "layernorm",
                 placement: Placement = "pre", tie_embeddings: bool = True,
                 embed_norm: Spec["norm"] | None = None, scale_embeddings: bool = False,
                 dropout: Probability = 0.0, init_std: PositiveFloat = 0.02) -> None:
        super().__init__()
        self.vocab_size, self.dim, self.max_seq_len = vocab_size, dim, max_seq_len
        self.tie_embeddings = tie_embeddings
        self.embed_scale = math.sqrt(dim) if scale_embeddings else 1.0
        self.embed = nn.Embedding(vocab_size, dim)
        self.decoder = TransformerStack(dim, layers, max_seq_len, attention, ffn, norm, position,
                                        placement, dropout, causal=True, embed_norm=embed_norm)
        self.lm_head = Linear(dim, vocab_size, bias=False)
        init_weights(self, init_std, layers, residual_names=("out_proj", "down"))
        self.tie_weights()

    @classmethod
    def check_recipe(cls, model: dict, path: tuple) -> None:
        check_attention(model["attention"], model["dim"], (*path, "attention"))

    def tie_weights(self) -> None:
        if self.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    @property
    def max_positions(self) -> int | None:
        """The most positions the position scheme can encode (a learned table), or None."""
        return self.decoder.position.max_positions

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """An empty KV cache for ``batch`` sequences of up to ``max_len`` tokens."""
        weight = self.embed.weight
        return self.decoder.new_cache(batch, max_len, device=weight.device, dtype=weight.dtype)

    def forward(self, input_ids: Tensor, *, attention_mask: Tensor | None = None,
                positions: Tensor | None = None, cache: KVCache | None = None,
                logits_to_keep: int = 0, targets: Tensor | None = None) -> Tensor:
        """input_ids (B, T) -> logits (B, T, V) (the last ``logits_to_keep`` positions if > 0).

        attention_mask (B, S): 1 for real tokens over all S = cached + T keys (left padding is
        fine: positions then count real tokens only). positions (B|1, T): explicit absolute
        positions. cache: a ``new_cache`` to read and extend. targets (B, T): the next token of
        every position, already shifted (nanoGPT's convention; -100 = no loss) — then the result
        is the mean cross-entropy, computed with the LM head fused in (no (B, T, V) logits).
        """
        x = self.embed(input_ids)  # (B, T, C)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        x = self.decoder(x, attention_mask=attention_mask, positions=positions, cache=cache)
        if targets is not None:
            return linear_cross_entropy(x, self.lm_head.weight, targets, self.lm_head.bias)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return self.lm_head(x)  # (B, T, V)

    def start_generation(self, input_ids: Tensor, max_new_tokens: int, use_cache: bool = True,
                         attention_mask: Tensor | None = None, *, static: bool = False,
                         compile: bool = False) -> CausalSession:
        position = self.decoder.position
        if compile and not position.compiles_statically:
            raise InputError(f"compile=True: the position scheme {type(position).__name__} changes "
                             f"shape from step to step and would recompile every token; decode it "
                             f"eagerly (compile=False)")
        return CausalSession(self, input_ids, max_new_tokens, use_cache, attention_mask,
                             static=static, compile=compile)


@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("model", "decoder_lm", DecoderLM, aliases=("gpt",),
                             summary="decoder-only causal LM (GPT-2, LLaMA, Mistral, BLOOM)")]
