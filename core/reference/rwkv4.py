"""RWKV-4 (Peng et al., 2023, "RWKV: Reinventing RNNs for the Transformer Era"), token by token:
the WKV recurrence at its heart, the whole time-mix layer around it, and the channel mix, with the
tensors of transformers' ``RwkvSelfAttention`` and ``RwkvFeedForward`` (their (1, 1, C) token-shift
mixes given as (C,)). transformers' ``rwkv_linear_attention_cpu`` is the same recurrence; these are
written to be read.

Every channel c keeps a weighted average of the values it has seen, each token s weighted by
e^{k_s} and decayed by e^{w} per step since (w = −e^{time_decay} < 0), and the current token
weighted by e^{u + k_t} instead (u = ``time_first``, the bonus):

    wkv_t = (Σ_{s<t} e^{(t−1−s)w + k_s} v_s + e^{u + k_t} v_t) / (Σ_{s<t} e^{(t−1−s)w + k_s} + e^{u + k_t})

The sums are the state: a numerator and a denominator, kept as (num, den, max) with the true sums
num · e^{max} and den · e^{max}, ``max`` the largest exponent so far, so no e^{k} overflows. An
empty state has num = den = 0 and max = −1e38 (transformers' start).

Shape legend: B batch, T length, C model width, A the WKV width (transformers'
``attention_hidden_size``), F the channel mix's hidden width. Written to be read, not to be fast.
"""
from __future__ import annotations

import torch
from torch import Tensor

#: The ``max`` of an empty state: below every exponent, as transformers starts its CPU recurrence.
EMPTY = -1e38

State = tuple[Tensor, Tensor, Tensor]  # (num, den, max), each (B, A)


def wkv4(time_decay: Tensor, time_first: Tensor, k: Tensor, v: Tensor, *,
         state: State | None = None) -> tuple[Tensor, State]:
    """RWKV-4's WKV over T tokens, one step per token, stabilised by the running maximum:

        q = max(m, u + k_t)                                          the output's scale
        wkv_t = (e^{m−q} num + e^{u+k_t−q} v_t) / (e^{m−q} den + e^{u+k_t−q})
        m' = max(m + w, k_t)                                         the state's new scale
        num ← e^{m+w−m'} num + e^{k_t−m'} v_t,   den ← e^{m+w−m'} den + e^{k_t−m'},   m ← m'

    time_decay (A,) (w = −e^{time_decay}); time_first u (A,); k, v (B, T, A); state (num, den, max)
    (B, A) each (None: empty). Returns (wkv (B, T, A), (num, den, max) after the last token).
    """
    w = -torch.exp(time_decay)
    if state is None:
        num, den = k.new_zeros(k.shape[0], k.shape[2]), k.new_zeros(k.shape[0], k.shape[2])
        top = k.new_full((k.shape[0], k.shape[2]), EMPTY)
    else:
        num, den, top = state
    outs = []
    for k_t, v_t in zip(k.unbind(1), v.unbind(1)):
        q = torch.maximum(top, time_first + k_t)
        old, new = torch.exp(top - q), torch.exp(time_first + k_t - q)
        outs.append((old * num + new * v_t) / (old * den + new))
        q = torch.maximum(top + w, k_t)
        old, new = torch.exp(top + w - q), torch.exp(k_t - q)
        num, den, top = old * num + new * v_t, old * den + new, q
    return torch.stack(outs, dim=1), (num, den, top)


def _shifted(x: Tensor, prev: Tensor, mix: Tensor) -> Tensor:
    """x_t · μ + x_{t−1} · (1 − μ): the token shift of RWKV-4 (μ weighs the current token)."""
    return x * mix + prev * (1 - mix)


def rwkv4_time_mix(x: Tensor, weights: dict[str, Tensor], *,
                   state: tuple[Tensor, State] | None = None) -> tuple[Tensor, tuple[Tensor, State]]:
    """The RWKV-4 time-mix layer, one token at a time, with transformers' ``RwkvSelfAttention``
    tensors: ``time_decay time_first`` (A,), ``time_mix_key time_mix_value time_mix_receptance``
    (C,), ``key.weight value.weight receptance.weight`` (A, C) and ``output.weight`` (C, A).

        x^□ = x_t · μ_□ + x_{t−1} · (1 − μ_□)                   for □ in k, v, r
        k, v, r = key(x^k), value(x^v), receptance(x^r)
        y_t = output(σ(r) ⊙ wkv_t)                               wkv as ``wkv4``

    x (B, T, C); state (x_0 (B, C), the token before the first; the WKV state), None: zeros and an
    empty WKV state. Returns (y (B, T, C), (x_T, the WKV state after the last token)).
    """
    p = weights
    prev, wkv_state = (x.new_zeros(x.shape[0], x.shape[2]), None) if state is None else state
    ys = []
    for x_t in x.unbind(1):
        k = _shifted(x_t, prev, p["time_mix_key"]) @ p["key.weight"].T
        v = _shifted(x_t, prev, p["time_mix_value"]) @ p["value.weight"].T
        r = _shifted(x_t, prev, p["time_mix_receptance"]) @ p["receptance.weight"].T
        out, wkv_state = wkv4(p["time_decay"], p["time_first"], k[:, None], v[:, None], state=wkv_state)
        ys.append((torch.sigmoid(r) * out[:, 0]) @ p["output.weight"].T)
        prev = x_t
    return torch.stack(ys, dim=1), (prev, wkv_state)


def rwkv4_channel_mix(x: Tensor, weights: dict[str, Tensor], *,
                      state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The RWKV-4 channel mix (transformers' ``RwkvFeedForward``), one token at a time: a
    squared-ReLU feed-forward block over the token-shifted input, gated by a receptance. Tensors
    ``time_mix_key time_mix_receptance`` (C,), ``key.weight`` (F, C), ``value.weight`` (C, F),
    ``receptance.weight`` (C, C).

        y_t = σ(receptance(x^r)) ⊙ value(ReLU(key(x^k))²)

    x (B, T, C); state x_0 (B, C), the token before the first (None: zeros). Returns (y (B, T, C), x_T).
    """
    p = weights
    prev = x.new_zeros(x.shape[0], x.shape[2]) if state is None else state
    ys = []
    for x_t in x.unbind(1):
        k = _shifted(x_t, prev, p["time_mix_key"]) @ p["key.weight"].T
        r = _shifted(x_t, prev, p["time_mix_receptance"]) @ p["receptance.weight"].T
        ys.append(torch.sigmoid(r) * (torch.relu(k).square() @ p["value.weight"].T))
        prev = x_t
    return torch.stack(ys, dim=1), prev
