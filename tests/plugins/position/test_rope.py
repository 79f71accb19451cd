"""RoPE (plugins/position/rope.py) against explicit per-pair rotations and docs/formulas.md §3, §13."""
from __future__ import annotations

import math

import pytest
import torch

import seqzoo
from seqzoo.errors import ConfigError, RecipeError
from seqzoo.plugins.position.rope import Rope

HEADS, HEAD_DIM = 2, 16


def make_rope(**params) -> Rope:
    return Rope(HEADS * HEAD_DIM, HEAD_DIM, HEADS, 256, **params)


def reference_rotation(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0,
                       rotary_dim: int = HEAD_DIM, interleaved: bool = False) -> torch.Tensor:
    """Pair by pair, in float64: x (..., T, D) at positions (T,). Pair k is (2k, 2k+1) interleaved
    or (k, k + d_r/2) rotate-half; θ = p·base^(−2k/d_r);
    (a, b) -> (a cos θ − b sin θ, a sin θ + b cos θ).
    Dims from rotary_dim on are copied unchanged."""
    x = x.double()
    out = x.clone()
    p = positions.double()
    half = rotary_dim // 2
    for k in range(half):
        i, j = (2 * k, 2 * k + 1) if interleaved else (k, k + half)
        theta = p * base ** (-2.0 * k / rotary_dim)
        c, s = torch.cos(theta), torch.sin(theta)
        a, b = x[..., i], x[..., j]
        out[..., i] = a * c - b * s
        out[..., j] = a * s + b * c
    return out


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotation_matches_reference_per_pair(interleaved):
    rope = make_rope(interleaved=interleaved)
    q, k = torch.randn(2, HEADS, 7, HEAD_DIM), torch.randn(2, HEADS, 7, HEAD_DIM)
    positions = torch.tensor([0, 1, 2, 5, 17, 63, 100])
    q_rot, k_rot = rope.rotate(q, k, positions[None], positions[None])
    torch.testing.assert_close(q_rot.double(), reference_rotation(q, positions, interleaved=interleaved),
                               atol=5e-5, rtol=1e-5)
    torch.testing.assert_close(k_rot.double(), reference_rotation(k, positions, interleaved=interleaved),
                               atol=5e-5, rtol=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotation_at_position_zero_is_identity(interleaved):
    q = torch.randn(1, HEADS, 1, HEAD_DIM)
    q_rot, _ = make_rope(interleaved=interleaved).rotate(q, q, torch.zeros(1, 1, dtype=torch.long),
                                                         torch.zeros(1, 1, dtype=torch.long))
    torch.testing.assert_close(q_rot, q)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("m,n", [(0, 0), (3, 11), (11, 3), (40, 97), (200, 5)])
def test_dot_product_depends_only_on_offset(interleaved, m, n):
    """⟨R_m q, R_n k⟩ = ⟨q, R_{n−m} k⟩ (docs/formulas.md §3)."""
    rope = make_rope(interleaved=interleaved)
    q, k = torch.randn(1, HEADS, 1, HEAD_DIM), torch.randn(1, HEADS, 1, HEAD_DIM)
    q_m, k_n = rope.rotate(q, k, torch.tensor([[m]]), torch.tensor([[n]]))
    q_0, k_rel = rope.rotate(q, k, torch.tensor([[0]]), torch.tensor([[n - m]]))
    torch.testing.assert_close((q_m * k_n).sum(-1), (q_0 * k_rel).sum(-1), atol=1e-4, rtol=1e-5)


def test_interleaved_equals_rotate_half_after_weight_permutation():
    """Meta (interleaved) q/k weights permuted as HF's converter does give the same logits under
    rotate-half RoPE (docs/formulas.md §3: view [H, D/2, 2, in] -> swap axes 1, 2 -> reshape)."""
    b, t, c = 2, 9, HEADS * HEAD_DIM
    x = torch.randn(b, t, c)
    w_q_meta, w_k_meta = torch.randn(HEADS * HEAD_DIM, c), torch.randn(HEADS * HEAD_DIM, c)

    def permute(w):
        return w.view(HEADS, HEAD_DIM // 2, 2, c).transpose(1, 2).reshape(HEADS * HEAD_DIM, c)

    def heads(y):
        return y.view(b, t, HEADS, HEAD_DIM).transpose(1, 2)  # (B, H, T, D)

    positions = torch.arange(t)[None] * 7
    q_meta, k_meta = make_rope(interleaved=True).rotate(
        heads(x @ w_q_meta.T), heads(x @ w_k_meta.T), positions, positions)
    q_hf, k_hf = make_rope(interleaved=False).rotate(
        heads(x @ permute(w_q_meta).T), heads(x @ permute(w_k_meta).T), positions, positions)
    torch.testing.assert_close(q_hf @ k_hf.transpose(-2, -1), q_meta @ k_meta.transpose(-2, -1),
                               atol=1e-4, rtol=1e-5)
    # The rotated vectors themselves are the same up to the per-head permutation.
    perm = torch.arange(HEAD_DIM).view(HEAD_DIM // 2, 2).T.reshape(-1)  # hf dim -> meta dim
    torch.testing.assert_close(q_hf, q_meta[..., perm], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
def test_partial_rotary_leaves_the_rest_untouched(interleaved):
    rope = make_rope(rotary_dim=8, interleaved=interleaved)
    q = torch.randn(2, HEADS, 5, HEAD_DIM)
    positions = torch.arange(5) * 13
    q_rot, _ = rope.rotate(q, q, positions[None], positions[None])
    assert torch.equal(q_rot[..., 8:], q[..., 8:])
    # d_r (not D) is the exponent's denominator and the rotate-half split is inside the d_r slice.
    expected = reference_rotation(q, positions, rotary_dim=8, interleaved=interleaved)
    torch.testing.assert_close(q_rot.double(), expected, atol=5e-5, rtol=1e-5)


def test_angles_are_float32():
    cos, sin = make_rope().angles(torch.arange(4)[None])
    assert cos.dtype == sin.dtype == torch.float32
    assert cos.shape == (1, 1, 4, HEAD_DIM // 2)


BIG = 1_000_000


def _big_position_case(interleaved: bool):
    rope = make_rope(interleaved=interleaved)
    q = torch.randn(1, HEADS, 1, HEAD_DIM).to(torch.bfloat16)
    pos = torch.tensor([[BIG]])
    q_rot, _ = rope.rotate(q, q, pos, pos)
    assert q_rot.dtype == torch.bfloat16
    expected = reference_rotation(q, pos[0], interleaved=interleaved)  # float64, exact ω
    return q_rot.double(), expected, q.double().abs().max().item()


@pytest.mark.parametrize("interleaved", [False, True])
def test_bfloat16_input_at_position_one_million_rotates_with_float32_angles(interleaved):
    """bf16 cannot hold 1e6 (its spacing there is 4096), so bf16 angles would be garbage (errors of
    order |x|). Float32 angles are off by at most about p·2^-24 ≈ 0.06 rad at p = 1e6 (ω and the
    product p·ω are each rounded to float32), plus the bf16 rounding of the output."""
    got, expected, scale = _big_position_case(interleaved)
    bound = (2 * BIG * 2.0 ** -24 + 2.0 ** -8) * scale
    assert (got - expected).abs().max().item() < bound
    # ... and that bound is far below what garbage angles produce.
    assert bound < 0.2 * scale


def test_bfloat16_input_at_position_one_million_accurate_to_output_rounding():
    got, expected, scale = _big_position_case(False)
    torch.testing.assert_close(got, expected, rtol=2.0 ** -8, atol=1e-3 * scale)


def test_odd_rotary_dim_raises():
    with pytest.raises(ConfigError, match=r"rotary_dim=7 must be even"):
        make_rope(rotary_dim=7)


def test_rotary_dim_above_head_dim_raises():
    with pytest.raises(ConfigError, match=rf"rotary_dim=32 must be even and at most head_dim={HEAD_DIM}"):
        make_rope(rotary_dim=32)


def test_odd_rotary_dim_in_recipe_is_a_recipe_error():
    with pytest.raises(RecipeError, match=r"model.*rotary_dim=7 must be even"):
        seqzoo.build("tiny-gpt", ["model.position={kind: rope, rotary_dim: 7}"], device="cpu")


# --- every scaling through a real model: cached decoding equals the full forward (docs/formulas.md §13) ---

# Keyed by registry name, so a new rope_scaling plugin must be added here (see the coverage test).
# T stays <= L = 64 so dynamic NTK is consistent with the cache (beyond L: test_dynamic.py).
SCALINGS = {
    "linear": "{kind: linear, factor: 4}",
    "ntk": "{kind: ntk, factor: 4}",
    "dynamic": "{kind: dynamic, factor: 4, original_max_seq_len: 64}",
    "yarn": "{kind: yarn, factor: 4, original_max_seq_len: 64}",
    "llama3": "{kind: llama3, factor: 4, original_max_seq_len: 64}",
    # T <= L: the short factors throughout (crossing L re-encodes the sequence: test_hf_phi3.py)
    "longrope": "{kind: longrope, original_max_seq_len: 64, short_factor: [1, 1.1, 1.2, 1.4, 1.8, 2, 3, 4],"
                " long_factor: [1, 2, 4, 8, 8, 8, 16, 16]}",
}
VARIANTS = {
    "plain": "{kind: rope}",
    "interleaved-partial": "{kind: rope, interleaved: true, rotary_dim: 8}",
    **{name: f"{{kind: rope, scaling: {spec}}}" for name, spec in SCALINGS.items()},
    "yarn-interleaved-partial":
        "{kind: rope, interleaved: true, rotary_dim: 8,"
        " scaling: {kind: yarn, factor: 8, original_max_seq_len: 32}}",
}


def test_every_registered_scaling_is_covered():
    assert set(seqzoo.registry().names("rope_scaling")) == set(SCALINGS)


def _model(position: str):
    return seqzoo.build("tiny-gpt", [f"model.position={position}"], device="cpu").eval()


@pytest.mark.parametrize("variant", list(VARIANTS))
@torch.no_grad()
def test_cached_decoding_matches_full_forward(variant):
    model = _model(VARIANTS[variant])
    ids = torch.randint(0, 259, (2, 16))
    full = model(ids)  # (B, T, V)
    cache = model.new_cache(2, 16)
    for t in range(16):
        step = model(ids[:, t:t + 1], cache=cache)[:, -1]
        torch.testing.assert_close(step, full[:, t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_greedy_generation_matches_uncached(variant):
    model = _model(VARIANTS[variant])
    ids = torch.randint(0, 259, (2, 8))
    cached = seqzoo.generate(model, ids, 8)
    assert torch.equal(cached, seqzoo.generate(model, ids, 8, use_cache=False))
    assert cached.shape == (2, 16)


def test_scaling_changes_the_model():
    """The scaling really reaches the rotation (a scaled model's logits differ from plain RoPE)."""
    ids = torch.randint(0, 259, (1, 40))
    torch.manual_seed(1)
    plain = _model(VARIANTS["plain"])
    torch.manual_seed(1)
    scaled = _model(VARIANTS["linear"])
    with torch.no_grad():
        assert not torch.allclose(plain(ids), scaled(ids), atol=1e-4)
    (rope,) = [m for m in scaled.modules() if isinstance(m, Rope)]
    assert math.isclose(rope.scaling.factor, 4.0)
