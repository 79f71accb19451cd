"""Attention against textbook results: a worked example, permutation equivariance, and the
closed-form backward of softmax attention."""
from __future__ import annotations

import torch

import seqzoo
from seqzoo.functional import masked_softmax_attend
from seqzoo.nn.attention import AttentionConfig, MultiHeadAttention, self_attention_inputs


def test_worked_example_identity_projections_no_scaling():
    """x₀=[1,0,1,0], x₁=[0,1,0,1], x₂=[1,1,0,0] attending to themselves with q = k = v = x:
    row 0 scores [2, 0, 1] and row 2 scores [1, 1, 2] (not the 0.58/0.08/0.34 often quoted)."""
    x = torch.tensor([[1.0, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]])[None, None]  # (1, 1, 3, 4)
    score = seqzoo.registry().create("score", {"kind": "dot", "scale": 1.0}, 4, 4, 1)
    weights = masked_softmax_attend(score.scores(x, x), torch.eye(3)[None, None])  # A @ I = A
    expected_0 = torch.tensor([0.6652, 0.0900, 0.2447])
    expected_2 = torch.tensor([0.2119, 0.2119, 0.5761])
    torch.testing.assert_close(weights[0, 0, 0], expected_0, atol=1e-4, rtol=0)
    torch.testing.assert_close(weights[0, 0, 2], expected_2, atol=1e-4, rtol=0)
    # the fused kernel gives the same output rows
    out = score.attend(x, x, x)
    torch.testing.assert_close(out[0, 0, 0], expected_0 @ x[0, 0], atol=1e-4, rtol=0)


def test_self_attention_without_positions_is_permutation_equivariant():
    # Parts are injected: any ScoreFunction module serves (here the registry's scaled_dot).
    score = seqzoo.registry().create("score", "scaled_dot", 4, 4, 4)
    attention = MultiHeadAttention(16, AttentionConfig(heads=4), score=score)
    position = seqzoo.registry().create("position", "none", 16, 4, 4, 32)
    x = torch.randn(2, 7, 16)
    perm = torch.randperm(7)
    inputs = self_attention_inputs(position, torch.arange(7)[None], causal=False)
    with torch.no_grad():
        torch.testing.assert_close(attention(x, inputs)[:, perm], attention(x[:, perm], inputs),
                                   atol=1e-6, rtol=1e-5)


def test_autograd_matches_the_closed_form_softmax_attention_backward():
    """dV = Aᵀ dO; dA = dO Vᵀ; dS = A ⊙ (dA − rowsum(A ⊙ dA)); dQ = s·dS K; dK = s·dSᵀ Q."""
    score = seqzoo.registry().create("score", "scaled_dot", 8, 8, 1)
    s = score.scale
    q, k, v = (torch.randn(1, 1, 5, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = seqzoo.interfaces.ScoreFunction.attend(score, q, k, v)  # the plain (unfused) path
    d_out = torch.randn_like(out)
    out.backward(d_out)
    with torch.no_grad():
        a = torch.softmax(s * q @ k.transpose(-2, -1), dim=-1)
        d_v = a.transpose(-2, -1) @ d_out
        d_a = d_out @ v.transpose(-2, -1)
        d_s = a * (d_a - (a * d_a).sum(-1, keepdim=True))
        d_q = s * d_s @ k
        d_k = s * d_s.transpose(-2, -1) @ q
    torch.testing.assert_close(v.grad, d_v)
    torch.testing.assert_close(q.grad, d_q)
    torch.testing.assert_close(k.grad, d_k)
    # every query–key pair has a direct gradient path: ∂out_i/∂k_j ≠ 0 for all i, j
    assert (d_s.abs() > 0).all()
