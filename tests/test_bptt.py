"""Backpropagation through time, by hand, against autograd through the seqzoo cells.

For a vanilla RNN h_t = φ(a_t), a_t = W_x x_t + W_h h_{t−1} + b, and a loss summed over steps,
L = Σ_t L_t(h_t), the BPTT recursion is

    δ_t = φ'(a_t) ⊙ (∂L_t/∂h_t + W_hᵀ δ_{t+1}),   δ_{T+1} = 0
    ∂L/∂W_h = Σ_t δ_t h_{t−1}ᵀ,   ∂L/∂W_x = Σ_t δ_t x_tᵀ,   ∂L/∂b = Σ_t δ_t

(summed over the batch as well). Since ∂h_t/∂h_{t−1} = diag(φ'(a_t)) W_h, the gradient reaching a
state k steps back is a product of k such Jacobians: with ‖W_h‖ < 1 it shrinks geometrically
(vanishing gradients), with a large ‖W_h‖ it can grow geometrically (exploding gradients, which
gradient-norm clipping tames). The LSTM's cell state passes gradients back multiplied by the forget
gate only, so with f near 1 they fade far slower.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import seqzoo

B, T, I, H, V = 2, 6, 3, 4, 5


def rnn(nonlinearity: str = "tanh", hidden: int = H, inputs: int = I, dtype=torch.float64):
    return seqzoo.registry().create("cell", {"kind": "rnn", "nonlinearity": nonlinearity},
                                    inputs, hidden).to(dtype)


def bptt(cell, x, h0, dL_dh):
    """The recursion above, written out: returns (∂L/∂W_x, ∂L/∂W_h, ∂L/∂b) for per-step loss
    gradients dL_dh[t] = ∂L_t/∂h_t (B, H)."""
    w_x, w_h = cell.weight_ih.detach(), cell.weight_hh.detach()
    b = (cell.bias_ih + cell.bias_hh).detach()
    phi, dphi = ((torch.tanh, lambda a: 1 - torch.tanh(a) ** 2) if cell.nonlinearity == "tanh"
                 else (torch.relu, lambda a: (a > 0).to(a.dtype)))
    hs, pre = [h0], []
    for t in range(x.shape[1]):  # forward, keeping a_t and h_t
        pre.append(x[:, t] @ w_x.T + hs[-1] @ w_h.T + b)
        hs.append(phi(pre[-1]))
    g_x, g_h, g_b = torch.zeros_like(w_x), torch.zeros_like(w_h), torch.zeros_like(b)
    delta_next = torch.zeros_like(h0)
    for t in reversed(range(x.shape[1])):  # backward: δ_t from δ_{t+1}
        delta = dphi(pre[t]) * (dL_dh[t] + delta_next @ w_h)  # (W_hᵀ δ) per row is δ @ W_h
        g_h += delta.T @ hs[t]  # hs[t] is h_{t−1}
        g_x += delta.T @ x[:, t]
        g_b += delta.sum(0)
        delta_next = delta
    return g_x, g_h, g_b


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_bptt_recursion_equals_autograd_with_mse_at_every_step(nonlinearity):
    cell, readout = rnn(nonlinearity), torch.nn.Linear(H, V).double()
    x, h0 = torch.randn(B, T, I, dtype=torch.float64), torch.randn(B, H, dtype=torch.float64)
    target = torch.randn(B, T, V, dtype=torch.float64)
    hs, _ = cell(x, h0)  # the fused kernel
    loss = 0.5 * (readout(hs) - target).pow(2).sum()  # L = Σ_t L_t, L_t = ½‖V h_t + c − y_t‖²
    loss.backward()
    with torch.no_grad():
        dL_dh = [(readout(hs[:, t]) - target[:, t]) @ readout.weight for t in range(T)]  # Vᵀ(ŷ_t − y_t)
    g_x, g_h, g_b = bptt(cell, x, h0, dL_dh)
    torch.testing.assert_close(cell.weight_ih.grad, g_x)
    torch.testing.assert_close(cell.weight_hh.grad, g_h)
    torch.testing.assert_close(cell.bias_ih.grad, g_b)
    torch.testing.assert_close(cell.bias_hh.grad, g_b)  # b_ih and b_hh enter only as a sum


def test_softmax_cross_entropy_error_term_is_prediction_minus_target():
    """With y_t = softmax(z_t), z_t = V h_t + c and L_t = −Σ_k y'_t,k log y_t,k (y'_t one-hot),
    ∂L_t/∂z_t = y_t − y'_t, so the BPTT input per step is ∂L_t/∂h_t = Vᵀ(y_t − y'_t)."""
    cell, readout = rnn(), torch.nn.Linear(H, V).double()
    x, h0 = torch.randn(B, T, I, dtype=torch.float64), torch.zeros(B, H, dtype=torch.float64)
    labels = torch.randint(0, V, (B, T))
    hs, _ = cell(x, h0)
    logits = readout(hs)
    logits.retain_grad()
    F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum").backward()
    y, y_true = logits.detach().softmax(-1), F.one_hot(labels, V).double()
    torch.testing.assert_close(logits.grad, y - y_true)
    dL_dh = [(y[:, t] - y_true[:, t]) @ readout.weight.detach() for t in range(T)]
    g_x, g_h, g_b = bptt(cell, x, h0, dL_dh)
    torch.testing.assert_close(cell.weight_ih.grad, g_x)
    torch.testing.assert_close(cell.weight_hh.grad, g_h)
    torch.testing.assert_close(cell.bias_ih.grad, g_b)


def state_gradient_norms(cell, x, steps: int) -> list[float]:
    """‖∂L/∂s_t‖ for L = u·h_T and the state s_t = h_t (or (h_t, c_t)), t = T..1: index k is k
    steps back from the loss. One backward pass; states are kept with retain_grad."""
    state = cell.initial_state(1, dtype=x.dtype)
    kept = []
    for t in range(steps):
        _, state = cell.step(x[:, t], state)
        parts = [state] if isinstance(state, torch.Tensor) else list(state)
        for p in parts:
            p.retain_grad()
        kept.append(parts)
    u = torch.linspace(-1, 1, cell.hidden_size, dtype=x.dtype)
    (cell.output(state)[0] @ u).backward()
    norms = [math.sqrt(sum(float(p.grad.pow(2).sum()) for p in parts if p.grad is not None))
             for parts in kept]
    return norms[::-1]


def geometric_fit(norms: list[float]) -> tuple[float, float]:
    """Least-squares line through log‖g_k‖ against k -> (ratio per step e^slope, R²)."""
    k = torch.arange(len(norms), dtype=torch.float64)
    y = torch.tensor(norms, dtype=torch.float64).log()
    slope = ((k - k.mean()) * (y - y.mean())).sum() / (k - k.mean()).pow(2).sum()
    fit = y.mean() + slope * (k - k.mean())
    r2 = 1 - (y - fit).pow(2).sum() / (y - y.mean()).pow(2).sum()
    return math.exp(slope), float(r2)


def orthogonal(n: int, scale: float) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64))
    return scale * q  # every singular value equals scale: ‖W_h v‖ = scale·‖v‖


def test_tanh_rnn_gradient_vanishes_geometrically_and_lstm_decays_slower():
    hidden, steps = 16, 20
    x = 0.05 * torch.randn(1, steps, 4, dtype=torch.float64)  # small inputs: tanh near linear
    cell = rnn(hidden=hidden, inputs=4)
    with torch.no_grad():
        cell.weight_hh.copy_(orthogonal(hidden, 0.5))  # ‖W_h‖₂ = 0.5
        cell.bias_ih.zero_()
        cell.bias_hh.zero_()
    norms = state_gradient_norms(cell, x, steps)
    ratios = [b / a for a, b in zip(norms, norms[1:])]
    ratio, r2 = geometric_fit(norms)
    # ‖∂h_t/∂h_{t−1}‖ ≤ max φ' · ‖W_h‖ ≤ 0.5, and near-linear tanh makes it ≈ 0.5 at every step
    assert all(0.4 < r <= 0.5 + 1e-9 for r in ratios), ratios
    assert abs(ratio - 0.5) < 0.05 and r2 > 0.999

    # An LSTM of the same size and weight scale, with the forget gate biased open (b_f = 2,
    # f ≈ σ(2) ≈ 0.88, the usual "forget bias" init): the gradient rides the cell state.
    lstm = seqzoo.registry().create("cell", "lstm", 4, hidden).double()
    with torch.no_grad():
        lstm.bias_ih.zero_()
        lstm.bias_hh.zero_()
        lstm.bias_ih[hidden:2 * hidden] = 2.0  # gate order i, f, g, o
    lstm_norms = state_gradient_norms(lstm, x, steps)
    lstm_ratio, _ = geometric_fit(lstm_norms[1:])  # from step 1 on, the path through c dominates
    assert lstm_ratio > 0.8 > 0.55 > ratio
    assert lstm_norms[-1] / lstm_norms[0] > 1e3 * norms[-1] / norms[0]


def test_tanh_rnn_gradient_explodes_geometrically_with_large_recurrent_weights():
    hidden, steps = 16, 15
    x = 1e-6 * torch.randn(1, steps, 4, dtype=torch.float64)  # h stays tiny: no tanh saturation
    cell = rnn(hidden=hidden, inputs=4)
    with torch.no_grad():
        cell.weight_hh.copy_(orthogonal(hidden, 1.5))
        cell.bias_ih.zero_()
        cell.bias_hh.zero_()
    norms = state_gradient_norms(cell, x, steps)
    ratio, r2 = geometric_fit(norms)
    assert abs(ratio - 1.5) < 0.05 and r2 > 0.999
    assert norms[-1] > 100 * norms[0]


def test_clip_grad_norm_caps_an_exploding_rnn_gradient_at_the_cap():
    hidden, steps, cap = 16, 30, 1.0
    cell = rnn(hidden=hidden, inputs=4)
    with torch.no_grad():
        cell.weight_hh.copy_(orthogonal(hidden, 1.5))
        cell.bias_ih.zero_()
        cell.bias_hh.zero_()
    x = 1e-6 * torch.randn(2, steps, 4, dtype=torch.float64)
    hs, _ = cell(x)
    hs[:, -1].pow(2).sum().mul(1e12).backward()  # a loss at the end only: its gradient grows back in time
    raw = [p.grad.clone() for p in cell.parameters()]
    total = torch.nn.utils.clip_grad_norm_(cell.parameters(), max_norm=cap)
    assert total > 1e3 * cap  # the unclipped norm exploded
    clipped = torch.sqrt(sum(p.grad.pow(2).sum() for p in cell.parameters()))
    torch.testing.assert_close(clipped, torch.tensor(cap, dtype=torch.float64), rtol=1e-5, atol=0)
    for before, p in zip(raw, cell.parameters()):  # same direction, only shorter
        torch.testing.assert_close(p.grad, before * (cap / total), rtol=1e-5, atol=0)
