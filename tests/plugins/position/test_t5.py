"""T5 relative bias: the bucket tables of docs/formulas.md §6 in both directions, the bias as
a table lookup, gradients, config errors and cached decoding in a built model."""
from __future__ import annotations

import math

import pytest
import torch
from torch.func import functional_call

import seqzoo
from seqzoo.errors import ConfigError, RecipeError
from seqzoo.plugins.position.t5 import T5RelativeBias, relative_bucket

NAME = "t5"


def scheme(heads: int = 4, head_dim: int = 8, **params) -> T5RelativeBias:
    return seqzoo.registry().create("position", {"kind": NAME, **params}, heads * head_dim, head_dim, heads, 64)


def buckets_of(distances: list[int], bidirectional: bool) -> list[int]:
    return relative_bucket(torch.tensor(distances), bidirectional=bidirectional).tolist()


def reference_bucket(r: int, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> int:
    """docs/formulas.md §6 step by step, in plain Python floats."""
    if bidirectional:
        nb, offset, n = num_buckets // 2, (num_buckets // 2 if r > 0 else 0), abs(r)
    else:
        nb, offset, n = num_buckets, 0, max(-r, 0)
    max_exact = nb // 2
    if n < max_exact:
        return offset + n
    log_part = int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (nb - max_exact))
    return offset + min(nb - 1, max_exact + log_part)


# docs/formulas.md §6 tables: bucket -> inclusive range of n = |j − i| (None = unbounded).
BIDIRECTIONAL_RANGES = {8: (8, 11), 9: (12, 15), 10: (16, 22), 11: (23, 31), 12: (32, 45),
                        13: (46, 63), 14: (64, 90), 15: (91, None)}
CAUSAL_RANGES = {16: (16, 18), 17: (19, 20), 18: (21, 23), 30: (99, 112), 31: (113, None)}


def members(bucket_of_n: dict[int, int], bucket: int) -> tuple[int, int | None]:
    ns = [n for n, b in bucket_of_n.items() if b == bucket]
    top = max(ns)
    return min(ns), None if top == max(bucket_of_n) else top


def test_buckets_reproduce_table_bidirectional_keys_before():
    ns = list(range(0, 1001))
    got = dict(zip(ns, buckets_of([-n for n in ns], bidirectional=True)))
    assert [got[n] for n in range(8)] == list(range(8))
    for bucket, expected in BIDIRECTIONAL_RANGES.items():
        assert members(got, bucket) == expected, bucket


def test_buckets_reproduce_table_bidirectional_keys_after():
    ns = list(range(1, 1001))
    got = dict(zip(ns, buckets_of(ns, bidirectional=True)))
    assert [got[n] for n in range(1, 8)] == list(range(17, 24))
    for bucket, expected in BIDIRECTIONAL_RANGES.items():
        assert members(got, bucket + 16) == expected, bucket + 16


def test_bucket_sixteen_never_used_bidirectional():
    used = set(buckets_of(list(range(-1000, 1001)), bidirectional=True))
    assert used == set(range(32)) - {16}
    assert buckets_of([0], bidirectional=True) == [0]


def test_buckets_reproduce_table_causal():
    ns = list(range(0, 1001))
    got = dict(zip(ns, buckets_of([-n for n in ns], bidirectional=False)))
    assert [got[n] for n in range(16)] == list(range(16))
    for bucket, expected in CAUSAL_RANGES.items():
        assert members(got, bucket) == expected, bucket
    assert set(got.values()) == set(range(32))


def test_future_keys_collapse_to_bucket_zero_causal():
    assert buckets_of([1, 5, 500], bidirectional=False) == [0, 0, 0]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (7, 50)])
def test_buckets_match_step_by_step_formula_for_every_distance(bidirectional, num_buckets, max_distance):
    rs = list(range(-300, 301))
    got = relative_bucket(torch.tensor(rs), bidirectional=bidirectional, num_buckets=num_buckets,
                          max_distance=max_distance).tolist()
    assert got == [reference_bucket(r, bidirectional, num_buckets, max_distance) for r in rs]


def naive_bias(s: T5RelativeBias, q_pos: torch.Tensor, k_pos: torch.Tensor, bidirectional: bool) -> torch.Tensor:
    b = max(q_pos.shape[0], k_pos.shape[0])
    q_pos, k_pos = q_pos.expand(b, -1), k_pos.expand(b, -1)
    out = torch.empty(b, s.heads, q_pos.shape[1], k_pos.shape[1])
    for row in range(b):
        for i in range(q_pos.shape[1]):
            for j in range(k_pos.shape[1]):
                r = int(k_pos[row, j] - q_pos[row, i])
                out[row, :, i, j] = s.table.weight[reference_bucket(r, bidirectional)]
    return out


@torch.no_grad()
def test_bias_is_table_row_of_bucket_causal():
    s = scheme()
    q_pos, k_pos = torch.tensor([[20, 21, 22]]), torch.arange(23)[None]
    bias = s.bias(torch.randn(1, 4, 3, 8), q_pos, k_pos)
    assert bias.shape == (1, 4, 3, 23)
    torch.testing.assert_close(bias, naive_bias(s, q_pos, k_pos, bidirectional=False))


@torch.no_grad()
def test_encoder_bias_is_bidirectional_when_not_causal():
    s = scheme()
    s.causal = False
    pos = torch.arange(30)[None]
    bias = s.bias(torch.randn(1, 4, 30, 8), pos, pos)
    torch.testing.assert_close(bias, naive_bias(s, pos, pos, bidirectional=True))
    # A key just after the query reads bucket 16 + 1 in an encoder; a decoder folds it into bucket 0.
    torch.testing.assert_close(bias[0, :, 0, 1], s.table.weight[17])
    s.causal = True
    torch.testing.assert_close(s.bias(torch.randn(1, 4, 30, 8), pos, pos)[0, :, 0, 1], s.table.weight[0])


@torch.no_grad()
def test_per_row_positions_with_offsets():
    s = scheme()
    q_pos = torch.tensor([[0, 1, 2, 3], [40, 41, 42, 43]])
    bias = s.bias(torch.randn(2, 4, 4, 8), q_pos, q_pos)
    assert bias.shape == (2, 4, 4, 4)
    torch.testing.assert_close(bias, naive_bias(s, q_pos, q_pos, bidirectional=False))
    torch.testing.assert_close(bias[0], bias[1])


class BiasOf(torch.nn.Module):
    """Exposes a scheme's ``bias`` as ``forward`` so ``functional_call`` can swap its weights."""

    def __init__(self, s: T5RelativeBias) -> None:
        super().__init__()
        self.s = s

    def forward(self, q, q_pos, k_pos):
        return self.s.bias(q, q_pos, k_pos)


def test_gradcheck_float64_wrt_table():
    s = scheme(heads=2, head_dim=3, num_buckets=8, max_distance=20).double()
    q = torch.randn(1, 2, 3, 3, dtype=torch.float64)
    q_pos, k_pos = torch.tensor([[10, 11, 12]]), torch.arange(13)[None]
    weight = torch.randn(8, 2, dtype=torch.float64, requires_grad=True)
    bias = BiasOf(s)
    assert torch.autograd.gradcheck(
        lambda w: functional_call(bias, {"s.table.weight": w}, (q, q_pos, k_pos)), (weight,))


def test_config_error_for_too_few_buckets():
    with pytest.raises(ConfigError, match=r"t5 num_buckets=2 must be at least 4"):
        scheme(num_buckets=2)


def test_config_error_for_max_distance_within_exact_range():
    with pytest.raises(ConfigError, match=r"t5 max_distance=16 must be greater than num_buckets // 2 = 16"):
        scheme(max_distance=16)


def test_config_error_reported_by_build_as_recipe_error():
    with pytest.raises(RecipeError, match=r"model\.position: t5 max_distance=8 must be greater"):
        seqzoo.build("tiny-gpt", ["model.position={kind: t5, max_distance: 8}"], device="cpu")


# -- in a built model ---------------------------------------------------------------------------

def model():
    return seqzoo.build("tiny-gpt", [f"model.position={NAME}"], device="cpu").eval()


def scheme_of(m: torch.nn.Module) -> T5RelativeBias:
    """The model's position scheme, wherever the architecture keeps it."""
    found = [mod for mod in m.modules() if isinstance(mod, T5RelativeBias)]
    assert len(found) == 1
    return found[0]


def test_builds_from_recipe():
    m = seqzoo.build("tiny-gpt", [f"model.position={{kind: {NAME}, num_buckets: 16, max_distance: 64}}"],
                     device="cpu")
    s = scheme_of(m)
    assert s.table.weight.shape == (16, 4) and s.max_distance == 64
    assert m.recipe["model"]["position"] == {"kind": NAME, "num_buckets": 16, "max_distance": 64}
    assert s.causal  # a decoder stack
