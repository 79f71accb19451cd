"""Decoder-only language model (GPT-2, LLaMA, Mistral, BLOOM): token embedding, a causal
``TransformerStack`` with its position scheme, and an LM head, optionally tied to the embedding."""
from __future__ import annotations

import math
from typing import Any

from torch import Tensor, nn

from seqzoo.builder import Parts, check_layers, stack_section
from seqzoo.errors import InputError
from seqzoo.functional import softcap
from seqzoo.interfaces import LanguageModel
from seqzoo.nn.attention import AttentionConfig
from seqzoo.nn.blocks import Placement, Residual
from seqzoo.nn.cache import DecodeCache
from seqzoo.nn.generation import CausalSession
from seqzoo.nn.init import init_weights
from seqzoo.nn.linear import Linear
from seqzoo.nn.losses import cross_entropy, linear_cross_entropy
from seqzoo.nn.shared import SharedBlockConfig
from seqzoo.registry import builtin
from seqzoo.schema import Depth, PositiveFloat, Probability, Size, Spec, Validator


@builtin("decoder-only causal LM (GPT-2, LLaMA, Mistral, BLOOM)", aliases=("gpt",))
class DecoderLM(LanguageModel):
    """Recipe keys: vocab_size V, dim C, layers, max_seq_len, attention (see AttentionConfig; null
    when no layer attends, as in a pure Mamba stack),
    ffn (default gelu; null: layers without one, as Mamba's), position (default learned), norm
    (default layernorm), placement (pre|post),
    tie_embeddings (share the LM head with the token embedding; true), embed_norm (a norm right
    after the embeddings, BLOOM; null), scale_embeddings (multiply token embeddings by √C,
    Vaswani/Gemma; the factor rounded to the weights' dtype first, as Gemma does; false), dropout
    (embedding and residual dropout; 0), init_std (N(0, init_std) weights; 0.02). mixer: the token
    mixer (null = attention, configured by ``attention``; e.g. {kind: recurrent, cell: gru}).
    residual: sequential | parallel | parallel_shared (GPT-NeoX, GPT-J). final_softcap: cap the
    logits at c·tanh(z/c) (Gemma 2; null). layer_types, pattern, layer_overrides: per-layer parts
    (see ``seqzoo.builder.plan``). The μP multipliers of Granite and Falcon-H1, 1 by default:
    embedding_multiplier (the token embeddings, after any √C scale), residual_multiplier (each
    sublayer's output as it joins the residual stream; also per layer), logits_multiplier (the
    logits, before any final softcap; Granite's 1 / logits_scaling, Falcon-H1's lm_head_multiplier).
    shared_blocks: attention + FFN blocks whose weights the layers naming them (``shared_block: i``
    in a layer type) share, each site with adapters of its own (Zamba2; see SharedBlockConfig)."""

    prompt_padding = "left"
    fused_loss = True
    supports_compile = True
    supports_documents = True

    def __init__(self, parts: Parts, vocab_size: Size, dim: Size, layers: Depth,
                 max_seq_len: Size, attention: AttentionConfig | None = None, ffn: Spec["ffn"] | None = "gelu",
                 position: Spec["position"] = "learned", norm: Spec["norm"] = "layernorm",
                 placement: Placement = "pre", tie_embeddings: bool = True,
                 embed_norm: Spec["norm"] | None = None, scale_embeddings: bool = False,
                 dropout: Probability = 0.0, init_std: PositiveFloat = 0.02,
                 mixer: Spec["mixer"] | None = None, residual: Residual = "sequential",
                 final_softcap: PositiveFloat | None = None, layer_types: dict[str, dict] | None = None,
                 pattern: list[str] | None = None, layer_overrides: dict[str, Any] | None = None,
                 embedding_multiplier: PositiveFloat = 1.0, residual_multiplier: PositiveFloat = 1.0,
                 logits_multiplier: PositiveFloat = 1.0, shared_blocks: list[SharedBlockConfig] | None = None) -> None:
        super().__init__()
        self.vocab_size, self.dim, self.max_seq_len = vocab_size, dim, max_seq_len
        self.tie_embeddings = tie_embeddings
        self.embed_scale = math.sqrt(dim) if scale_embeddings else 1.0
        self.embedding_multiplier, self.logits_multiplier = embedding_multiplier, logits_multiplier
        self.final_softcap = final_softcap
        self.embed = nn.Embedding(vocab_size, dim)
        self.decoder = parts.stack(stack_section(locals()), causal=True)
        # A tied head's own weight would be made, initialised and thrown away: a transient as large
        # as the embedding (half a GB for BLOOM's vocabulary). It takes the embedding's at once.
        self.lm_head = Linear(dim, vocab_size, bias=False, device="meta" if tie_embeddings else None)
        self.tie_weights()
        init_weights(self, init_std, self.decoder.residual_branches)

    @classmethod
    def check_recipe(cls, model: dict, path: tuple, validator: Validator) -> None:
        check_layers(model, path, validator)

    def tie_weights(self) -> None:
        if self.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def shard_units(self) -> list[nn.Module]:
        return list(self.decoder.blocks)

    @property
    def max_positions(self) -> int | None:
        """The most positions the position scheme can encode (a learned table), or None."""
        return self.decoder.position.max_positions

    def new_cache(self, batch: int, max_len: int) -> DecodeCache:
        """An empty KV cache for ``batch`` sequences of up to ``max_len`` tokens."""
        weight = self.embed.weight
        return self.decoder.new_cache(batch, max_len, device=weight.device, dtype=weight.dtype)

    def forward(self, input_ids: Tensor, *, attention_mask: Tensor | None = None,
                positions: Tensor | None = None, cache: DecodeCache | None = None,
                logits_to_keep: int = 0, targets: Tensor | None = None,
                documents: Tensor | None = None, label_smoothing: float = 0.0, z_loss: float = 0.0) -> Tensor:
        """input_ids (B, T) -> logits (B, T, V) (the last ``logits_to_keep`` positions if > 0).

        attention_mask (B, S): 1 for real tokens over all S = cached + T keys (left padding is
        fine: positions then count real tokens only). positions (B|1, T): explicit absolute
        positions. cache: a ``new_cache`` to read and extend. targets (B, T): the next token of
        every position, already shifted (nanoGPT's convention; -100 = no loss) — then the result
        is the mean cross-entropy, computed with the LM head fused in (no (B, T, V) logits);
        label_smoothing ε and z_loss λ make it the training objective of ``seqzoo.nn.losses``.
        documents (B, T): the packed document of each token (token-shard training); attention never
        crosses from one to another.
        """
        x = self.embed(input_ids)  # (B, T, C)
        if self.embed_scale != 1.0:  # rounded to the weights' dtype first (Gemma's exact bf16 scale)
            x = x * x.new_tensor(self.embed_scale)
        if self.embedding_multiplier != 1.0:
            x = x * self.embedding_multiplier
        x = self.decoder(x, attention_mask=attention_mask, positions=positions, cache=cache, documents=documents)
        if targets is not None and self.final_softcap is None:
            # m·(x Wᵀ) = (m·x) Wᵀ: the multiplier rides on the hidden states into the fused loss
            scaled = x if self.logits_multiplier == 1.0 else x * self.logits_multiplier
            bias = self.lm_head.bias if self.lm_head.bias is None or self.logits_multiplier == 1.0 \
                else self.lm_head.bias * self.logits_multiplier
            return linear_cross_entropy(scaled, self.lm_head.weight, targets, bias, label_smoothing=label_smoothing,
                                        z_loss=z_loss)
        if logits_to_keep and targets is None:
            x = x[:, -logits_to_keep:]
        logits = self.lm_head(x)
        if self.logits_multiplier != 1.0:
            logits = logits * self.logits_multiplier
        logits = softcap(logits, self.final_softcap)  # (B, T, V); the loss sees capped logits
        if targets is not None:
            return cross_entropy(logits, targets, label_smoothing=label_smoothing, z_loss=z_loss)  # -100: no loss
        return logits

    def start_generation(self, input_ids: Tensor, max_new_tokens: int, use_cache: bool = True,
                         attention_mask: Tensor | None = None, *, static: bool = False,
                         compile: bool = False) -> CausalSession:
        blocker = self.decoder.static_blocker() if compile else None
        if blocker is not None:
            raise InputError(f"compile=True: {blocker} changes shape from step to step and would recompile "
                             f"every token; decode it eagerly (compile=False)")
        return CausalSession(self, input_ids, max_new_tokens, use_cache, attention_mask,
                             static=static, compile=compile)
