"""Shaw relative key embeddings: the bias against q_i·w_{clip(j−i, k)}/√D written out for every
pair (docs/formulas.md §7.1), gradients, per-row positions and cached decoding in a built model."""
from __future__ import annotations

import math

import torch
from torch.func import functional_call

import seqzoo
from seqzoo.plugins.position.shaw import ShawRelative

NAME = "shaw"


def scheme(heads: int = 4, head_dim: int = 8, **params) -> ShawRelative:
    return seqzoo.registry().create("position", {"kind": NAME, **params}, heads * head_dim, head_dim, heads, 64)


def naive_bias(q: torch.Tensor, table: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
               k: int) -> torch.Tensor:
    """e_ij − q_i·k_j/√D = q_i·a_ij/√D with a_ij = w_{clip(p_j − p_i, k)}, one pair at a time."""
    b, h, t, d = q.shape
    q_pos, k_pos = q_pos.expand(b, -1), k_pos.expand(b, -1)
    out = torch.empty(b, h, t, k_pos.shape[1], dtype=q.dtype)
    for row in range(b):
        for i in range(t):
            for j in range(k_pos.shape[1]):
                offset = max(-k, min(k, int(k_pos[row, j] - q_pos[row, i])))
                out[row, :, i, j] = q[row, :, i] @ table[offset + k] / math.sqrt(d)
    return out


@torch.no_grad()
def test_bias_equals_naive_pairwise_formula_with_clipping():
    s = scheme(max_distance=3)
    q = torch.randn(1, 4, 4, 8)
    q_pos, k_pos = torch.tensor([[6, 7, 8, 9]]), torch.arange(10)[None]
    bias = s.bias(q, q_pos, k_pos)
    assert bias.shape == (1, 4, 4, 10)
    torch.testing.assert_close(bias, naive_bias(q, s.table.weight, q_pos, k_pos, 3))


@torch.no_grad()
def test_bias_uses_positive_offsets_bidirectional():
    s = scheme(max_distance=2)
    s.causal = False
    q, pos = torch.randn(1, 4, 6, 8), torch.arange(6)[None]
    torch.testing.assert_close(s.bias(q, pos, pos), naive_bias(q, s.table.weight, pos, pos, 2))


def test_logits_equal_query_dot_key_plus_relative_key():
    s = scheme(max_distance=2)
    score = seqzoo.registry().create("score", "scaled_dot", 8, 8, 4)
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8)
    pos = torch.arange(5)[None]
    logits = score.scores(q, k) + s.bias(q, pos, pos)
    expected = torch.empty(1, 4, 5, 5)
    for i in range(5):
        for j in range(5):
            a = s.table.weight[max(-2, min(2, j - i)) + 2]
            expected[0, :, i, j] = (q[0, :, i] * (k[0, :, j] + a)).sum(-1) / math.sqrt(8)
    torch.testing.assert_close(logits, expected.detach())


@torch.no_grad()
def test_per_row_positions_with_offsets():
    s = scheme(max_distance=3)
    q = torch.randn(2, 4, 4, 8)
    q_pos = torch.tensor([[0, 1, 2, 3], [7, 8, 9, 10]])
    k_pos = torch.tensor([[0, 0, 0, 1, 2, 3], [5, 6, 7, 8, 9, 10]])  # row 0 left-padded
    bias = s.bias(q, q_pos, k_pos)
    torch.testing.assert_close(bias, naive_bias(q, s.table.weight, q_pos, k_pos, 3))


@torch.no_grad()
def test_one_query_against_cached_keys_matches_last_row_of_full_bias():
    s = scheme(max_distance=4)
    q, pos = torch.randn(2, 4, 7, 8), torch.arange(7)[None]
    full = s.bias(q, pos, pos)
    step = s.bias(q[:, :, -1:], pos[:, -1:], pos)
    torch.testing.assert_close(step, full[:, :, -1:])


class BiasOf(torch.nn.Module):
    """Exposes a scheme's ``bias`` as ``forward`` so ``functional_call`` can swap its weights."""

    def __init__(self, s: ShawRelative) -> None:
        super().__init__()
        self.s = s

    def forward(self, q, q_pos, k_pos):
        return self.s.bias(q, q_pos, k_pos)


def test_gradcheck_float64_wrt_query_and_table():
    s = scheme(heads=2, head_dim=3, max_distance=2).double()
    q = torch.randn(2, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    table = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    q_pos, k_pos = torch.tensor([[3, 4, 5], [0, 1, 2]]), torch.tensor([[0, 1, 2, 3, 4, 5]])
    bias = BiasOf(s)
    assert torch.autograd.gradcheck(
        lambda q, w: functional_call(bias, {"s.table.weight": w}, (q, q_pos, k_pos)), (q, table))


# -- in a built model ---------------------------------------------------------------------------

def model():
    return seqzoo.build("tiny-gpt", [f"model.position={NAME}"], device="cpu").eval()


def scheme_of(m: torch.nn.Module) -> ShawRelative:
    """The model's position scheme, wherever the architecture keeps it."""
    found = [mod for mod in m.modules() if isinstance(mod, ShawRelative)]
    assert len(found) == 1
    return found[0]


def test_builds_from_recipe():
    m = seqzoo.build("tiny-gpt", [f"model.position={{kind: {NAME}, max_distance: 4}}"], device="cpu")
    assert scheme_of(m).table.weight.shape == (9, 16)
    assert m.recipe["model"]["position"] == {"kind": NAME, "max_distance": 4}
