"""``seqzoo.reference``, the plain recurrences, each against a computation of its own: the cells
against torch.nn's RNN, LSTM and GRU; the selective scan against its closed form (a sum over the
past, every decay written out); SSD head by head against the selective scan, where the two coincide;
linear attention against its quadratic (attention) form. Then ``seqzoo.testing.matches_reference``
on the built-in recurrent mixers, and the example of docs/plugins.md that shows it."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import seqzoo
from seqzoo import reference
from seqzoo.errors import InputError
from seqzoo.testing import matches_reference

ROOT = Path(__file__).resolve().parents[1]
F64 = torch.float64
T = 12


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=F64)


# -- inputs of each recurrence: (sequences (B, T, ...), parameters, initial state) -------------------
def scan_inputs(length: int = T):
    sequences = {"u": randn(2, length, 4), "dt": F.softplus(randn(2, length, 4)), "B": randn(2, length, 3),
                 "C": randn(2, length, 3)}
    return sequences, {"A": -torch.rand(4, 3, dtype=F64) * 2}, randn(2, 4, 3)


def ssd_inputs(length: int = T):
    sequences = {"x": randn(2, length, 6, 2), "dt": F.softplus(randn(2, length, 6)), "B": randn(2, length, 3, 5),
                 "C": randn(2, length, 3, 5)}
    return sequences, {"a": -torch.rand(6, dtype=F64) * 2}, randn(2, 6, 2, 5)


def linear_attention_inputs(length: int = T):
    sequences = {"q": randn(2, length, 3, 4), "k": randn(2, length, 3, 4), "v": randn(2, length, 3, 5)}
    state = (randn(2, 3, 4, 5), torch.rand(2, 3, 4, dtype=F64) + 1)  # z > 0: a positive normaliser
    return sequences, {"gamma": torch.tensor([0.5, 0.9, 1.0], dtype=F64)}, state


def cell_inputs(gates: int, parts: int):
    def make(length: int = T):
        weights = {"weight_ih": randn(gates * 5, 3), "weight_hh": randn(gates * 5, 5) / 2,
                   "bias_ih": randn(gates * 5), "bias_hh": randn(gates * 5)}
        state = randn(2, 5) if parts == 1 else (randn(2, 5), randn(2, 5))
        return {"x": randn(2, length, 3)}, weights, state
    return make


RECURRENCES = {
    "selective_scan": (reference.selective_scan, scan_inputs),
    "ssd": (reference.ssd, ssd_inputs),
    "linear_attention": (reference.linear_attention, linear_attention_inputs),
    "rnn": (reference.rnn, cell_inputs(1, 1)),
    "lstm": (reference.lstm, cell_inputs(4, 2)),
    "gru": (reference.gru, cell_inputs(3, 1)),
}


def parts(state) -> list[torch.Tensor]:
    """A state of one tensor or a tuple of them, as a list."""
    return [state] if isinstance(state, torch.Tensor) else list(state)


def flat(out) -> list[torch.Tensor]:
    """(outputs, final state) as one list of tensors."""
    return [t for part in out for t in parts(part)]


# -- the recurrences against computations of their own ----------------------------------------------
CELLS = [("rnn", torch.nn.RNN, {"nonlinearity": "tanh"}), ("rnn", torch.nn.RNN, {"nonlinearity": "relu"}),
         ("lstm", torch.nn.LSTM, {}), ("gru", torch.nn.GRU, {})]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name,module,options", CELLS, ids=["rnn_tanh", "rnn_relu", "lstm", "gru"])
def test_the_cells_equal_torch_nn_with_the_same_weights(name, module, options, bias):
    torch_cell = module(3, 5, batch_first=True, bias=bias, **options).double()
    weights = [p.detach() for p in torch_cell.parameters()]  # weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0
    x, h0, c0 = randn(2, T, 3), randn(2, 5), randn(2, 5)
    state, torch_state = ((h0, c0), (h0[None], c0[None])) if name == "lstm" else (h0, h0[None])
    out, final = getattr(reference, name)(x, *weights, state=state, **options)
    expected, expected_final = torch_cell(x, torch_state)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(parts(final), [t[0] for t in parts(expected_final)])


def test_the_selective_scan_equals_its_closed_form():
    """h_t = exp(A Σ_{r≤t} Δ_r) h_0 + Σ_{s≤t} exp(A Σ_{s<r≤t} Δ_r) Δ_s B_s u_s, y_t = h_t C_t."""
    seq, params, h0 = scan_inputs()
    u, dt, A, B, C = seq["u"], seq["dt"], params["A"], seq["B"], seq["C"]
    elapsed = dt.cumsum(1)                                                        # Σ_{r≤t} Δ_r (B, T, D)
    gaps = (elapsed[:, :, None] - elapsed[:, None, :])[..., None] * A             # (B, T_t, T_s, D, N)
    later = torch.ones(T, T, dtype=torch.bool).triu(1)[None, :, :, None, None]   # s > t: no influence
    decay = gaps.masked_fill(later, float("-inf")).exp()
    inputs = (dt * u)[..., None] * B[:, :, None, :]                               # Δ_s B_s u_s (B, T_s, D, N)
    h = torch.einsum("btsdn,bsdn->btdn", decay, inputs) + (elapsed[..., None] * A).exp() * h0[:, None]
    y, final = reference.selective_scan(**seq, A=A, state=h0)
    torch.testing.assert_close(y, torch.einsum("btdn,btn->btd", h, C))
    torch.testing.assert_close(final, h[:, -1])


def test_ssd_is_the_selective_scan_of_each_head_with_its_group_of_b_and_c():
    """Head h of 6 in 3 groups reads group h // 2; its D channels share one Δ and one decay a_h, so
    each head is a selective scan over D channels with every entry of A equal to a_h."""
    seq, params, h0 = ssd_inputs()
    y, final = reference.ssd(**seq, **params, state=h0)
    for head in range(6):
        group, a = head // 2, params["a"][head]
        u, dt = seq["x"][:, :, head], seq["dt"][:, :, head, None].expand(-1, -1, 2)
        y_head, final_head = reference.selective_scan(u, dt, a.expand(2, 5), seq["B"][:, :, group],
                                                      seq["C"][:, :, group], h0[:, head])
        torch.testing.assert_close(y[:, :, head], y_head)
        torch.testing.assert_close(final[:, head], final_head)


@pytest.mark.parametrize("feature_map", ["elu", "identity"])
@pytest.mark.parametrize("normalize", [True, False])
def test_linear_attention_equals_its_quadratic_form(feature_map, normalize):
    """y_t = Σ_{s≤t} γ^(t−s) (φ(q_t)·φ(k_s)) v_s, divided by the same sum without v when normalised
    (ε = 0); identity scales q by D^−½."""
    seq, params, _ = linear_attention_inputs()
    q, k, v = seq["q"], seq["k"], seq["v"]
    if feature_map == "identity" and normalize:  # a normaliser kept off zero: positive queries and keys
        q, k = q.abs(), k.abs()
    phi = (lambda t: F.elu(t) + 1) if feature_map == "elu" else (lambda t: t)
    scale = 1.0 if feature_map == "elu" else 4 ** -0.5  # D = 4
    scores = torch.einsum("bthd,bshd->bhts", phi(q) * scale, phi(k))
    t = torch.arange(T, dtype=F64)
    weights = params["gamma"][:, None, None] ** (t[:, None] - t[None]).clamp(min=0) * (t[:, None] >= t[None])
    scores = scores * weights                                                     # (B, H, T, S)
    expected = torch.einsum("bhts,bshd->bthd", scores, v)
    if normalize:
        expected = expected / scores.sum(-1).transpose(1, 2)[..., None]
    y, _ = reference.linear_attention(q, k, v, params["gamma"], feature_map=feature_map, normalize=normalize, eps=0.0)
    torch.testing.assert_close(y, expected)


@pytest.mark.parametrize("name", RECURRENCES)
def test_a_sequence_continued_from_its_state_equals_the_whole(name):
    """The first 5 tokens from a given state, then the rest from the state they leave: the outputs
    and the final state of the whole sequence from that state."""
    fn, make = RECURRENCES[name]
    seq, params, state = make()
    whole = fn(**seq, **params, state=state)
    head = fn(**{k: v[:, :5] for k, v in seq.items()}, **params, state=state)
    tail = fn(**{k: v[:, 5:] for k, v in seq.items()}, **params, state=head[1])
    torch.testing.assert_close(torch.cat([head[0], tail[0]], dim=1), whole[0])
    torch.testing.assert_close(flat(tail)[1:], flat(whole)[1:])


@pytest.mark.parametrize("name", RECURRENCES)
def test_without_a_state_each_starts_from_zeros_in_the_dtype_it_is_given(name):
    fn, make = RECURRENCES[name]
    seq, params, state = make()
    zeros = [torch.zeros_like(s) for s in parts(state)]
    given = fn(**seq, **params, state=zeros[0] if isinstance(state, torch.Tensor) else tuple(zeros))
    torch.testing.assert_close(flat(fn(**seq, **params)), flat(given))
    single = fn(**{k: v.float() for k, v in seq.items()}, **{k: v.float() for k, v in params.items()})
    assert {t.dtype for t in flat(single)} == {torch.float32}


def test_unknown_options_and_groups_that_do_not_divide_the_heads_raise():
    seq, params, _ = linear_attention_inputs()
    with pytest.raises(InputError, match=r"reference.linear_attention: feature_map='relu' is not one of elu, "
                                         r"identity"):
        reference.linear_attention(**seq, feature_map="relu")
    cell, weights, _ = cell_inputs(1, 1)()
    with pytest.raises(InputError, match=r"reference.rnn: nonlinearity='gelu' is not one of tanh, relu"):
        reference.rnn(**cell, **weights, nonlinearity="gelu")
    seq, params, _ = ssd_inputs()
    with pytest.raises(InputError, match=r"reference.ssd: heads=6 \(x's dim 2\) must be a multiple of groups=4"):
        reference.ssd(seq["x"], seq["dt"], params["a"], randn(2, T, 4, 5), randn(2, T, 4, 5))


# -- the built-in mixers against their recurrences (seqzoo.testing.matches_reference) ----------------
def causal_conv(m, x):
    """The mixer's depthwise conv over time, K − 1 zeros before the first token, then SiLU."""
    return F.silu(m.conv1d(F.pad(x.transpose(1, 2), (m.kernel - 1, 0))).transpose(1, 2))


def through_mamba(m, x, run):
    u, z = m.in_proj(x).chunk(2, dim=-1)
    u = causal_conv(m, u)
    dt, B, C = m.x_proj(u).split([m.dt_rank, m.state_size, m.state_size], dim=-1)
    y, _ = run(u, F.softplus(m.dt_proj(dt)), -torch.exp(m.A_log), B, C)
    return m.out_proj((y + u * m.D) * F.silu(z))


def through_mamba2(m, x, run):
    z, xBC, dt = m.in_proj(x).split([m.inner, m.conv_dim, m.heads], dim=-1)
    u, B, C = causal_conv(m, xBC).split([m.inner, m.groups * m.state_size, m.groups * m.state_size], dim=-1)
    u, B, C = u.unflatten(-1, (m.heads, m.head_dim)), B.unflatten(-1, (m.groups, -1)), C.unflatten(-1, (m.groups, -1))
    y, _ = run(u, F.softplus(dt + m.dt_bias), -torch.exp(m.A_log), B, C)
    return m.out_proj(m.norm((y + u * m.D[:, None]).flatten(2), z))


@functools.cache
def docs_example() -> dict:
    """Runs the Python block of docs/plugins.md's section on ``seqzoo.reference`` (which checks the
    built-in linear attention) and returns its names."""
    text = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    section = text.split("### A recurrent mixer against `seqzoo.reference`", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert block, "docs/plugins.md: the seqzoo.reference section has no Python block"
    names: dict = {}
    exec(compile(block.group(1), "docs/plugins.md", "exec"), names)
    return names


@pytest.mark.parametrize("spec,run,adapter", [
    # 1e-9, not 1e-12: both mixers round A = −exp(A_log) through float32, in float64 too (1e-10 here).
    ({"kind": "mamba", "state": 4, "conv": 3}, reference.selective_scan, through_mamba),
    ({"kind": "mamba", "state": 4, "conv": 4, "bias": True, "dt_rank": 3}, reference.selective_scan, through_mamba),
    ({"kind": "mamba2", "state": 4, "head_dim": 8, "groups": 2}, reference.ssd, through_mamba2),
    ({"kind": "mamba2", "state": 4, "head_dim": 4, "groups": 4, "conv": 3}, reference.ssd, through_mamba2),
], ids=["mamba", "mamba-bias", "mamba2-groups2", "mamba2-groups4"])
def test_the_state_space_mixers_match_their_recurrences(spec, run, adapter):
    matches_reference(seqzoo.registry().create("mixer", spec, 16), run, adapter)


@pytest.mark.parametrize("params", [{}, {"decay": "retnet"}, {"feature_map": "identity", "decay": "retnet"},
                                    {"feature_map": "identity", "normalize": True, "decay": [0.5, 0.99]}])
def test_linear_attention_matches_its_recurrence_through_the_docs_adapter(params):
    mixer = seqzoo.registry().create("mixer", {"kind": "linear_attention", "heads": 2, "chunk": 4, **params}, 16)
    matches_reference(mixer, reference.linear_attention, docs_example()["through_reference"], tolerance=1e-12)


def test_matches_reference_fails_a_wrong_adapter_and_one_that_compares_nothing():
    mixer = seqzoo.registry().create("mixer", {"kind": "mamba", "state": 4}, 16)
    swapped = lambda m, x, run: through_mamba(m, x, lambda u, dt, A, B, C: run(u, dt, A, C, B))  # noqa: E731
    with pytest.raises(AssertionError, match=r"Mamba against selective_scan: the whole-sequence forward differs by "
                                             r".* of the reference's largest value \(1e-09 allowed\)"):
        matches_reference(mixer, reference.selective_scan, swapped)
    with pytest.raises(AssertionError, match=r"Mamba against selective_scan: the adapter never called the "
                                             r"reference it was given"):
        matches_reference(mixer, reference.selective_scan, lambda m, x, run: torch.zeros_like(x))
    assert mixer.D.dtype == torch.float32 and torch.equal(mixer.D, torch.ones(32))  # the caller's is untouched
