"""The delta rule in plain PyTorch, for gated DeltaNet and KDA (not a mixer of its own): the chunked
WY form for sequences, the one-token step for decoding, flash-linear-attention's Triton kernels on
CUDA when ``fla`` is installed, and the layer pieces both mixers share around their projections.

    S_t = Diag(α_t) S_{t−1} + β_t k_t (v_t − (Diag(α_t) S_{t−1})ᵀ k_t)ᵀ,    o_t = S_tᵀ q_t

α_t = exp(g_t): 1 (DeltaNet), a scalar per head (gated DeltaNet) or a vector over the key channels
(KDA). ``seqzoo.reference.delta_rule`` is the same recurrence token by token.

The chunked form (Yang et al., 2024, "Parallelizing Linear Transformers with the Delta Rule"):
within a chunk of L tokens, with Γ_t = Σ_{s≤t} g_s the log-decay since the chunk began (≤ 0) and
S_0 the state before it, the writes u_s = β_s (v_s − (Diag(α_s) S_{s−1})ᵀ k_s) solve a unit lower
triangular system (the UT transform of the WY representation),

    u_s + Σ_{r<s} A_sr u_r = β_s v_s − β_s (e^{Γ_s} ⊙ k_s)ᵀ S_0,    A_sr = β_s Σ_d k_sd k_rd e^{Γ_sd − Γ_rd}

so U = T (β V) − T (β K e^Γ) S_0 with T = (I + A)⁻¹ (one triangular solve per chunk, for every
chunk at once), and then, chunk after chunk,

    o_t = (e^{Γ_t} ⊙ q_t)ᵀ S_0 + Σ_{s≤t} (q_t · k_s e^{Γ_t − Γ_s}) u_s
    S_L = Diag(e^{Γ_L}) S_0 + Σ_s (e^{Γ_L − Γ_s} ⊙ k_s) u_sᵀ

Every exponent is a difference Γ_t − Γ_s with s ≤ t (masked before the exp above the diagonal),
so nothing overflows whatever the decay. A scalar decay makes A and the q·k scores (L × L)
products scaled by an (L × L) decay; a per-channel decay keeps the channel inside the sum, which
``channel_pairs`` computes as log₂ L levels of matrix products instead of an (L × L × D_k) tensor.
Padded positions carry β = 0 and g = 0: u = 0 there, and the state neither decays nor takes input.

Shape legend: B batch, T length, G key heads, R value heads per key head, H = G·R value heads,
D_k key width, D_v value width, N chunks of L tokens.
"""
from __future__ import annotations

import functools
import math
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.functional import upcast
from seqzoo.interfaces import Mixer, MixerContext

from ._chunks import in_chunks
from ._conv_state import RecurrentState, causal_conv, conv_inputs
from ._segments import in_segments

#: ε of the L2 norm of q and k, added to Σx² (fla's and transformers' choice).
L2_EPS = 1e-6


def l2norm(x: Tensor) -> Tensor:
    """x / √(Σx² + ε) over the last dim, in x's dtype (the callers widen it first)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


def chunked(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, state: Tensor | None,
            chunk: int) -> tuple[Tensor, Tensor]:
    """The chunked WY form. q (scaled), k (B, T, G, D_k); v (B, T, H, D_v); beta (B, T, H); g None,
    (B, T, H) or (B, T, H, D_k); state (B, H, D_k, D_v) or None -> (o (B, T, H, D_v), S_T), in
    float32 or wider."""
    dtype = torch.promote_types(v.dtype, torch.float32)
    length, key_heads, width = k.shape[1:]
    heads, value_width = v.shape[2:]
    per = heads // key_heads

    def blocks(x: Tensor, value_heads: bool) -> Tensor:  # (B, T, heads, ...) -> (B, N, G, R|1, L, ...)
        x = in_chunks(x.to(dtype), chunk)  # zeros after the end: β = 0, g = 0, no input, no decay
        x = x.unflatten(3, (key_heads, per)) if value_heads else x.unsqueeze(4)
        return x.movedim(2, 4)

    q, k = blocks(q, False), blocks(k, False)                             # (B, N, G, 1, L, D_k)
    v, beta = blocks(v, True), blocks(beta, True)                          # (B, N, G, R, L, D_v), (.., L)
    if g is None or g.dim() == 3:  # no decay, or one per head: (L × L) products
        causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
        kk, qk = k @ k.transpose(-1, -2), q @ k.transpose(-1, -2)           # shared by a key head's R heads
        if g is None:
            decay = causal.to(dtype)
            start = end = total = None
        else:
            cum = blocks(g, True).cumsum(-1)                                # Γ (B, N, G, R, L)
            decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, -math.inf).exp()
            start, end = cum.exp()[..., None], (cum[..., -1:] - cum).exp()[..., None]
            total = cum[..., -1].exp()[..., None, None]
        A, P = kk * decay, qk * decay
    else:  # one decay per key channel: the pairs by halving (``channel_pairs``)
        cum = blocks(g, True).cumsum(-2)                                     # Γ (B, N, G, R, L, D_k)
        A, P = channel_pairs(q, k, cum)
        start, end = cum.exp(), (cum[..., -1:, :] - cum).exp()
        total = cum[..., -1, :].exp()[..., None]
    A = A * beta[..., None]  # row s scaled by β_s; solve_triangular reads only the strict lower part
    decayed_k = k if start is None else k * start
    rhs = torch.cat([beta[..., None] * v, beta[..., None] * decayed_k], -1)  # [β V | β K e^Γ] (.., L, D_v + D_k)
    U, W = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True).split([value_width, width], -1)
    q = q if start is None else q * start                                  # reads S_0 through e^{Γ_t}
    k = k if end is None else k * end                                      # writes S_L through e^{Γ_L − Γ_s}
    S = (v.new_zeros(v.shape[0], heads, width, value_width) if state is None else state.to(dtype))
    S = S.unflatten(1, (key_heads, per))                                  # (B, G, R, D_k, D_v)
    outs = []
    # One unbind, not a slice per chunk: the backward of x[:, n] writes a zero gradient of the
    # whole length for every chunk, an unbind's backward stacks once.
    totals = [None] * U.shape[1] if total is None else total.unbind(1)
    for U_n, W_n, q_n, P_n, k_n, total_n in zip(*(t.unbind(1) for t in (U, W, q, P, k)), totals):
        u = U_n - W_n @ S                                                  # the chunk's writes (.., L, D_v)
        outs.append(q_n @ S + P_n @ u)
        S = (S if total_n is None else S * total_n) + k_n.transpose(-1, -2) @ u
    o = torch.stack(outs, 1).movedim(4, 2).flatten(3, 4).flatten(1, 2)  # (B, N·L, H, D_v)
    return o[:, :length], S.flatten(1, 2)


def channel_pairs(q: Tensor, k: Tensor, cum: Tensor) -> tuple[Tensor, Tensor]:
    """With a decay per key channel: A_sr = Σ_d k_sd k_rd e^{Γ_sd − Γ_rd} for r < s and P_sr = the
    same with q_s for r ≤ s (0 elsewhere), q, k (.., L, D_k), Γ (.., L, D_k) -> (.., L, L) each.

    e^{Γ_s − Γ_r} does not factor into a row term times a column term without one of them growing
    as e^{+|Γ|}, but it does through any position m between them: e^{Γ_s − Γ_m} · e^{Γ_m − Γ_r},
    both ≤ 1. So the chunk is halved, and halved again: at each level the pairs with r in a left
    half and s in the right half are one matrix product, through m = the left half's last token.
    log₂ L levels of (L × D_k) scalings replace an (L × L × D_k) tensor of decays. L is padded to
    a power of two with tokens that change nothing and are dropped."""
    length = cum.shape[-2]
    size = 1 << (length - 1).bit_length()
    if size != length:  # pad: zero q and k, no further decay (Γ stays at its last value)
        q, k = (F.pad(t, (0, 0, 0, size - length)) for t in (q, k))
        cum = torch.cat([cum, cum[..., -1:, :].expand(*cum.shape[:-2], size - length, cum.shape[-1])], -2)
    batch = torch.broadcast_shapes(q.shape[:-2], cum.shape[:-2])
    diagonal = (torch.stack([k, q]) * k).sum(-1).expand(2, *batch, size)  # e^0; P keeps it, A's is never read
    values, places = [diagonal], [torch.arange(size, device=cum.device) * (size + 1)]  # [A's | P's] entries
    half = 1
    while half < size:
        pairs = size // (2 * half)
        gamma, qq, kk = (t.unflatten(-2, (pairs, 2, half)) for t in (cum, q, k))    # (.., pairs, 2, half, D_k)
        middle = gamma[..., 0, -1:, :]                                             # Γ_m, the left half's end
        left = kk[..., 0, :, :] * (middle - gamma[..., 0, :, :]).exp()              # k_r e^{Γ_m − Γ_r}
        right = torch.stack([kk[..., 1, :, :], qq[..., 1, :, :]]) * (gamma[..., 1, :, :] - middle).exp()
        values.append((right @ left.transpose(-1, -2)).flatten(-3))                # (2, .., pairs·half·half)
        j, a, b = (torch.arange(n, device=cum.device) for n in (pairs, half, half))
        s, r = j[:, None, None] * 2 * half + half + a[:, None], j[:, None, None] * 2 * half + b  # s right, r left
        places.append((s * size + r).flatten())
        half *= 2
    values, places = torch.cat(values, -1), torch.cat(places)
    A, P = values.new_zeros(*values.shape[:-1], size * size).scatter(
        -1, places.expand_as(values), values).unflatten(-1, (size, size)).unbind(0)
    return A[..., :length, :length], P[..., :length, :length]


def step(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, S: Tensor) -> tuple[Tensor, Tensor]:
    """One token, for decoding: q (scaled), k (B, G, D_k); v (B, H, D_v); beta (B, H); g None, (B, H)
    or (B, H, D_k); S (B, H, D_k, D_v) -> (o (B, H, D_v), new S), in S's dtype."""
    per = v.shape[1] // k.shape[1]
    q, k, v, beta = (t.to(S.dtype) for t in (q.repeat_interleave(per, 1), k.repeat_interleave(per, 1), v, beta))
    if g is not None:
        decay = g.to(S.dtype).exp()
        S = S * (decay[..., None, None] if decay.dim() == 2 else decay[..., None])
    u = beta[..., None] * (v - torch.einsum("bhkv,bhk->bhv", S, k))
    S = S + k[..., None] * u[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", S, q), S


@functools.cache
def _fla_kernels(per_channel: bool) -> tuple | None:
    """fla's (chunk, fused_recurrent) kernels for a scalar or a per-channel decay, or None."""
    try:
        if per_channel:
            from fla.ops.kda import chunk_kda, fused_recurrent_kda
            return chunk_kda, fused_recurrent_kda
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError:
        return None


def delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, state: Tensor | None,
               chunk: int) -> tuple[Tensor, Tensor]:
    """The delta rule over raw q, k (B, T, G, D_k) (L2-normalised here, q scaled by D_k^−½), v
    (B, T, H, D_v), beta (B, T, H), g (None, (B, T, H) or (B, T, H, D_k)), from ``state`` (B, H,
    D_k, D_v) float32 or None -> (o (B, T, H, D_v), final state float32 or wider). On CUDA with fla
    installed (and ``SEQZOO_SCAN`` not ``torch``), fla's kernels (its fused recurrent one for a
    decode step without autograd, its chunked one otherwise); else one step for a single token with
    a state, the chunked form otherwise."""
    length, width = q.shape[1], q.shape[-1]
    decode = length == 1 and state is not None
    per_channel = g is not None and g.dim() == 4
    kernels = _fla_kernels(per_channel) if q.is_cuda and os.environ.get("SEQZOO_SCAN") != "torch" else None
    if kernels is not None:
        per = v.shape[2] // k.shape[2]  # fla versions before GVA want one q/k head per value head
        q, k = q.repeat_interleave(per, 2), k.repeat_interleave(per, 2)
        g = torch.zeros(beta.shape, device=beta.device) if g is None else g
        kernel = kernels[1] if decode and not torch.is_grad_enabled() else kernels[0]  # fused_recurrent: no backward
        return kernel(q, k, v, g=g.float(), beta=beta.to(q.dtype), scale=width ** -0.5, initial_state=state,
                      output_final_state=True, use_qk_l2norm_in_kernel=True)
    dtype = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(q.device.type, enabled=False):  # the products stay in float32 under autocast too
        q, k = l2norm(q.to(dtype)) * width ** -0.5, l2norm(k.to(dtype))
        if decode:
            o, final = step(q[:, 0], k[:, 0], v[:, 0], beta[:, 0], None if g is None else g[:, 0], state)
            return o[:, None], final
        return chunked(q, k, v, beta, g, state, chunk)


def log_decay(a: Tensor, A_log: Tensor, dt_bias: Tensor) -> Tensor:
    """g = −exp(A_log) · softplus(a + dt_bias) ≤ 0, in float32 or wider whatever a's dtype (A_log
    and dt_bias shaped to broadcast against a)."""
    return -torch.exp(upcast(A_log)) * F.softplus(upcast(a) + upcast(dt_bias))


def decay_parameters(heads: int, channels: int, dt_min: float, dt_max: float) -> tuple[nn.Parameter, nn.Parameter]:
    """A_log (heads,) = log U(1, 16), as fla's KDA layer draws it, and dt_bias (channels,) =
    softplus⁻¹ of a step log-uniform in [dt_min, dt_max], as Mamba-2 and fla draw theirs."""
    A_log = nn.Parameter(torch.empty(heads).uniform_(1, 16).log())
    dt = torch.exp(torch.rand(channels) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    return A_log, nn.Parameter(dt + torch.log(-torch.expm1(-dt)))


class DeltaRuleMixer(Mixer):
    """What gated DeltaNet and KDA share around their own projections: a short conv + SiLU over
    [q | k | v] whose last K − 1 inputs live in the decoding state, the delta rule from the state
    (``S``, (B, H, D_k, D_v) float32), padded positions made neutral, and the per-head gated
    RMSNorm and output projection. A subclass builds ``conv1d``, ``norm`` and ``out_proj`` and sets
    the widths; its ``inputs`` computes q, k, v, β, g and the output gate from x."""

    causal_only = True
    residual_projections = ("out_proj",)
    no_weight_decay = ("A_log", "dt_bias")  # decay would pull A towards 1 and Δ's bias towards 0
    key_heads: int
    heads: int
    head_dim: int
    value_head_dim: int
    kernel: int
    chunk: int
    allow_neg_eigval: bool = False
    conv1d: nn.Conv1d
    norm: nn.Module
    out_proj: nn.Module

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> RecurrentState:
        """Zero conv inputs (B, 2·G·D_k + H·D_v, K − 1) and a zero float32 state S (B, H, D_k, D_v);
        ``max_len`` plays no part."""
        dtype = dtype or self.out_proj.weight.dtype
        return RecurrentState(conv=conv_inputs(batch, self.conv1d.in_channels, self.kernel, device=device, dtype=dtype),
                              S=torch.zeros(batch, self.heads, self.head_dim, self.value_head_dim, device=device,
                                            dtype=torch.promote_types(dtype, torch.float32)))

    def qkv(self, qkv: Tensor, real: Tensor | None, state: RecurrentState | None) -> tuple[Tensor, Tensor, Tensor]:
        """[q | k | v] (B, T, 2·G·D_k + H·D_v) -> q, k (B, T, G, D_k), v (B, T, H, D_v) through the
        short conv and SiLU; padded positions enter the conv as zeros, as an empty history does."""
        if real is not None:
            qkv = qkv * real
        keys = self.key_heads * self.head_dim
        q, k, v = F.silu(causal_conv(self.conv1d, qkv, state)).split([keys, keys, qkv.shape[-1] - 2 * keys], -1)
        return (q.unflatten(-1, (self.key_heads, -1)), k.unflatten(-1, (self.key_heads, -1)),
                v.unflatten(-1, (self.heads, -1)))

    def forward(self, x: Tensor, context: MixerContext, state: RecurrentState | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); continues from and updates ``state``. Without autograd, long
        sequences run in segments (``_segments``)."""
        segmented = in_segments(self, x, context, state)
        if segmented is not None:
            return segmented
        real = None if context.padding is None else context.padding.to(x.dtype)[..., None]  # (B, T, 1)
        q, k, v, beta, g, gate = self.inputs(x, real, state)
        if real is not None:  # β = 0 and g = 0 at padded positions: the state does not move
            beta = beta * real
            g = None if g is None else g * (real if g.dim() == 3 else real[..., None])
        o, final = delta_rule(q, k, v, beta, g, None if state is None else state.S, self.chunk)
        if state is not None:
            state.S = final
        return self.out_proj(self.norm(o.to(gate.dtype).flatten(2), gate))

    def inputs(self, x: Tensor, real: Tensor | None, state: RecurrentState | None) -> tuple[Tensor, ...]:
        """The layer's own part: x (B, T, C) -> q, k (B, T, G, D_k), v (B, T, H, D_v), β (B, T, H),
        g (None, (B, T, H) or (B, T, H, D_k)) and the output gate (B, T, H·D_v), with ``qkv`` for
        the conv and ``beta`` for β. ``real`` (B, T, 1): 0 at padded positions, or None."""
        raise NotImplementedError(f"{type(self).__name__} must implement inputs(x, real, state)")

    def beta(self, b: Tensor) -> Tensor:
        """β = σ(b), or 2σ(b) with ``allow_neg_eigval``, in float32 or wider whatever b's dtype."""
        return torch.sigmoid(upcast(b)) * (2.0 if self.allow_neg_eigval else 1.0)
