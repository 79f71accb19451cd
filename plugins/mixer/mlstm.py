"""The mLSTM layer of xLSTM (Beck, Pöppel, Spanring et al., 2024, "xLSTM: Extended Long Short-Term
Memory") as a token mixer, in the form of xLSTM-7B (Beck et al., 2025, "xLSTM 7B: A Recurrent LLM
for Fast and Efficient Inference"; transformers' ``xLSTMLayer``):

    q, k, v, o = qkvo_proj(x)               q, k (H·D_k); v, o (H·D_v)
    ĩ, f̃ = cap · tanh(if_proj(x) / cap)      one input and one forget preactivation per head
    m_t = max(logσ(f̃_t) + m_{t−1}, ĩ_t)      the stabiliser of the exponential input gate
    C_t = e^{logσ(f̃_t) + m_{t−1} − m_t} C_{t−1} + e^{ĩ_t − m_t} k_t v_tᵀ,   n_t likewise with k_t
    h_t = C_tᵀ q_t D_k^−½ / (max(|n_tᵀ q_t D_k^−½|, e^{−m_t}) + ε)
    out = out_proj(Norm_H(h) · w ⊙ σ(o))      a LayerNorm (or RMSNorm) over each head, w per feature

The decoding state is (C, n, m) per head, float32; sequences run the chunked form of ``_mlstm``
(fla's ``chunk_mlstm`` on CUDA when installed).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.errors import ConfigError
from seqzoo.functional import upcast
from seqzoo.interfaces import Mixer, MixerContext
from seqzoo.nn.linear import Linear
from seqzoo.registry import builtin
from seqzoo.schema import PositiveFloat, PositiveInt

from ._conv_state import RecurrentState
from ._mlstm import mlstm
from ._segments import in_segments

NORMS = ("layernorm", "rmsnorm")


class HeadNorm(nn.Module):
    """A LayerNorm or RMSNorm over each of H heads (statistics in float32, as xLSTM-7B forces), then
    a weight (and bias) per feature of all H·D: transformers' ``xLSTMMultiHeadLayerNorm``."""

    def __init__(self, heads: int, width: int, eps: float, kind: str, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(heads * width))
        self.bias = nn.Parameter(torch.zeros(heads * width)) if bias else None
        self.eps, self.kind = eps, kind

    def forward(self, h: Tensor) -> Tensor:
        """h (B, T, H, D) -> (B, T, H·D) in h's dtype."""
        x = h.to(torch.promote_types(h.dtype, torch.float32))
        if self.kind == "layernorm":
            x = F.layer_norm(x, x.shape[-1:], eps=self.eps)
        else:
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = self.weight * x.to(h.dtype).flatten(-2)
        return x if self.bias is None else x + self.bias


@builtin("mLSTM (xLSTM-7B): matrix memory, exponential input gate with max-stabiliser; chunked form")
class MLSTM(Mixer):
    """Args (C = dim):
        heads: H (required; xLSTM-7B: 8).
        head_dim: D_k, each q/k head's width (null = C / 2H, xLSTM-7B's qk_dim_factor 0.5).
        value_head_dim: D_v, each value head's width (null = C / H, v_dim_factor 1).
        gate_soft_cap: cap of the gates' preactivations, cap · tanh(x / cap) (15.0; null: none).
        norm: the per-head norm of h, layernorm (xLSTM-7B) or rmsnorm (layernorm).
        norm_eps: its ε (1e-6).
        eps: ε of the denominator, added after the max (1e-6).
        bias: biases on qkvo_proj, out_proj and the norm (false); the gates always have one.
        chunk: L, the chunk length of the parallel form (64); it only moves speed and memory.

    Parameters: qkvo_proj C·(2·H·D_k + 2·H·D_v), if_proj 2·H·(C + 1), out_proj H·D_v·C, norm H·D_v.
    xLSTM-7B's shape (H·D_k = C / 2, H·D_v = C): 4·C² per layer, and its SwiGLU FFN beside it.

    Initialisation as xLSTM-7B: the gates' weights zero, the input gate's bias −10 (writes start
    small), the forget gate's biases spread over [3, 6] across the heads (σ ≈ 0.95 … 0.998)."""

    causal_only = True
    residual_projections = ("out_proj",)
    keep_init = ("if_proj.weight", "if_proj.bias")  # xLSTM-7B's gate start, not N(0, std)
    example_params = {"heads": 2}

    def __init__(self, dim: int, heads: PositiveInt, head_dim: PositiveInt | None = None,
                 value_head_dim: PositiveInt | None = None, gate_soft_cap: PositiveFloat | None = 15.0,
                 norm: str = "layernorm", norm_eps: PositiveFloat = 1e-6, eps: PositiveFloat = 1e-6,
                 bias: bool = False, chunk: PositiveInt = 64) -> None:
        super().__init__(dim)
        if norm not in NORMS:
            raise ConfigError(f"mlstm: norm={norm!r} is not one of {', '.join(NORMS)}")
        if (head_dim is None and dim % (2 * heads)) or (value_head_dim is None and dim % heads):
            raise ConfigError(f"mlstm: dim={dim} must be divisible by 2·heads={2 * heads} (the q/k heads are "
                              f"C / 2H wide) and heads, or set head_dim and value_head_dim")
        self.heads = heads
        self.head_dim, self.value_head_dim = head_dim or dim // (2 * heads), value_head_dim or dim // heads
        self.gate_soft_cap, self.eps, self.chunk = gate_soft_cap, eps, chunk
        keys, values = heads * self.head_dim, heads * self.value_head_dim
        self.sizes = [keys, keys, values, values]
        self.qkvo_proj = Linear(dim, sum(self.sizes), bias=bias)
        self.stacked_rows = {"qkvo_proj.weight": tuple(self.sizes)}
        self.if_proj = Linear(dim, 2 * heads, bias=True)
        with torch.no_grad():
            self.if_proj.weight.zero_()
            # on the parameter's device: a transformers from_pretrained earlier in the process can
            # leave torch.linspace without the meta device's default
            device = self.if_proj.bias.device
            forget = torch.linspace(3.0, 6.0, heads, device=device)
            self.if_proj.bias.copy_(torch.cat([torch.full((heads,), -10.0, device=device), forget]))
        self.norm = HeadNorm(heads, self.value_head_dim, norm_eps, norm, bias)
        self.out_proj = Linear(values, dim, bias=bias)

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> RecurrentState:
        """Zero float32 C (B, H, D_k, D_v), n (B, H, D_k) and m (B, H); ``max_len`` plays no part."""
        dtype = torch.promote_types(dtype or self.out_proj.weight.dtype, torch.float32)
        zeros = lambda *shape: torch.zeros(batch, self.heads, *shape, device=device, dtype=dtype)  # noqa: E731
        return RecurrentState(C=zeros(self.head_dim, self.value_head_dim), n=zeros(self.head_dim), m=zeros())

    def forward(self, x: Tensor, context: MixerContext, state: RecurrentState | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); continues from and updates ``state``. Without autograd, long
        sequences run in segments (``_segments``)."""
        segmented = in_segments(self, x, context, state)
        if segmented is not None:
            return segmented
        q, k, v, o = self.qkvo_proj(x).split(self.sizes, dim=-1)
        q, k = (t.unflatten(-1, (self.heads, self.head_dim)) for t in (q, k))   # (B, T, H, D_k)
        v = v.unflatten(-1, (self.heads, self.value_head_dim))                   # (B, T, H, D_v)
        gates = upcast(self.if_proj(x))  # (B, T, 2H), capped in float32 whatever x's dtype
        if self.gate_soft_cap is not None:
            gates = self.gate_soft_cap * torch.tanh(gates / self.gate_soft_cap)
        i, f = gates.chunk(2, dim=-1)
        if context.padding is not None:  # no write (i = −∞), no decay (log σ(+∞) = 0), m unchanged
            real = context.padding.bool()[..., None]
            i, f = i.masked_fill(~real, -torch.inf), f.masked_fill(~real, torch.inf)
        start = state if state is not None else self.new_state(x.shape[0], 0, device=x.device, dtype=x.dtype)
        h, (C, n, m) = mlstm(q, k, v, i, f, (start.C, start.n, start.m), self.chunk, self.eps)
        if state is not None:
            state.C, state.n, state.m = C, n, m
        return self.out_proj(self.norm(h.to(x.dtype)) * torch.sigmoid(o))

    def extra_repr(self) -> str:
        return (f"heads={self.heads}, head_dim={self.head_dim}, value_head_dim={self.value_head_dim}, "
                f"gate_soft_cap={self.gate_soft_cap}")
