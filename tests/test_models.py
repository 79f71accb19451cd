"""Shipped recipes build to the exact sizes of the models they describe."""
from __future__ import annotations

import time

import pytest
import torch

import seqzoo
from seqzoo.recipe import shipped_recipes


def count(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name, expected", [
    ("gpt2", 124_439_808),
    ("bert-base", 109_482_240),     # BertModel with pooler
    ("t5-small", 60_506_624),
    ("llama2-7b", 6_738_415_616),
    ("mistral-7b", 7_241_732_096),  # GQA 32/8, window 4096
    ("bloom-560m", 559_214_592),
    ("transformer-base", 63_082_496),  # shared 37k vocabulary, tied output (paper: "65M")
    ("mamba-130m", 129_135_360),    # = transformers' MambaForCausalLM of the same config
    ("mamba2-130m", 128_989_632),   # = transformers' Mamba2ForCausalLM of the same config
])
def test_real_model_parameter_counts_on_meta(name, expected):
    model = seqzoo.build(name, device="meta")
    assert count(model) == expected
    assert next(model.parameters()).device.type == "meta"


@pytest.mark.parametrize("name", shipped_recipes())
def test_every_shipped_recipe_builds_on_meta(name):
    assert count(seqzoo.build(name, device="meta")) > 0


def test_tiny_gpt_builds_and_runs_well_under_a_second():
    # CPU seconds of this process, not wall time: a suite run beside other work (a study, a
    # benchmark) is descheduled for seconds at a time, which says nothing about the build
    start = time.process_time()
    model = seqzoo.build("tiny-gpt", device="cpu")
    with torch.no_grad():
        logits = model(torch.randint(0, 259, (1, 32)))
    assert time.process_time() - start < 1.0
    assert logits.shape == (1, 32, 259)
    assert 100_000 < count(model) < 1_000_000


def test_build_casts_to_the_requested_dtype():
    model = seqzoo.build("tiny-gpt", device="cpu", dtype="bfloat16")
    assert model.embed.weight.dtype == torch.bfloat16
    assert model.lm_head.weight is model.embed.weight


def test_build_unknown_device_is_a_clear_error():
    with pytest.raises(seqzoo.SeqzooError, match="unknown device 'tpu'"):
        seqzoo.build("tiny-gpt", device="tpu")


def test_residual_projections_get_the_depth_scaled_init():
    model = seqzoo.build("tiny-gpt", ["model.layers=8", "model.dim=128"], device="cpu")
    out_std = model.decoder.blocks[0].mixer.out_proj.weight.std().item()
    qkv_std = model.decoder.blocks[0].mixer.qkv_proj.weight.std().item()
    assert qkv_std == pytest.approx(0.02, rel=0.05)
    assert out_std == pytest.approx(0.02 / 4, rel=0.05)  # 0.02 / √(2·8)
