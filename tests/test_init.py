"""The model's initialisation is decided per tensor from what each component declares
(``Part.residual_projections``, ``keep_init``, ``own_init``), as mamba_ssm's ``_init_weights`` marks
single tensors: the residual projections start at std / √(residual branches), Mamba's Δ
projection keeps its own start, and torch's cells keep theirs."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import seqzoo

STD = 0.02


def std_of(tensor: torch.Tensor) -> float:
    return tensor.detach().float().std().item()


@pytest.mark.parametrize("recipe", ["tiny-mamba", "tiny-mamba2"])
def test_a_mamba_stack_scales_out_proj_by_its_depth_and_keeps_the_step_size_start(recipe):
    model = seqzoo.build(recipe, ["model.dim=128", "model.layers=8"])
    branches = 8  # a Mamba layer is a mixer alone: one residual branch per layer (mamba_ssm's n_residuals_per_layer)
    assert model.decoder.residual_branches == branches
    for block in model.decoder.blocks:
        mixer = block.mixer
        assert std_of(mixer.out_proj.weight) == pytest.approx(STD / math.sqrt(branches), rel=0.06)
        assert std_of(mixer.in_proj.weight) == pytest.approx(STD, rel=0.06)
        if recipe == "tiny-mamba":
            dt = F.softplus(mixer.dt_proj.bias.detach())  # softplus⁻¹ of a log-uniform step in [0.001, 0.1]
            bound = mixer.dt_rank ** -0.5
            assert std_of(mixer.x_proj.weight) == pytest.approx(STD, rel=0.06)
            assert mixer.dt_proj.weight.abs().max() <= bound and std_of(mixer.dt_proj.weight) > 0.3 * bound
        else:
            dt = F.softplus(mixer.dt_bias.detach())
        assert dt.min() >= 0.001 * (1 - 1e-4) and dt.max() <= 0.1 * (1 + 1e-4) and dt.std() > 0
        assert torch.equal(mixer.D.detach(), torch.ones_like(mixer.D))


def test_an_attention_model_scales_out_proj_and_down_by_two_branches_a_layer():
    model = seqzoo.build("tiny-llama", ["model.dim=128", "model.layers=8", "model.ffn.hidden=512"])
    assert model.decoder.residual_branches == 16
    block = model.decoder.blocks[3]
    assert std_of(block.mixer.out_proj.weight) == pytest.approx(STD / 4, rel=0.06)
    assert std_of(block.ffn.down.weight) == pytest.approx(STD / 4, rel=0.06)
    assert std_of(block.ffn.up.weight) == pytest.approx(STD, rel=0.06)


def test_a_mimetic_start_survives_the_models_initialisation():
    model = seqzoo.build("tiny-mamba", ["model.mixer.mimetic=true"])
    for block in model.decoder.blocks:
        mixer = block.mixer
        rows = mixer.x_proj.weight
        n, r = mixer.state_size, mixer.dt_rank
        assert torch.equal(rows[r:r + n], rows[r + n:])
        assert std_of(mixer.out_proj.weight) == pytest.approx(STD / math.sqrt(4), rel=0.1)
    model = seqzoo.build("tiny-mamba2", ["model.mixer.mimetic=true"])
    mixer = model.decoder.blocks[0].mixer
    width = mixer.groups * mixer.state_size
    b = 2 * mixer.inner
    assert torch.equal(mixer.in_proj.weight[b:b + width], mixer.in_proj.weight[b + width:b + 2 * width])


def test_a_cell_with_its_own_initialisation_is_left_alone():
    model = seqzoo.build("tiny-gru-mixer")
    cell = model.decoder.blocks[0].mixer.cell
    bound = 1 / math.sqrt(cell.hidden_size)  # torch's U(−1/√H, 1/√H)
    for weight in (cell.weight_ih, cell.weight_hh):
        assert weight.abs().max() <= bound and std_of(weight) == pytest.approx(bound / math.sqrt(3), rel=0.1)
