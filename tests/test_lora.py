"""Fine-tuning pretrained models: train.freeze / train.trainable, LoRA through peft (adapters only
train, checkpoints hold the merged weights, the adapter file), and the refusals."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

import seqzoo
from seqzoo.cli import main

pytest.importorskip("peft")


@pytest.fixture
def base(tmp_path):
    torch.manual_seed(0)
    model = seqzoo.build("tiny-gpt", ["train.steps=4", "train.log_every=2"], device="cpu")
    seqzoo.save(model, tmp_path / "base.safetensors")
    return tmp_path / "base.safetensors"


def run(tmp_path, base, *sets) -> dict[str, torch.Tensor]:
    out = tmp_path / "out.safetensors"
    args = ["train", "tiny-gpt", "--init", str(base), "-o", str(out), "--quiet", "--set", "train.steps=4",
            "--set", "train.eval_examples=4"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    return seqzoo.load(out).state_dict(), seqzoo.load(base).state_dict()


def test_frozen_parameters_do_not_move_and_the_others_do(tmp_path, base):
    after, before = run(tmp_path, base, "train.freeze=['decoder.blocks.0.*', 'embed.*']")
    for name in after:
        moved = not torch.equal(after[name], before[name])
        frozen = name.startswith(("decoder.blocks.0.", "embed.", "lm_head."))  # tiny-gpt ties the head
        assert moved != frozen, name


def test_trainable_names_the_only_parameters_that_train(tmp_path, base):
    after, before = run(tmp_path, base, "train.trainable=['*norm*']")
    for name in after:
        assert torch.equal(after[name], before[name]) != ("norm" in name), name


def test_lora_trains_the_adapters_and_the_checkpoint_holds_merged_weights(tmp_path, base):
    adapter = tmp_path / "adapter.safetensors"
    after, before = run(tmp_path, base, "train.lora={rank: 4, alpha: 8, targets: [qkv_proj, out_proj]}",
                        f"train.lora.adapter={adapter}", "train.lr=1e-2")
    assert set(after) == set(before)  # the model's own names: nothing of peft is left
    for name in after:
        changed = not torch.equal(after[name], before[name])
        assert changed == ("qkv_proj.weight" in name or "out_proj.weight" in name), name
    with safe_open(str(adapter), "pt") as f:
        keys = list(f.keys())
        meta = json.loads(f.metadata()["seqzoo.lora"])
        a, b = f.get_tensor("decoder.blocks.1.mixer.qkv_proj.lora_A.weight"), f.get_tensor(
            "decoder.blocks.1.mixer.qkv_proj.lora_B.weight")
    assert meta["rank"] == 4 and len(keys) == 2 * 2 * len(seqzoo.load(base).decoder.blocks)
    # the merged weight is the base weight plus (alpha / r) · B A
    name = "decoder.blocks.1.mixer.qkv_proj.weight"
    assert torch.allclose(after[name], before[name] + (8 / 4) * b @ a, atol=1e-6)


def test_lora_runs_cannot_be_resumed_and_freezing_everything_is_refused(tmp_path, base, capsys):
    assert main(["train", "tiny-gpt", "--init", str(base), "--quiet", "--set", "train.steps=2",
                 "--set", "train.freeze=['*']"]) == 2
    assert "leave no parameter to train" in capsys.readouterr().err
    out = tmp_path / "lora.safetensors"
    assert main(["train", "tiny-gpt", "--init", str(base), "-o", str(out), "--quiet", "--set", "train.steps=2",
                 "--set", "train.eval_examples=4",
                 "--set", "train.lora={rank: 2}", "--until", "1"]) == 0
    assert main(["train", "--resume", str(out), "--quiet"]) == 2
    assert "LoRA run is not supported" in capsys.readouterr().err
