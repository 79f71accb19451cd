"""The ``muon`` optimizer: torch's Muon on the hidden matrices and torch's AdamW on the rest, bit for
bit against the two classes stepped side by side; one step against the Newton–Schulz iteration and
the match_rms_adamw scale written out; a stacked weight ([q | k | v]) stepped as its blocks would be
apart; its options (matrix_lr, adjust_lr, split_stacked) and refusals."""
from __future__ import annotations

import math

import pytest
import torch

import seqzoo
from seqzoo.errors import ConfigError
from seqzoo.interfaces import TrainedParameters

LR, DECAY, BETAS = 2e-2, 0.1, (0.9, 0.95)


def problem():
    """A hidden matrix (4, 3), an embedding-like matrix (5, 3) and a bias: y = tanh(E[i] W) + b."""
    torch.manual_seed(4)
    hidden, table, bias = (torch.randn(3, 4, requires_grad=True), torch.randn(5, 3, requires_grad=True),
                           torch.zeros(4, requires_grad=True))
    ids, target = torch.tensor([0, 2, 4, 1]), torch.randn(4, 4)
    return (hidden, table, bias), lambda: ((torch.tanh(table[ids] @ hidden) + bias - target) ** 2).sum()


def muon(**options):
    return seqzoo.registry().create("optimizer", {"kind": "muon", **options})


def build(params, **options):
    hidden, table, bias = params
    return muon(**options).build(TrainedParameters((hidden, table), (bias,), (hidden,)), lr=LR,
                                 weight_decay=DECAY, betas=BETAS)


def test_steps_equal_torchs_muon_and_adamw_side_by_side(steps):
    params, loss = problem()
    steps(build(params), loss, 4)
    (hidden, table, bias), twin_loss = problem()
    parts = [torch.optim.Muon([hidden], lr=LR, weight_decay=DECAY, adjust_lr_fn="match_rms_adamw"),
             torch.optim.AdamW([{"params": [table], "weight_decay": DECAY}, {"params": [bias], "weight_decay": 0.0}],
                               lr=LR, betas=BETAS, fused=True)]
    for _ in range(4):
        for part in parts:
            part.zero_grad()
        twin_loss().backward()
        for part in parts:
            part.step()
    for ours, theirs in zip(params, (hidden, table, bias)):
        assert torch.equal(ours, theirs)


ROWS = (4, 2, 1)  # a stacked weight's blocks: [q | k | v] of a GQA projection, shrunk


def stacked_problem():
    """A (7, 3) weight that stacks three matrices of ``ROWS`` rows, and the same three apart."""
    torch.manual_seed(5)
    whole = torch.nn.Parameter(torch.randn(7, 3))
    apart = [torch.nn.Parameter(block.detach().clone()) for block in whole.detach().split(ROWS)]
    return whole, apart, [torch.randn(7, 3) for _ in range(3)]


@pytest.mark.parametrize("adjust", ["match_rms_adamw", "original"])
def test_a_stacked_weight_steps_as_its_blocks_would_apart(adjust):
    """Each block is orthogonalised and its rate scaled by its own shape: bit for bit the three
    matrices under torch's Muon, with one momentum buffer of the whole weight's shape (a checkpoint
    as torch's Muon keeps it)."""
    whole, apart, grads = stacked_problem()
    params = TrainedParameters((whole,), (), (whole,), stacked={id(whole): ROWS})
    ours = muon(adjust_lr=adjust).build(params, lr=LR, weight_decay=DECAY, betas=BETAS)
    theirs = torch.optim.Muon(apart, lr=LR, weight_decay=DECAY, adjust_lr_fn=adjust)
    for grad in grads:
        whole.grad = grad.clone()
        for param, block in zip(apart, grad.split(ROWS)):
            param.grad = block.clone()
        ours.step()
        theirs.step()
    assert torch.equal(whole.detach(), torch.cat([p.detach() for p in apart]))
    buffers = [state["momentum_buffer"] for state in ours.state_dict()["state"].values() if "momentum_buffer" in state]
    assert [b.shape for b in buffers] == [(7, 3)]


def test_split_stacked_false_steps_the_stack_whole_as_torchs_muon():
    whole, _, grads = stacked_problem()
    twin = torch.nn.Parameter(whole.detach().clone())
    params = TrainedParameters((whole,), (), (whole,), stacked={id(whole): ROWS})
    ours = muon(split_stacked=False).build(params, lr=LR, weight_decay=DECAY, betas=BETAS)
    theirs = torch.optim.Muon([twin], lr=LR, weight_decay=DECAY, adjust_lr_fn="match_rms_adamw")
    for grad in grads:
        whole.grad, twin.grad = grad.clone(), grad.clone()
        ours.step()
        theirs.step()
    assert torch.equal(whole.detach(), twin.detach())
    split = torch.nn.Parameter(twin.detach().clone())  # from the same start, one step each way
    for flag, param in ((True, split), (False, twin)):
        step = muon(split_stacked=flag).build(TrainedParameters((param,), (), (param,), stacked={id(param): ROWS}),
                                              lr=LR, weight_decay=DECAY, betas=BETAS)
        param.grad = grads[0].clone()
        step.step()
    assert not torch.equal(split.detach(), twin.detach())  # the two are different steps


def newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The quintic iteration X ← aX + (b·XXᵀ + c·(XXᵀ)²)X from X = G/‖G‖_F on the wide orientation
    (more columns than rows), in float64."""
    a, b, c = 3.4445, -4.775, 2.0315
    x = g.double()
    wide = x.shape[0] <= x.shape[1]
    x = (x if wide else x.T) / x.norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x if wide else x.T).float()


def test_first_step_is_the_orthogonalised_gradient_at_adamws_rms():
    params, loss = problem()
    hidden = params[0]
    start = hidden.detach().clone()
    loss().backward()
    grad = hidden.grad.clone()
    optimizer = build(params, momentum=0.95)
    optimizer.step()
    # Step 1 with Nesterov: B = (1 − μ)g, the update (1 − μ)g + μB ∝ g, which NS normalises away.
    scale = LR * 0.2 * math.sqrt(max(hidden.shape))  # match_rms_adamw: 0.2·√max(A, B)
    want = start * (1 - LR * DECAY) - scale * newton_schulz(grad)
    # Muon iterates in bfloat16 (8 bits of mantissa, five steps): within 2% of the update's scale.
    torch.testing.assert_close(hidden.detach(), want, rtol=0, atol=0.02 * scale)
    singular = torch.linalg.svdvals(newton_schulz(grad))
    assert singular.min() > 0.5 and singular.max() < 1.5  # pushed towards 1: an orthogonalised update


def test_matrix_lr_and_keller_jordans_scale_set_the_hidden_groups_rate_only():
    params, _ = problem()
    optimizer = build(params, matrix_lr=0.02, adjust_lr="original")
    rates = [group["lr"] for group in optimizer.param_groups]
    assert rates == [0.02, LR, LR] and optimizer.param_groups[0]["adjust_lr_fn"] == "original"
    assert [len(group["params"]) for group in optimizer.param_groups] == [1, 1, 1]


def test_a_model_without_hidden_matrices_is_refused():
    with pytest.raises(ConfigError, match=r"optimizer muon: the model declares no hidden matrices .* use adamw"):
        muon().build(TrainedParameters((torch.zeros(2, 2),), ()), lr=LR, weight_decay=DECAY, betas=BETAS)


def test_options_out_of_range_are_refused_naming_the_key():
    with pytest.raises(seqzoo.errors.RegistryError, match=r"optimizer.ns_steps: 0 is out of range: must be >= 1"):
        muon(ns_steps=0)
    with pytest.raises(seqzoo.errors.RegistryError, match=r"'orthogonal' is not one of 'match_rms_adamw', 'original'"):
        muon(adjust_lr="orthogonal")


def test_a_torch_without_muon_is_refused_naming_the_version(monkeypatch):
    monkeypatch.delattr(torch.optim, "Muon")
    with pytest.raises(ConfigError, match=r"optimizer muon needs torch.optim.Muon \(torch >= 2.9\); this torch is "):
        muon()
