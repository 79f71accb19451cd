"""Checkpoints written before the mixer slot was renamed (``attn`` -> ``mixer``, ``attn_norm`` ->
``mixer_norm``, ``attn_out_norm`` -> ``mixer_out_norm``) load into today's models exactly: the
files in tests/data/legacy were written by seqzoo 64f90cd, with the logits it computed then, on two
threads (a GRU's sums split by thread differ in the last bit, so the tests compute on two as well)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import seqzoo

LEGACY = Path(__file__).parent / "data" / "legacy"
IDS = torch.tensor([[5, 17, 42, 99, 3, 64, 7, 200, 11, 1]])
MODELS = ["tiny-hybrid", "tiny-mamba", "tiny-gemma2", "tiny-t5", "tiny-modernbert", "tiny-gru-mixer"]


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name", MODELS)
def test_a_checkpoint_with_attn_names_loads_with_identical_logits(name, two_threads):
    path = LEGACY / f"{name}.safetensors"
    with safe_open(str(path), framework="pt") as handle:
        assert any(".attn." in key or ".attn_norm." in key for key in handle.keys())  # the old names
    model = seqzoo.load(path)
    names = list(model.state_dict())
    assert not [n for n in names if ".attn." in n or ".attn_norm." in n or ".attn_out_norm." in n]
    with torch.no_grad():
        logits = model(IDS, IDS[:, :6]) if name == "tiny-t5" else model(IDS)
    expected = load_file(str(LEGACY / "logits.safetensors"))[name.replace("-", "_")]
    assert torch.equal(logits, expected)


def test_the_old_per_layer_attn_norm_key_reads_as_mixer_norm():
    model = seqzoo.load(LEGACY / "tiny-modernbert.safetensors")
    assert model.recipe["model"]["layer_overrides"] == {"0": {"mixer_norm": False}}
    assert model.encoder.blocks[0].mixer_norm is None and model.encoder.blocks[1].mixer_norm is not None


@pytest.mark.parametrize("recipe", ["tiny-gpt", "tiny-mamba", "tiny-hybrid", "tiny-gemma2", "tiny-t5", "tiny-mla",
                                    "tiny-gru-mixer", "tiny-modernbert", "tiny-moe"])
def test_no_built_model_names_a_tensor_attn(recipe):
    model = seqzoo.build(recipe, device="meta")
    assert not [n for n in model.state_dict() if ".attn." in n or "attn_norm" in n or "attn_out_norm" in n]
