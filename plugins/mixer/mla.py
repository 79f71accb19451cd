"""Multi-head latent attention (DeepSeek-V2, DeepSeek-AI, 2024; DeepSeek-V3): keys and values
compressed into one latent per token, which is all the cache keeps.

    c = RMSNorm(W_DKV x)  or  W_DKV x            (r)       the latent; with k_pe it is the cache
    k_pe = RoPE(W_KR x)                          (d_r)     one rotary key shared by every head
    q = W_UQ RMSNorm(W_DQ x)  or  W_Q x          per head [q_nope (d_n) | q_pe (d_r)], q_pe rotated
    k_h = [W_UK,h c | k_pe],  v_h = W_UV,h c     per head (d_n + d_r) keys, d_v values
    out = W_O concat_h softmax(σ q_h·k_h) v_h    σ = (d_n + d_r)^−½ unless ``scale`` is given

The cache holds c and k_pe: r + d_r numbers per token and layer (DeepSeek-V3: 576), against
2·K·D for grouped attention. Decoding can then skip W_UK and W_UV for the cached tokens — the
*absorbed* form, exact algebra:

    q_nope,h·(W_UK,h c_s) = (W_UK,hᵀ q_nope,h)·c_s   -> one MQA over keys [c | k_pe], dim r + d_r
    Σ_s p_hs W_UV,h c_s  = W_UV,h (Σ_s p_hs c_s)     -> the heads read the latent, W_UV,h after

with the same σ. It costs H·d_n·r per new token instead of H·(d_n + d_v)·r per cached one, so it
runs when a cache is read (``absorb: null``: decoding; true / false force it).
"""
from __future__ import annotations

import torch
from torch import Tensor

from seqzoo.interfaces import Mixer, MixerContext
from seqzoo.nn.cache import KVSlice
from seqzoo.nn.linear import Linear
from seqzoo.plugins.score.scaled_dot import ScaledDot
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, PositiveInt


@builtin("multi-head latent attention: a compressed KV latent cache, absorbed decoding (DeepSeek-V2/V3)",
         aliases=("latent_attention",))
class LatentAttention(Mixer):
    """heads: H (required). kv_lora_rank: r, the latent's width (required). q_lora_rank: r_q of the
    low-rank query (null: a full q projection). qk_nope_head_dim: d_n (128 / 4 of DeepSeek-V3's
    scale: required). qk_rope_head_dim: d_r, the rotated part, one key shared by the heads
    (required). v_head_dim: d_v (null = d_n). bias: on the down projections and the output (false).
    norm_eps: ε of the latent and query norms (1e-6). scale: σ (null = (d_n + d_r)^−½; YaRN's
    attention mscale goes here). absorb: fold W_UK and W_UV when decoding (null = when a cache is
    read, true, false). latent_norm: RMSNorm on the latent (true, as DeepSeek); false keeps
    k and v linear in x, as a factorisation of trained attention's K/V projections is
    (``seqzoo edit``'s ``mla`` rule)."""

    reads_mask = True
    residual_projections = ("out_proj",)
    recipe_example = """
        seqzoo: 1
        extends: tiny-llama
        model:
          position: {kind: rope, base: 10000, interleaved: true, scaling: null}
          mixer: {kind: mla, heads: 4, q_lora_rank: 48, kv_lora_rank: 32, qk_nope_head_dim: 16,
                  qk_rope_head_dim: 8, v_head_dim: 16}      # cache: 32 + 8 numbers per token and layer
        """
    example_params = {"heads": 2, "kv_lora_rank": 8, "q_lora_rank": 12, "qk_nope_head_dim": 6,
                      "qk_rope_head_dim": 4, "v_head_dim": 5}

    def __init__(self, dim: int, heads: PositiveInt, kv_lora_rank: PositiveInt, qk_nope_head_dim: PositiveInt,
                 qk_rope_head_dim: PositiveInt, v_head_dim: PositiveInt | None = None,
                 q_lora_rank: PositiveInt | None = None, bias: bool = False, norm_eps: PositiveFloat = 1e-6,
                 scale: PositiveFloat | None = None, absorb: bool | None = None, latent_norm: bool = True) -> None:
        super().__init__(dim)
        self.heads, self.rank, self.q_rank = heads, kv_lora_rank, q_lora_rank
        self.nope, self.rope, self.value = qk_nope_head_dim, qk_rope_head_dim, v_head_dim or qk_nope_head_dim
        self.scale = scale if scale is not None else (self.nope + self.rope) ** -0.5
        self.absorb = absorb
        h, qk = heads, self.nope + self.rope
        if q_lora_rank is None:
            self.q_proj = Linear(dim, h * qk, bias=False)
        else:
            self.q_a_proj = Linear(dim, q_lora_rank, bias=bias)
            self.q_a_norm = torch.nn.RMSNorm(q_lora_rank, eps=norm_eps)
            self.q_b_proj = Linear(q_lora_rank, h * qk, bias=False)
        self.kv_a_proj = Linear(dim, kv_lora_rank + self.rope, bias=bias)
        self.stacked_rows = {"kv_a_proj.weight": (kv_lora_rank, self.rope)} if self.rope else {}
        self.kv_a_norm = torch.nn.RMSNorm(kv_lora_rank, eps=norm_eps) if latent_norm else torch.nn.Identity()
        self.kv_b_proj = Linear(kv_lora_rank, h * (self.nope + self.value), bias=False)
        self.out_proj = Linear(h * self.value, dim, bias=bias)
        # Always the fused dot product: absorbed decoding rewrites q·kᵀ, so no other score would do.
        self.score = ScaledDot(qk, qk, h, scale=self.scale)

    @classmethod
    def position_dims(cls, spec: dict, dim: int) -> tuple[int, int]:
        """The position scheme rotates the d_r-wide q_pe and k_pe of H heads."""
        return spec["qk_rope_head_dim"], spec["heads"]

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> KVSlice:
        """The latent cache: c (B, 1, max_len, r) in the key slot, k_pe (B, 1, max_len, d_r) in the
        value slot."""
        return KVSlice(batch, 1, self.rank, max_len, device=device, dtype=dtype or torch.float32,
                       value_dim=self.rope)

    def forward(self, x: Tensor, context: MixerContext, state: KVSlice | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C), reading and extending the latent cache ``state``."""
        b, t, _ = x.shape
        h = self.heads
        q = self.q_proj(x) if self.q_rank is None else self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))
        q_nope, q_pe = q.view(b, t, h, -1).transpose(1, 2).split([self.nope, self.rope], -1)  # (B, H, T, ·)
        latent, k_pe = self.kv_a_proj(x).split([self.rank, self.rope], -1)
        latent = self.kv_a_norm(latent)[:, None]  # (B, 1, T, r)
        q_pe, k_pe = context.position.rotate(q_pe, k_pe[:, None], context.q_pos, context.q_pos, **context.prepared)
        if state is not None:
            latent, k_pe = state.write(context.cache, latent, k_pe)  # (B, 1, S, r), (B, 1, S, d_r)
        # decoding (one new token per row, a cache to read): the absorbed form; a prompt: the plain one
        absorb = self.absorb if self.absorb is not None else state is not None and t == 1
        weight = self.kv_b_proj.weight.view(h, self.nope + self.value, self.rank)
        if absorb:
            q_latent = torch.einsum("bhtd,hdr->bhtr", q_nope, weight[:, :self.nope])  # W_UK,hᵀ q_nope,h
            keys = torch.cat([latent, k_pe.to(latent.dtype)], -1)  # (B, 1, S, r + d_r): MQA
            read = self.score.attend(torch.cat([q_latent, q_pe], -1), keys, latent, mask=context.mask,
                                     causal=context.causal)  # (B, H, T, r)
            out = torch.einsum("bhtr,hvr->bhtv", read, weight[:, self.nope:])  # W_UV,h after the sum
        else:
            kv = torch.einsum("bosr,hdr->bhsd", latent, weight)  # (B, H, S, d_n + d_v)
            k_nope, value = kv.split([self.nope, self.value], -1)
            keys = torch.cat([k_nope, k_pe.to(k_nope.dtype).expand(-1, h, -1, -1)], -1)
            out = self.score.attend(torch.cat([q_nope, q_pe], -1), keys, value, mask=context.mask,
                                    causal=context.causal)  # (B, H, T, d_v)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, h * self.value))

    def extra_repr(self) -> str:
        return (f"heads={self.heads}, kv_lora_rank={self.rank}, q_lora_rank={self.q_rank}, d_nope={self.nope}, "
                f"d_rope={self.rope}, d_v={self.value}")
