"""ALiBi: slopes from docs/formulas.md §5, the bias against −m·|i−j| written out, BLOOM's
key-only form, and cached decoding in a built model."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.plugins.position.alibi import Alibi, alibi_slopes

NAME = "alibi"

# docs/formulas.md §5 (and the paper repo's get_slopes), written out by hand.
EXPECTED_SLOPES = {
    8: [2.0 ** -e for e in (1, 2, 3, 4, 5, 6, 7, 8)],
    6: [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3],
    12: [2.0 ** -e for e in (1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5)],
    16: [2.0 ** -(e / 2) for e in range(1, 17)],
}


def scheme(heads: int = 4, head_dim: int = 8) -> Alibi:
    return seqzoo.registry().create("position", NAME, heads * head_dim, head_dim, heads, 64)


@pytest.mark.parametrize("heads", [8, 6, 12, 16])
def test_slopes_match_formulas_for_head_count(heads):
    assert alibi_slopes(heads) == pytest.approx(EXPECTED_SLOPES[heads], rel=1e-12)
    assert scheme(heads).slopes == pytest.approx(EXPECTED_SLOPES[heads], rel=1e-12)


def test_slopes_for_twelve_heads_match_printed_decimals():
    assert alibi_slopes(12)[8:] == pytest.approx([0.7071, 0.3536, 0.1768, 0.0884], abs=1e-4)


def test_bias_equals_minus_slope_times_distance_for_all_pairs():
    s = scheme(heads=6)
    q = torch.randn(1, 6, 4, 8)
    q_pos, k_pos = torch.tensor([[3, 4, 5, 6]]), torch.arange(7)[None]
    bias = s.bias(q, q_pos, k_pos)
    assert bias.shape == (1, 6, 4, 7)
    expected = torch.empty(1, 6, 4, 7)
    for h in range(6):
        for i in range(4):
            for j in range(7):
                expected[0, h, i, j] = -EXPECTED_SLOPES[6][h] * abs(int(q_pos[0, i]) - int(k_pos[0, j]))
    torch.testing.assert_close(bias, expected)


def test_softmax_equals_bloom_key_only_form_causal():
    heads, t = 8, 6
    logits = torch.randn(1, heads, t, t, dtype=torch.float64)
    pos = torch.arange(t)[None]
    ours = logits + scheme(heads).bias(logits, pos, pos)
    # BLOOM adds m_h · pos_j, the same for every query row (docs/formulas.md §5).
    slopes = torch.tensor(EXPECTED_SLOPES[heads], dtype=torch.float64)
    bloom = logits + slopes[:, None, None] * pos.to(torch.float64)[:, None, :]
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    ours = ours.masked_fill(future, float("-inf")).softmax(-1)
    bloom = bloom.masked_fill(future, float("-inf")).softmax(-1)
    torch.testing.assert_close(ours, bloom)


def test_bias_is_symmetric_bidirectional():
    s = scheme()
    s.causal = False
    pos = torch.arange(5)[None]
    bias = s.bias(torch.randn(1, 4, 5, 8), pos, pos)
    torch.testing.assert_close(bias, bias.transpose(-2, -1))
    assert torch.all(bias[..., 0, 1:] < 0)  # future keys are penalised too, not rewarded


def test_per_row_positions_match_each_row_alone_with_offsets():
    s = scheme()
    q = torch.randn(2, 4, 3, 8)
    q_pos = torch.tensor([[0, 1, 2], [5, 6, 7]])
    k_pos = torch.tensor([[0, 1, 2], [5, 6, 7]])
    bias = s.bias(q, q_pos, k_pos)
    assert bias.shape == (2, 4, 3, 3)
    for b in range(2):
        torch.testing.assert_close(bias[b:b + 1], s.bias(q[b:b + 1], q_pos[b:b + 1], k_pos[b:b + 1]))
    torch.testing.assert_close(bias[0], bias[1])  # only distances matter


def test_bias_is_built_in_float32_then_cast_to_query_dtype():
    s = scheme(heads=12).to(torch.bfloat16)
    assert list(s.parameters()) == [] and list(s.buffers()) == []
    pos = torch.arange(300)[None]
    q = torch.randn(1, 12, 300, 8, dtype=torch.bfloat16)
    bias = s.bias(q, pos, pos)
    assert bias.dtype == torch.bfloat16
    expected = s.bias(q.float(), pos, pos).to(torch.bfloat16)
    assert torch.equal(bias, expected)


# -- in a built model ---------------------------------------------------------------------------

def model():
    return seqzoo.build("tiny-gpt", [f"model.position={NAME}"], device="cpu").eval()


def scheme_of(m: torch.nn.Module) -> Alibi:
    """The model's position scheme, wherever the architecture keeps it."""
    found = [mod for mod in m.modules() if isinstance(mod, Alibi)]
    assert len(found) == 1
    return found[0]


def test_builds_from_recipe():
    m = model()
    assert scheme_of(m).slopes == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]  # tiny-gpt has 4 heads
    assert m.recipe["model"]["position"] == {"kind": NAME}
