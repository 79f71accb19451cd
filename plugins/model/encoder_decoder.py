"""Encoder–decoder Transformer (Vaswani et al., 2017; T5, Raffel et al., 2020): a bidirectional
encoder stack and a causal decoder stack whose blocks cross-attend to the encoder's output, sharing
one token embedding (and, when tied, the LM head)."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

import seqzoo
from seqzoo.builder import Parts
from seqzoo.interfaces import LanguageModel
from seqzoo.nn.attention import AttentionConfig, check_attention
from seqzoo.nn.blocks import Placement
from seqzoo.nn.cache import DecodeCache
from seqzoo.nn.init import init_weights
from seqzoo.nn.linear import Linear
from seqzoo.nn.losses import linear_cross_entropy
from seqzoo.registry import builtin
from seqzoo.schema import Depth, NonNegativeInt, PositiveFloat, Probability, Size, Spec, Validator


@builtin("encoder–decoder Transformer with cross-attention (Vaswani 2017, T5)", aliases=("seq2seq_transformer",))
class EncoderDecoder(LanguageModel):
    """Recipe keys: vocab_size V (shared by source and target), dim C, encoder_layers,
    decoder_layers, max_seq_len, attention (self- and cross-attention), ffn (relu), position
    (sinusoidal; each stack gets its own instance — T5's bias table is per stack), norm
    (layernorm), placement (post), tie_embeddings (true), scale_embeddings (× √C, Vaswani; false),
    rescale_tied_head (× C^-1/2 before a tied head, T5 v1.0; false), decoder_start_id (the first
    decoder token; 0), dropout (0), init_std (0.02)."""

    family = "seq2seq"
    prompt_padding = "right"
    fused_loss = True

    def __init__(self, parts: Parts, vocab_size: Size, dim: Size, encoder_layers: Depth,
                 decoder_layers: Depth, max_seq_len: Size, attention: AttentionConfig,
                 ffn: Spec["ffn"] = "relu", position: Spec["position"] = "sinusoidal",
                 norm: Spec["norm"] = "layernorm", placement: Placement = "post",
                 tie_embeddings: bool = True, scale_embeddings: bool = False,
                 rescale_tied_head: bool = False, decoder_start_id: NonNegativeInt = 0,
                 dropout: Probability = 0.0, init_std: PositiveFloat = 0.02) -> None:
        super().__init__()
        self.vocab_size, self.dim = vocab_size, dim
        self.tie_embeddings = tie_embeddings
        self.decoder_start_id = decoder_start_id
        self.embed_scale = math.sqrt(dim) if scale_embeddings else 1.0
        self.head_scale = dim ** -0.5 if rescale_tied_head and tie_embeddings else 1.0
        self.embed = nn.Embedding(vocab_size, dim)
        section = dict(dim=dim, max_seq_len=max_seq_len, attention=attention, ffn=ffn, position=position,
                       norm=norm, placement=placement, dropout=dropout, encoder_layers=encoder_layers,
                       decoder_layers=decoder_layers)
        self.encoder = parts.stack(section, layers_key="encoder_layers", causal=False)
        self.decoder = parts.stack(section, layers_key="decoder_layers", causal=True, cross=True)
        self.lm_head = Linear(dim, vocab_size, bias=False)
        init_weights(self, init_std, self.encoder.residual_branches + self.decoder.residual_branches)
        self.tie_weights()

    @classmethod
    def check_recipe(cls, model: dict, path: tuple, validator: Validator) -> None:
        check_attention(model["attention"], model["dim"], (*path, "attention"))
        if model["decoder_start_id"] >= model["vocab_size"]:
            raise seqzoo.schema.SchemaError(
                (*path, "decoder_start_id"),
                f"{model['decoder_start_id']} is not a token id (vocab_size={model['vocab_size']})")

    def shard_units(self) -> list[nn.Module]:
        return [*self.encoder.blocks, *self.decoder.blocks]

    def tie_weights(self) -> None:
        if self.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def _embed(self, ids: Tensor) -> Tensor:
        x = self.embed(ids)
        return x * self.embed_scale if self.embed_scale != 1.0 else x

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """src_ids (B, S) -> memory (B, S, C); src_mask (B, S): 1 for real source tokens."""
        positions = torch.arange(src_ids.shape[1], device=src_ids.device)[None]
        return self.encoder(self._embed(src_ids), attention_mask=src_mask, positions=positions)

    def decode(self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor | None = None, *,
               cache: DecodeCache | None = None, logits_to_keep: int = 0,
               targets: Tensor | None = None, label_smoothing: float = 0.0, z_loss: float = 0.0) -> Tensor:
        """tgt_ids (B, T) against memory (B, S, C) -> logits (B, T, V), or with targets (B, T)
        the mean cross-entropy against them (see ``forward``)."""
        x = self.decoder(self._embed(tgt_ids), cache=cache, memory=memory, memory_mask=src_mask)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        if self.head_scale != 1.0:
            x = x * self.head_scale
        if targets is not None:
            return linear_cross_entropy(x, self.lm_head.weight, targets, self.lm_head.bias,
                                        label_smoothing=label_smoothing, z_loss=z_loss)
        return self.lm_head(x)

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Tensor | None = None, *,
                targets: Tensor | None = None, label_smoothing: float = 0.0, z_loss: float = 0.0) -> Tensor:
        """Teacher-forced logits: src_ids (B, S), tgt_ids (B, T) -> (B, T, V). targets (B, T):
        the token each decoder position must predict (-100 = no loss) — then the result is the
        mean cross-entropy, with the LM head fused in (no (B, T, V) logits); label_smoothing ε and
        z_loss λ make it the training objective of ``seqzoo.nn.losses``."""
        return self.decode(tgt_ids, self.encode(src_ids, src_mask), src_mask, targets=targets,
                           label_smoothing=label_smoothing, z_loss=z_loss)

    def new_cache(self, batch: int, max_len: int) -> DecodeCache:
        weight = self.embed.weight
        return self.decoder.new_cache(batch, max_len, device=weight.device, dtype=weight.dtype)

    def start_generation(self, src_ids: Tensor, max_new_tokens: int, use_cache: bool = True,
                         attention_mask: Tensor | None = None) -> "Seq2SeqSession":
        return Seq2SeqSession(self, src_ids, max_new_tokens, use_cache, attention_mask)


class Seq2SeqSession:
    """Decoding state: the source encoded once, the decoder's KV cache (cross-attention keys and
    values of the memory are projected once and kept in it), or the whole target so far."""

    def __init__(self, model: EncoderDecoder, src_ids: Tensor, max_new_tokens: int, use_cache: bool,
                 src_mask: Tensor | None = None) -> None:
        self.model = model
        self.src_mask = src_mask
        self.memory = model.encode(src_ids, src_mask)
        self.prefix = self.ids = torch.full((src_ids.shape[0], 1), model.decoder_start_id,
                                            dtype=torch.long, device=src_ids.device)
        self.cache = model.new_cache(src_ids.shape[0], 1 + max_new_tokens) if use_cache else None

    def next(self, tokens: Tensor | None) -> Tensor:
        """tokens (B,) chosen last step, or None to start -> logits (B, V) in float32."""
        if tokens is not None:
            self.ids = torch.cat([self.ids, tokens[:, None]], dim=1)
        feed = self.ids if self.cache is None or tokens is None else tokens[:, None]
        logits = self.model.decode(feed, self.memory, self.src_mask, cache=self.cache, logits_to_keep=1)
        return logits[:, -1].float()

    def reorder(self, rows: Tensor) -> None:
        """Keep batch rows ``rows`` in that order (beam search)."""
        self.ids = self.ids.index_select(0, rows)
        self.memory = self.memory.index_select(0, rows)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, rows)
        if self.cache is not None:
            self.cache.reorder(rows)
