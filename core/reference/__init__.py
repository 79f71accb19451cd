"""The plain token-by-token recurrences behind seqzoo's recurrent mixers and cells, written to be
read and trusted, not to be fast: one Python step per token, in whatever dtype they are given
(the tests run them in float64). Every chunked scan, fused kernel and decode step in seqzoo is
tested equal to one of these, as flash-linear-attention tests its kernels against its ``naive.py``.

- ``selective_scan``: Mamba (Gu & Dao, 2023), h_t = exp(Δ_t A) ⊙ h_{t−1} + Δ_t B_t u_t, y_t = h_t C_t
- ``ssd``: Mamba-2 (Dao & Gu, 2024), the same with a scalar decay per head and groups of heads
  sharing B and C
- ``linear_attention``: Katharopoulos et al. (2020), with RetNet's per-head decay (Sun et al., 2023),
  S_t = γ S_{t−1} + φ(k_t) v_tᵀ, o_t = S_tᵀ φ(q_t)
- ``rnn``, ``lstm``, ``gru``: the Elman, LSTM and GRU cells in torch.nn's parameter layout and
  equations (torch.nn.RNNCell, LSTMCell, GRUCell)

The hybrid era's mixers, one module each (``from seqzoo.reference.delta_rule import delta_rule``;
the modules are not imported here, so their names stay the modules'):

- ``delta_rule`` (``seqzoo.reference.delta_rule``): DeltaNet, gated DeltaNet and Kimi delta
  attention, S_t = Diag(α_t)(I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ
- ``gla`` (``.gla``): gated linear attention, S_t = Diag(α_t) S_{t−1} + k_t v_tᵀ (MiniMax's
  lightning attention with α fixed per head)
- ``mlstm`` (``.mlstm``): xLSTM's matrix memory with exponential input gates and their stabiliser
- ``rg_lru`` (``.rg_lru``): Griffin's real-gated linear recurrent unit
- ``gated_short_conv`` (``.short_conv``): LFM2's gated causal depthwise convolution
- ``generalized_delta_rule``, ``rwkv7_time_mix``, ``rwkv7_channel_mix`` (``.rwkv7``): RWKV-7
- ``.rwkv4``: RWKV-4's WKV, the max-stabilised per-channel decay with a bonus for the current token

Each function takes the state before the first token as ``state`` (None: zeros) and returns
(outputs, final state), so a sequence can be continued by passing the state back in.

Shape legend: B batch, T length, H heads (the hidden size for the cells), D head dim (the channels
for ``selective_scan``), N state size, G groups of heads sharing B and C, I input size. Write
shapes as ``(B, T, H, D)``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InputError

FEATURE_MAPS = ("elu", "identity")
NONLINEARITIES = ("tanh", "relu")


# -- state-space scans ------------------------------------------------------------------------------
def selective_scan(u: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                   state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Mamba's selective scan, one token at a time: every (channel d, state n) pair decays at its own
    rate exp(Δ_t,d A_d,n) and takes the input Δ_t,d B_t,n u_t,d; the channel reads its N states
    through C_t.

        h_t = exp(Δ_t A) ⊙ h_{t−1} + Δ_t B_t u_t,    y_t = h_t C_t

    u, dt (B, T, D); A (D, N), ≤ 0 for a decay; B, C (B, T, N), shared by the D channels;
    state h_0 (B, D, N). Returns (y (B, T, D), h_T (B, D, N)). A token with Δ = 0 leaves the state
    as it was.
    """
    h = u.new_zeros(u.shape[0], u.shape[2], A.shape[1]) if state is None else state
    ys = []
    for t in range(u.shape[1]):
        decay = torch.exp(dt[:, t, :, None] * A)                               # (B, D, N)
        h = decay * h + (dt[:, t] * u[:, t])[:, :, None] * B[:, t, None, :]
        ys.append(torch.einsum("bdn,bn->bd", h, C[:, t]))
    return torch.stack(ys, dim=1), h


def ssd(x: Tensor, dt: Tensor, a: Tensor, B: Tensor, C: Tensor,
        state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Mamba-2's state-space dual recurrence, one token at a time: one scalar decay exp(Δ_t,h a_h)
    per head and token; head h reads group g = h // (H / G) of B and C, as grouped-query attention
    shares keys and values.

        h_t = exp(Δ_t a) · h_{t−1} + Δ_t x_t ⊗ B_t,    y_t = h_t C_t        (per head)

    x (B, T, H, D); dt (B, T, H); a (H,), ≤ 0 for a decay; B, C (B, T, G, N) with G dividing H;
    state h_0 (B, H, D, N). Returns (y (B, T, H, D), h_T (B, H, D, N)). With G = 1 and D = 1 it is
    ``selective_scan`` over H channels whose rows of A are each one value, A[h, n] = a_h.
    """
    heads, groups = x.shape[2], B.shape[2]
    if heads % groups:
        raise InputError(f"reference.ssd: heads={heads} (x's dim 2) must be a multiple of groups={groups} "
                         f"(B's dim 2); give B and C (B, T, G, N) with G dividing H")
    B, C = B.repeat_interleave(heads // groups, dim=2), C.repeat_interleave(heads // groups, dim=2)  # (B, T, H, N)
    h = x.new_zeros(x.shape[0], heads, x.shape[3], B.shape[-1]) if state is None else state
    ys = []
    for t in range(x.shape[1]):
        decay = torch.exp(dt[:, t] * a)[:, :, None, None]                      # (B, H, 1, 1)
        h = decay * h + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :, None, :]
        ys.append(torch.einsum("bhdn,bhn->bhd", h, C[:, t]))
    return torch.stack(ys, dim=1), h


# -- linear attention -------------------------------------------------------------------------------
def linear_attention(q: Tensor, k: Tensor, v: Tensor, gamma: Tensor | None = None, *, feature_map: str = "elu",
                     normalize: bool | None = None, scale: float | None = None, eps: float = 1e-6,
                     state: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Causal linear attention with a per-head decay, as a recurrence over a (D × D_v) state per head:

        S_t = γ S_{t−1} + φ(k_t) v_tᵀ,    z_t = γ z_{t−1} + φ(k_t)
        o_t = S_tᵀ φ(q_t) · s    or, normalised,    o_t = S_tᵀ φ(q_t) / (z_tᵀ φ(q_t) + ε)

    q, k (B, T, H, D); v (B, T, H, D_v); gamma (H,) in (0, 1], the decay of each head (None: 1, plain
    linear attention; RetNet's is γ_h = 1 − 2^(−5−h)). feature_map: ``elu`` (φ = elu + 1, positive,
    so z is too) or ``identity``. normalize: divide by z_tᵀ φ(q_t) + ε (None: for elu only). scale: s,
    which multiplies φ(q_t) (None: 1 for elu, D^−½ for identity, as softmax attention scales q).
    eps: ε, kept off zero (1e-6, as fast-transformers, the authors' code; 0 for the exact ratio).
    state (S_0 (B, H, D, D_v), z_0 (B, H, D)). Returns (o (B, T, H, D_v), (S_T, z_T)).
    """
    if feature_map not in FEATURE_MAPS:
        raise InputError(f"reference.linear_attention: feature_map={feature_map!r} is not one of "
                         f"{', '.join(FEATURE_MAPS)}")
    normalize = feature_map == "elu" if normalize is None else normalize
    scale = (1.0 if feature_map == "elu" else q.shape[-1] ** -0.5) if scale is None else scale
    phi = (lambda t: F.elu(t) + 1) if feature_map == "elu" else (lambda t: t)
    q, k = phi(q) * scale, phi(k)
    batch, length, heads, width = k.shape
    if state is None:
        S, z = k.new_zeros(batch, heads, width, v.shape[-1]), k.new_zeros(batch, heads, width)
    else:
        S, z = state
    gamma = k.new_ones(heads) if gamma is None else gamma
    outs = []
    for t in range(length):
        S = gamma[:, None, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]   # φ(k_t) v_tᵀ (B, H, D, D_v)
        z = gamma[:, None] * z + k[:, t]
        o = torch.einsum("bhde,bhd->bhe", S, q[:, t])
        if normalize:
            o = o / (torch.einsum("bhd,bhd->bh", z, q[:, t])[..., None] + eps)
        outs.append(o)
    return torch.stack(outs, dim=1), (S, z)


# -- recurrent cells (torch.nn's layout: the gates stacked along dim 0 of weight_ih and weight_hh) ---
def rnn(x: Tensor, weight_ih: Tensor, weight_hh: Tensor, bias_ih: Tensor | None = None,
        bias_hh: Tensor | None = None, state: Tensor | None = None, *,
        nonlinearity: str = "tanh") -> tuple[Tensor, Tensor]:
    """The Elman cell of torch.nn.RNNCell:

        h_t = φ(W_ih x_t + b_ih + W_hh h_{t−1} + b_hh),    φ = tanh or relu

    x (B, T, I); weight_ih (H, I); weight_hh (H, H); bias_ih, bias_hh (H,) or None; state h_0 (B, H).
    Returns (h_1..h_T (B, T, H), h_T (B, H)).
    """
    if nonlinearity not in NONLINEARITIES:
        raise InputError(f"reference.rnn: nonlinearity={nonlinearity!r} is not one of {', '.join(NONLINEARITIES)}")
    phi = torch.tanh if nonlinearity == "tanh" else torch.relu
    h = x.new_zeros(x.shape[0], weight_hh.shape[1]) if state is None else state
    hs = []
    for t in range(x.shape[1]):
        h = phi(F.linear(x[:, t], weight_ih, bias_ih) + F.linear(h, weight_hh, bias_hh))
        hs.append(h)
    return torch.stack(hs, dim=1), h


def lstm(x: Tensor, weight_ih: Tensor, weight_hh: Tensor, bias_ih: Tensor | None = None,
         bias_hh: Tensor | None = None,
         state: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """The LSTM cell of torch.nn.LSTMCell, gates stacked i, f, g, o:

        i, f, g, o = W_ih x_t + b_ih + W_hh h_{t−1} + b_hh     (each (B, H))
        c_t = σ(f) ⊙ c_{t−1} + σ(i) ⊙ tanh(g),    h_t = σ(o) ⊙ tanh(c_t)

    x (B, T, I); weight_ih (4H, I); weight_hh (4H, H); bias_ih, bias_hh (4H,) or None; state
    (h_0, c_0), each (B, H). Returns (h_1..h_T (B, T, H), (h_T, c_T)).
    """
    if state is None:
        h = c = x.new_zeros(x.shape[0], weight_hh.shape[1])
    else:
        h, c = state
    hs = []
    for t in range(x.shape[1]):
        i, f, g, o = (F.linear(x[:, t], weight_ih, bias_ih) + F.linear(h, weight_hh, bias_hh)).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        hs.append(h)
    return torch.stack(hs, dim=1), (h, c)


def gru(x: Tensor, weight_ih: Tensor, weight_hh: Tensor, bias_ih: Tensor | None = None,
        bias_hh: Tensor | None = None, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The GRU cell of torch.nn.GRUCell (and cuDNN), gates stacked r, z, n; the reset gate multiplies
    W_hn h + b_hn after the product (Cho et al.'s published form resets h before it):

        r = σ(W_ir x_t + b_ir + W_hr h_{t−1} + b_hr),    z = σ(W_iz x_t + b_iz + W_hz h_{t−1} + b_hz)
        n = tanh(W_in x_t + b_in + r ⊙ (W_hn h_{t−1} + b_hn)),    h_t = (1 − z) ⊙ n + z ⊙ h_{t−1}

    x (B, T, I); weight_ih (3H, I); weight_hh (3H, H); bias_ih, bias_hh (3H,) or None; state h_0
    (B, H). Returns (h_1..h_T (B, T, H), h_T (B, H)).
    """
    h = x.new_zeros(x.shape[0], weight_hh.shape[1]) if state is None else state
    hs = []
    for t in range(x.shape[1]):
        x_r, x_z, x_n = F.linear(x[:, t], weight_ih, bias_ih).chunk(3, dim=-1)
        h_r, h_z, h_n = F.linear(h, weight_hh, bias_hh).chunk(3, dim=-1)
        r, z = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
        n = torch.tanh(x_n + r * h_n)
        h = (1 - z) * n + z * h
        hs.append(h)
    return torch.stack(hs, dim=1), h

