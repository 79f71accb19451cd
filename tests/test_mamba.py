"""Mamba's selective scan, Mamba-2's SSD and linear attention against the recurrences they unroll
(``seqzoo.reference``, step by step in float64); the chunk length rule; the mixers' scans and
decode steps against each other; the memory segments save. What the mixers share with the other
recurrent mixers as layers (segments, bfloat16) is in test_recurrent_mixers.py, their recipes'
decoding in test_recurrent_recipes.py."""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

import seqzoo
from seqzoo import reference
from seqzoo.errors import PerformanceWarning, RecipeError
from seqzoo.plugins.mixer._selective_scan import (
    LOG_DECAY_LIMIT,
    chunk_length,
    chunked_scan,
    selective_scan,
    selective_step,
)
from seqzoo.plugins.mixer._ssd import ssd_scan, ssd_step
from seqzoo.testing import gradients_match_reference


def inputs(scale: float, length: int = 70, dtype=torch.float64):
    g = torch.Generator().manual_seed(1)
    b, d, n = 2, 6, 5
    u = torch.randn(b, length, d, generator=g, dtype=dtype)
    dt = F.softplus(torch.randn(b, length, d, generator=g, dtype=dtype)) * scale
    A = -torch.rand(d, n, generator=g, dtype=dtype) * 16
    B, C = torch.randn(b, length, n, generator=g, dtype=dtype), torch.randn(b, length, n, generator=g, dtype=dtype)
    return u, dt, A, B, C, torch.randn(b, d, n, generator=g, dtype=dtype)


@pytest.mark.parametrize("scale", [0.01, 1.0, 20.0])  # slow decay (long chunks) to steep (chunks of 1)
def test_chunked_scan_equals_the_sequential_recurrence_in_float64(scale):
    u, dt, A, B, C, h = inputs(scale)
    expected, final = reference.selective_scan(u, dt, A, B, C, h)
    for chunk in (1, 8, 64):
        y, last = chunked_scan(u, dt, A, B, C, h, chunk=chunk)
        assert (y - expected).abs().max() < 1e-9 * expected.abs().max()
        assert (last - final).abs().max() < 1e-9 * final.abs().max()


def test_chunked_scan_in_float32_stays_close_to_float64():
    u, dt, A, B, C, h = inputs(1.0, length=200)
    expected, _ = reference.selective_scan(u, dt, A, B, C, h)
    y, _ = chunked_scan(*(t.float() for t in (u, dt, A, B, C, h)))
    assert ((y.double() - expected).abs().max() / expected.abs().max()) < 1e-5


def test_chunk_length_keeps_every_chunk_within_the_log_decay_limit():
    u, dt, A, B, C, h = inputs(0.5, length=64)
    length = chunk_length(dt, A, 64)
    assert 1 < length < 64  # steep enough that a whole chunk of 64 would pass e^±40
    per_chunk = dt[:, : 64 // length * length].unflatten(1, (-1, length)).sum(2) * A.abs().amax(-1)
    assert per_chunk.max() <= LOG_DECAY_LIMIT
    assert chunk_length(torch.zeros_like(dt), A, 64) == 64


@pytest.mark.parametrize("scale", [0.01, 0.1, 0.3, 1.0])  # chunks of 64 down to a few tokens
def test_float32_gradients_of_the_scan_match_the_float64_recurrence(scale):
    """Every input's gradient, float32 chunked scan against float64 autograd through the sequential
    recurrence, at decays that fill chunks up to the log-decay limit (a division by exp(S) there
    had a gradient through 1 / exp(S)², which overflowed past |S| = 44 and gave NaN)."""
    tensors = dict(zip("u dt A B C h".split(), inputs(scale, length=100)))
    assert chunk_length(tensors["dt"], tensors["A"], 64) < 64 or scale == 0.01
    gradients_match_reference(lambda t: chunked_scan(*t.values()), lambda t: reference.selective_scan(*t.values()),
                              tensors)


def test_zero_steps_leave_the_state_unchanged():
    u, dt, A, B, C, h = inputs(1.0, length=10)
    dt[:, :4] = 0  # four padded positions
    _, after_padding = chunked_scan(u[:, :4], dt[:, :4], A, B[:, :4], C[:, :4], h)
    assert torch.equal(after_padding, h.to(after_padding.dtype))


def test_decode_steps_equal_the_scan():
    u, dt, A, B, C, h = inputs(1.0, length=12)
    expected, final = chunked_scan(u, dt, A, B, C, h)
    for t in range(12):
        y, h = selective_step(u[:, t], dt[:, t], A, B[:, t], C[:, t], h)
        assert torch.allclose(y, expected[:, t], atol=1e-10)
    assert torch.allclose(h, final, atol=1e-10)


def test_mamba_mixer_parameters_follow_the_paper():
    mixer = seqzoo.registry().create("mixer", {"kind": "mamba", "state": 8, "conv": 3, "expand": 2}, 32)
    assert mixer.in_proj.weight.shape == (128, 32) and mixer.conv1d.weight.shape == (64, 1, 3)
    assert mixer.x_proj.weight.shape == (2 + 16, 64) and mixer.dt_proj.weight.shape == (64, 2)
    assert torch.allclose(-torch.exp(mixer.A_log[0]), -torch.arange(1, 9.0))
    dt = F.softplus(mixer.dt_proj.bias)
    assert dt.min() >= 0.001 - 1e-6 and dt.max() <= 0.1 + 1e-6


def test_bcdt_norm_divides_delta_b_and_c_by_their_rms_in_the_scan_and_the_decode_step():
    """Falcon-Mamba's option: Δ (before dt_proj), B and C each over its own features, x / √(mean x² + ε),
    in the whole-sequence forward and the decode step alike; the mixer written out by hand in float64."""
    spec = {"kind": "mamba", "state": 4, "conv": 3, "dt_rank": 3, "bcdt_norm_eps": 0.05}  # an ε that shows
    mixer = seqzoo.registry().create("mixer", spec, 8).double()
    x = torch.randn(2, 11, 8, dtype=torch.float64)
    u, z = mixer.in_proj(x).chunk(2, -1)
    u = F.silu(mixer.conv1d(F.pad(u.transpose(1, 2), (2, 0))).transpose(1, 2))
    dt, B, C = (t / (t.pow(2).mean(-1, keepdim=True) + 0.05).sqrt() for t in mixer.x_proj(u).split([3, 4, 4], -1))
    y, _ = reference.selective_scan(u, F.softplus(mixer.dt_proj(dt)), -torch.exp(mixer.A_log), B, C)
    expected = mixer.out_proj((y + u * mixer.D) * F.silu(z))
    t = torch.arange(11)[None]
    context = seqzoo.interfaces.MixerContext(position=None, q_pos=t, k_pos=t, mask=None, causal=True, prepared={})
    with torch.no_grad():
        assert torch.allclose(mixer(x, context), expected, atol=1e-10)
        state = mixer.new_state(2, 11)
        steps = [mixer(x[:, i:i + 1], context, state) for i in range(11)]
    assert torch.allclose(torch.cat(steps, 1), expected, atol=1e-10)
    plain = seqzoo.registry().create("mixer", {**spec, "bcdt_norm_eps": None}, 8).double()
    plain.load_state_dict(mixer.state_dict())  # the norm has no weights: the same tensors
    assert not torch.allclose(plain(x, context), expected, atol=1e-3)


# -- Mamba-2's SSD --------------------------------------------------------------------------------
def ssd_inputs(scale: float, length: int = 50):
    g = torch.Generator().manual_seed(2)
    b, heads, width, groups, n = 2, 6, 3, 2, 4
    d = torch.float64
    x = torch.randn(b, length, heads, width, generator=g, dtype=d)
    dt = F.softplus(torch.randn(b, length, heads, generator=g, dtype=d)) * scale
    a = -torch.rand(heads, generator=g, dtype=d) * 8
    B, C = (torch.randn(b, length, groups, n, generator=g, dtype=d) for _ in range(2))
    return x, dt, a, B, C, torch.randn(b, heads, width, n, generator=g, dtype=d)


@pytest.mark.parametrize("scale", [0.01, 1.0, 50.0])  # decays from negligible to e^-400 per step
def test_ssd_equals_the_sequential_recurrence_in_float64(scale):
    x, dt, a, B, C, h = ssd_inputs(scale)
    expected, final = reference.ssd(x, dt, a, B, C, h)
    for chunk in (1, 7, 64):
        y, last = ssd_scan(x, dt, a, B, C, h, chunk=chunk)
        assert torch.isfinite(y).all()
        assert (y - expected).abs().max() < 1e-10 * expected.abs().max()
        assert (last - final).abs().max() < 1e-10 * final.abs().max()


def test_ssd_decode_steps_equal_the_scan():
    x, dt, a, B, C, h = ssd_inputs(1.0, length=9)
    expected, final = ssd_scan(x, dt, a, B, C, h)
    for t in range(9):
        y, h = ssd_step(x[:, t], dt[:, t], a, B[:, t], C[:, t], h)
        assert torch.allclose(y, expected[:, t], atol=1e-10)
    assert torch.allclose(h, final, atol=1e-10)


def test_mamba2_gated_norm_normalises_each_group():
    mixer = seqzoo.registry().create("mixer", {"kind": "mamba2", "state": 4, "head_dim": 8, "groups": 2}, 16)
    assert mixer.heads == 4 and mixer.in_proj.weight.shape == (32 + 32 + 2 * 2 * 4 + 4, 16)
    y, z = torch.randn(3, 32), torch.randn(3, 32)
    gated = (y * F.silu(z)).view(3, 2, 16)
    expected = (gated / gated.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt()).view(3, 32)
    assert torch.allclose(mixer.norm(y, z), expected, atol=1e-6)


# -- linear attention -----------------------------------------------------------------------------
@pytest.mark.parametrize("feature_map,decay", [("elu", None), ("elu", "retnet"), ("identity", "retnet")])
def test_linear_attention_equals_its_recurrence(feature_map, decay):
    """S_t = γ S_{t−1} + φ(k_t) v_tᵀ, y_t = S_tᵀ φ(q_t), divided by z_tᵀ φ(q_t) for elu, in chunks
    of 5 over 13 tokens (tests/test_reference.py checks the recurrence against its quadratic form)."""
    spec = {"kind": "linear_attention", "heads": 3, "feature_map": feature_map, "decay": decay, "chunk": 5}
    mixer = seqzoo.registry().create("mixer", spec, 12).double()
    x = torch.randn(2, 13, 12, dtype=torch.float64)
    q, k, v = mixer.qkv_proj(x).unflatten(-1, (3, 3, 4)).unbind(2)  # (B, T, H, D)
    gamma = torch.exp(mixer.log_decay.double())
    y, _ = reference.linear_attention(q, k, v, gamma, feature_map=feature_map)  # identity: q · D^-1/2
    expected = mixer.out_proj(y.flatten(2))
    t = torch.arange(13)[None]
    context = seqzoo.interfaces.MixerContext(position=None, q_pos=t, k_pos=t, mask=None, causal=True, prepared={})
    assert torch.allclose(mixer(x, context), expected, atol=1e-10)
    if decay == "retnet":
        expected_gamma = torch.tensor([1 - 2 ** -5, 1 - 2 ** -6, 1 - 2 ** -7], dtype=torch.float64)
        assert torch.allclose(gamma, expected_gamma)


# -- the recipes built on these mixers -----------------------------------------------------------
def test_a_mamba_layer_has_no_feed_forward_sublayer_and_the_hybrid_keeps_both_states():
    mamba = seqzoo.build("tiny-mamba", device="cpu")
    block = mamba.decoder.blocks[0]
    assert block.ffn is None and block.ffn_norm is None and block.mixer_norm is not None
    hybrid = seqzoo.build("tiny-hybrid", device="cpu")
    kinds = [type(b.mixer).__name__ for b in hybrid.decoder.blocks]
    assert kinds == ["Mamba2", "Mamba2", "Mamba2", "AttentionMixer"] * 2
    cache = hybrid.new_cache(1, 16)
    assert [type(s).__name__ for s in cache.states[:4]] == ["MambaState"] * 3 + ["KVSlice"]


# -- segments: long sequences without autograd ------------------------------------------------------
def test_segments_bound_the_memory_of_a_long_forward_without_autograd(monkeypatch):
    from seqzoo.lab.measure import peak_memory_mb
    segments = pytest.importorskip("seqzoo.plugins.mixer._segments")
    mixer = seqzoo.registry().create("mixer", {"kind": "mamba", "state": 16}, 64)
    x = torch.randn(1, 4096, 64)
    t = torch.arange(4096)[None]
    context = seqzoo.interfaces.MixerContext(position=None, q_pos=t, k_pos=t, mask=None, causal=True, prepared={})
    with torch.no_grad():
        monkeypatch.setattr(segments, "SEGMENT", 1 << 20)  # one pass
        whole = peak_memory_mb(lambda: mixer(x, context))
        monkeypatch.setattr(segments, "SEGMENT", 512)
        cut = peak_memory_mb(lambda: mixer(x, context))
    # the output (1 MiB) is the only T-long tensor left; one pass holds several (B, T, E) ones
    assert cut < whole / 3, (cut, whole)


# The fused CPU kernel (numba, the `fast` extra): equal to the float64 recurrence and to the chunked
# path, forward and every gradient, at widths and lengths that are not multiples of its blocks.
@pytest.fixture
def fused():
    """The fused kernel's module: its tests skip without numba, the rest of this file runs."""
    return pytest.importorskip("seqzoo.plugins.mixer._fused_scan", reason="numba is not installed")


def leaves(tensors, dtype):
    return [t.detach().to(dtype).requires_grad_() for t in tensors]


@pytest.mark.parametrize("scale", [0.01, 1.0, 20.0])  # slow decay to steep (e^−88 and below: exp's floor)
@pytest.mark.parametrize("length", [1, 63, 130])      # around the kernel's stretch of 64 saved states
def test_fused_scan_and_its_gradients_equal_the_float64_recurrence(scale, length, fused):
    u, dt, A, B, C, h = inputs(scale, length=length)
    u, dt, B, C = (torch.cat([t] * 7, -1) if t.shape[-1] == 6 else t for t in (u, dt, B, C))  # 42 channels
    A, h = torch.cat([A] * 7, 0), torch.cat([h] * 7, 1)
    g = torch.Generator().manual_seed(3)
    weights, weights_last = (torch.randn(*shape, dtype=torch.float64, generator=g)
                             for shape in (u.shape, h.shape))
    expected_in, got_in = leaves((u, dt, A, B, C, h), torch.float64), leaves((u, dt, A, B, C, h), torch.float32)
    expected, expected_last = reference.selective_scan(*expected_in)
    got, got_last = fused.selective_scan(*got_in)
    assert got.dtype == got_last.dtype == torch.float32
    assert (got.double() - expected).abs().max() <= 1e-5 * expected.abs().max()
    assert (got_last.double() - expected_last).abs().max() <= 1e-5 * expected_last.abs().max()
    ((expected * weights).sum() + (expected_last * weights_last).sum()).backward()
    ((got * weights.float()).sum() + (got_last * weights_last.float()).sum()).backward()
    for name, e, f in zip("u dt A B C h".split(), expected_in, got_in):
        assert torch.isfinite(f.grad).all(), name
        assert (f.grad.double() - e.grad).abs().max() <= 1e-5 * e.grad.abs().max(), name


def test_the_scan_takes_the_fused_kernel_on_the_cpu_and_equals_the_chunked_path(monkeypatch, fused):
    u, dt, A, B, C, h = (t.float() for t in inputs(1.0, length=100))
    calls, kernel = [], fused.fused_scan
    monkeypatch.setattr(fused, "fused_scan", lambda *a: calls.append(1) or kernel(*a))
    y, last = selective_scan(u, dt, A, B, C, h)
    y_chunked, last_chunked = chunked_scan(u, dt, A, B, C, h)
    assert calls and torch.allclose(y, y_chunked, atol=1e-5, rtol=1e-5)
    assert torch.allclose(last, last_chunked, atol=1e-5, rtol=1e-5)
    monkeypatch.setenv("SEQZOO_SCAN", "torch")
    calls.clear()
    selective_scan(u, dt, A, B, C, h)
    assert not calls


def test_fused_padding_leaves_the_state_exactly_as_it_was(fused):
    u, dt, A, B, C, h = (t.float() for t in inputs(1.0, length=10))
    dt[:, :4] = 0
    _, after_padding = fused.selective_scan(u[:, :4], dt[:, :4], A, B[:, :4], C[:, :4], h)
    assert torch.equal(after_padding, h)


def test_fused_scan_takes_bfloat16_inputs_and_computes_in_float32(fused):
    tensors = [t.to(torch.bfloat16) for t in inputs(1.0, length=80)]
    expected, _ = reference.selective_scan(*(t.double() for t in tensors))
    got, last = fused.selective_scan(*tensors)
    assert got.dtype == last.dtype == torch.float32
    assert (got.double() - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_fused_scan_is_a_well_formed_custom_op(fused):
    """torch.library's own checks: the fake (meta) kernel's shapes, the autograd registration, and
    that torch.compile can trace it as one opaque operator."""
    u, dt, A, B, C, h = (t.float() for t in inputs(1.0, length=70))
    args = (u.requires_grad_(), dt, A.t().contiguous(), B, C, h.transpose(1, 2).contiguous(), fused.EVERY)
    torch.library.opcheck(fused.fused_scan, args, test_utils=("test_schema", "test_faketensor",
                                                              "test_autograd_registration"))


def test_without_numba_the_scan_says_so_once_and_takes_the_chunked_path(monkeypatch, recwarn):
    import seqzoo.plugins.mixer._selective_scan as scan
    monkeypatch.setattr(scan, "_fused", None)
    monkeypatch.setitem(sys.modules, "seqzoo.plugins.mixer._fused_scan", None)  # its import fails
    monkeypatch.delattr(sys.modules["seqzoo.plugins.mixer"], "_fused_scan", raising=False)  # absent without numba
    u, dt, A, B, C, h = (t.float() for t in inputs(1.0, length=20))
    y, _ = scan.selective_scan(u, dt, A, B, C, h)
    scan.selective_scan(u, dt, A, B, C, h)
    notice = [str(w.message) for w in recwarn if issubclass(w.category, PerformanceWarning)]
    assert len(notice) == 1 and "PyTorch path" in notice[0] and "seqzoo[fast]" in notice[0]
    assert torch.equal(y, chunked_scan(u, dt, A, B, C, h)[0])


@pytest.mark.parametrize("spec", [{"kind": "mamba", "state": 4, "conv": 3},
                                  {"kind": "mamba2", "state": 4, "head_dim": 8, "groups": 2, "bias": True}])
def test_a_mimetic_start_gives_c_the_b_of_every_token_and_almost_no_decay(spec):
    """Trockman et al. (2024): at a mimetic start C_t = B_t for every input, so C_t · B_s is a
    similarity of the tokens' inputs, and A = −0.01 keeps the past: at Δ = 0.1 a token still weighs
    > 0.5 after 512 steps. Without the option B and C are independent."""
    torch.manual_seed(0)
    x = torch.randn(2, 9, 16)

    def b_and_c(mixer):
        if spec["kind"] == "mamba":
            u = F.silu(mixer.conv1d(F.pad(mixer.in_proj(x).chunk(2, -1)[0].transpose(1, 2), (2, 0))).transpose(1, 2))
            _, B, C = mixer.x_proj(u).split([mixer.dt_rank, 4, 4], -1)
            return B, C
        _, xBC, _ = mixer.in_proj(x).split([mixer.inner, mixer.conv_dim, mixer.heads], -1)
        xBC = F.silu(mixer.conv1d(F.pad(xBC.transpose(1, 2), (3, 0))).transpose(1, 2))
        _, B, C = xBC.split([mixer.inner, 8, 8], -1)
        return B, C

    with torch.no_grad():
        mimetic = seqzoo.registry().create("mixer", {**spec, "mimetic": True}, 16)
        B, C = b_and_c(mimetic)
        assert torch.allclose(B, C, rtol=0, atol=1e-6) and B.abs().sum() > 0  # up to BLAS blocking
        assert torch.allclose(-torch.exp(mimetic.A_log), torch.full_like(mimetic.A_log, -0.01))
        assert torch.exp(-0.01 * 0.1 * torch.tensor(512.0)) > 0.5
        B, C = b_and_c(seqzoo.registry().create("mixer", spec, 16))
        assert not torch.allclose(B, C, atol=1e-3)


@pytest.mark.parametrize("mixer, error", [
    ("{kind: mamba2, dt_limit: [0.1, 0.2, 0.3]}", r"model\.mixer\.dt_limit: expected 2 items, got 3"),
    ("{kind: mamba2, dt_limit: [0.5]}", r"model\.mixer\.dt_limit: expected 2 items, got 1"),
    ("{kind: mamba2, dt_limit: [-0.1, 0.5]}", r"model\.mixer\.dt_limit\.0: -0\.1 is out of range: must be >= 0"),
    ("{kind: mamba2, dt_limit: [0.5, 0.1]}", r"dt_limit \[0\.5, 0\.1\] must be \[low, high\] with low ≤ high"),
    ("{kind: mamba2, dt_min: 0.5, dt_max: 0.1}", r"mamba2: dt_min=0\.5 is above dt_max=0\.1; swap them"),
    ("{kind: mamba, dt_min: 0.5, dt_max: 0.1}", r"mamba: dt_min=0\.5 is above dt_max=0\.1; swap them"),
])
def test_a_step_limit_or_range_that_cannot_be_meant_is_refused_at_its_recipe_line(tmp_path, mixer, error):
    # a clamp(lo, hi) with three numbers crashed in training; one number or a reversed pair clamped silently
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(f"extends: tiny-mamba2\nmodel: {{mixer: {mixer}}}\n")
    with pytest.raises(RecipeError, match=rf"^{recipe}:2: .*{error}"):
        seqzoo.build(recipe, device="meta")
