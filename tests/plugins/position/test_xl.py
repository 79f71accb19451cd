"""Transformer-XL relative encoding: the full logits against Dai et al. (2019)'s
[(q+u)·k + (q+v)·W_R R_{i−j}]/√D written out for every pair, gradients, per-row positions and
cached decoding in a built model."""
from __future__ import annotations

import math

import torch
from torch.func import functional_call

import seqzoo
from seqzoo.plugins.position.xl import TransformerXLRelative

NAME = "xl"


def scheme(heads: int = 4, head_dim: int = 8, dim: int = 32) -> TransformerXLRelative:
    s = seqzoo.registry().create("position", NAME, dim, head_dim, heads, 64)
    with torch.no_grad():  # u, v start at zero; random values make the test see them
        s.u.normal_()
        s.v.normal_()
    return s


def sinusoid(p: int, dim: int) -> torch.Tensor:
    """Vaswani et al. (2017), paper layout (docs/formulas.md §1): sin on even dims, cos on odd ones."""
    out = torch.empty(dim, dtype=torch.float64)
    for c in range(dim):
        angle = p / 10000 ** ((c - c % 2) / dim)
        out[c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    return out


def naive_logits(s: TransformerXLRelative, q, k, q_pos, k_pos) -> torch.Tensor:
    """[(q_i + u)·k_j + (q_i + v)·(W_R R_{p_i − p_j})] / √D, one pair at a time, in float64."""
    b, h, t, d = q.shape
    q, k = q.double(), k.double()
    w, u, v = s.proj.weight.double(), s.u.double(), s.v.double()
    q_pos, k_pos = q_pos.expand(b, -1), k_pos.expand(b, -1)
    out = torch.empty(b, h, t, k.shape[2], dtype=torch.float64)
    for row in range(b):
        for i in range(t):
            for j in range(k.shape[2]):
                r = (w @ sinusoid(int(q_pos[row, i] - k_pos[row, j]), s.dim)).view(h, d)  # W_R R_{i−j}
                content = ((q[row, :, i] + u) * k[row, :, j]).sum(-1)
                position = ((q[row, :, i] + v) * r).sum(-1)
                out[row, :, i, j] = (content + position) / math.sqrt(d)
    return out


def logits(s: TransformerXLRelative, q, k, q_pos, k_pos) -> torch.Tensor:
    """What the attention core computes: rotate, then scaled_dot's scores plus the bias."""
    score = seqzoo.registry().create("score", "scaled_dot", s.head_dim, s.head_dim, s.heads)
    q2, k2 = s.rotate(q, k, q_pos, q_pos)
    return score.scores(q2, k2) + s.bias(q2, q_pos, k_pos)


@torch.no_grad()
def test_logits_equal_naive_paper_formula_for_all_pairs():
    s = scheme()
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8)
    pos = torch.arange(5)[None]
    got = logits(s, q, k, pos, pos)
    torch.testing.assert_close(got.double(), naive_logits(s, q, k, pos, pos), atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_rotate_adds_u_to_queries_and_leaves_keys():
    s = scheme(heads=4, head_dim=8)
    q, k = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 3, 8)  # grouped kv heads
    pos = torch.arange(3)[None]
    q2, k2 = s.rotate(q, k, pos, pos)
    torch.testing.assert_close(q2, q + s.u[None, :, None, :])
    assert k2 is k


@torch.no_grad()
def test_bias_equals_naive_position_term_bidirectional():
    s = scheme()
    s.causal = False
    q, k = torch.randn(1, 4, 6, 8), torch.zeros(1, 4, 6, 8)  # k = 0 leaves only the position term
    pos = torch.arange(6)[None]
    torch.testing.assert_close(logits(s, q, k, pos, pos).double(), naive_logits(s, q, k, pos, pos),
                               atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_per_row_positions_with_offsets():
    s = scheme()
    q, k = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 5, 8)
    q_pos = torch.tensor([[2, 3, 4], [9, 10, 11]])
    k_pos = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 9, 10, 11]])  # row 1 left-padded
    got = s.bias(s.rotate(q, k, q_pos, q_pos)[0], q_pos, k_pos)
    expected = naive_logits(s, q, torch.zeros_like(k), q_pos, k_pos)  # k = 0: position term only
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_one_query_against_cached_keys_matches_last_row_of_full_bias():
    s = scheme()
    q, pos = torch.randn(2, 4, 7, 8), torch.arange(7)[None]
    q2 = s.rotate(q, q, pos, pos)[0]
    full = s.bias(q2, pos, pos)
    step = s.bias(q2[:, :, -1:], pos[:, -1:], pos)
    torch.testing.assert_close(step, full[:, :, -1:])


class LogitsOf(torch.nn.Module):
    """rotate + bias as one ``forward`` so ``functional_call`` can swap the scheme's weights."""

    def __init__(self, s: TransformerXLRelative) -> None:
        super().__init__()
        self.s = s

    def forward(self, q, k, q_pos, k_pos):
        q2, k2 = self.s.rotate(q, k, q_pos, q_pos)
        return q2 @ k2.transpose(-2, -1) / math.sqrt(self.s.head_dim) + self.s.bias(q2, q_pos, k_pos)


def test_gradcheck_float64_wrt_query_projection_u_and_v():
    s = scheme(heads=2, head_dim=3, dim=6).double()
    q = torch.randn(1, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 3, 3, dtype=torch.float64)
    w = torch.randn(6, 6, dtype=torch.float64, requires_grad=True)
    u = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([[4, 5, 6]])
    f = LogitsOf(s)
    assert torch.autograd.gradcheck(
        lambda q, w, u, v: functional_call(f, {"s.proj.weight": w, "s.u": u, "s.v": v}, (q, k, pos, pos)),
        (q, w, u, v))


# -- in a built model ---------------------------------------------------------------------------

def model():
    return seqzoo.build("tiny-gpt", [f"model.position={NAME}"], device="cpu").eval()


def scheme_of(m: torch.nn.Module) -> TransformerXLRelative:
    """The model's position scheme, wherever the architecture keeps it."""
    found = [mod for mod in m.modules() if isinstance(mod, TransformerXLRelative)]
    assert len(found) == 1
    return found[0]


def test_builds_from_recipe():
    m = model()
    s = scheme_of(m)
    assert s.proj.weight.shape == (64, 64)
    assert {n for n, _ in s.named_parameters()} == {"proj.weight", "u", "v"}
    assert m.recipe["model"]["position"] == {"kind": NAME}
