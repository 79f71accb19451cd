"""Training: schedule, batch format, every model family learns, exact resume, metrics, faults,
and torchrun with 2 CPU processes (DDP and FSDP2)."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

import seqzoo
from seqzoo.cli import main
from seqzoo.recipe import resolve
from seqzoo.training import IGNORE, Examples, TrainConfig, TrainingError, lr_factor, train


def config(**overrides) -> TrainConfig:
    base = {"task": {"kind": "copy", "min_len": 1, "max_len": 4}, "steps": 30, "batch_size": 8,
            "lr": 3e-3, "warmup": 5, "eval_examples": 16, "log_every": 5}
    return TrainConfig(**{**base, **overrides})


def test_lr_warms_up_linearly_then_follows_a_cosine_to_the_floor():
    cfg = TrainConfig(steps=110, warmup=10, min_lr_ratio=0.1)
    assert lr_factor(0, cfg) == pytest.approx(0.1) and lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    assert lr_factor(60, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(110, cfg) == pytest.approx(0.1)
    assert lr_factor(60, TrainConfig(steps=110, warmup=10, schedule="constant")) == 1.0


def test_causal_batches_put_loss_on_the_answer_and_eos_only():
    model = seqzoo.build("tiny-gpt", device="cpu")
    task = seqzoo.registry().create("task", "copy")
    examples = Examples(model, seqzoo.tokenizer(model), task)
    batch = examples.batch([("ab", "ab"), ("c", "c")], torch.device("cpu"))
    # "ab=ab<eos>" -> inputs "ab=ab", labels ignore until after "=".
    assert batch["ids"][0].tolist() == [97, 98, 61, 97, 98]
    assert batch["labels"][0].tolist() == [IGNORE, IGNORE, 97, 98, 258]
    assert batch["ids"][1].tolist() == [99, 61, 99, 256, 256]  # right-padded with pad
    assert batch["labels"][1].tolist() == [IGNORE, 99, 258, IGNORE, IGNORE]


def test_seq2seq_batches_shift_the_target():
    model = seqzoo.build("tiny-t5", device="cpu")
    examples = Examples(model, seqzoo.tokenizer(model), seqzoo.registry().create("task", "reverse"))
    batch = examples.batch([("ab", "ba")], torch.device("cpu"))
    assert batch["src"][0].tolist() == [97, 98, 258] and batch["src_mask"][0].tolist() == [1, 1, 1]
    assert batch["tgt"][0].tolist()[1:] == [98, 97]
    assert batch["labels"][0].tolist() == [98, 97, 258]


@pytest.mark.parametrize("recipe", ["tiny-gpt", "tiny-t5", "tiny-seq2seq", "rnn-lm", "tiny-llama"])
def test_every_family_learns(recipe):
    torch.manual_seed(0)
    overrides = ["model.dim=32", "model.hidden=32"] if recipe == "rnn-lm" else []
    model = seqzoo.build(recipe, overrides, device="cpu")
    result = train(model, config(steps=60), seqzoo.tokenizer(model), quiet=True)
    losses = [entry["loss"] for entry in result.history]
    assert losses[-1] < 0.85 * losses[0]
    assert 0.0 <= result.eval["accuracy"] <= 1.0 and result.eval["examples"] == 16


def test_resume_continues_exactly(tmp_path):
    recipe = resolve("tiny-gpt", ["model.attention.dropout=0.1", "model.dropout=0.1"]).data
    cfg = config(steps=12)

    def fresh():
        torch.manual_seed(0)
        model = seqzoo.build(recipe, device="cpu")
        model.recipe = {**model.recipe, "train": vars(cfg)}
        return model

    straight = fresh()
    train(straight, cfg, seqzoo.tokenizer(straight), quiet=True)
    first = fresh()
    train(first, cfg, seqzoo.tokenizer(first), output=str(tmp_path / "half.safetensors"), until=5, quiet=True)
    resumed = seqzoo.load(tmp_path / "half.safetensors", device="cpu")
    train(resumed, cfg, seqzoo.tokenizer(resumed), resume=str(tmp_path / "half.safetensors"), quiet=True)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_cli_train_writes_checkpoint_metrics_and_resumes(tmp_path, capsys):
    ckpt, metrics = tmp_path / "m.safetensors", tmp_path / "m.json"
    args = ["train", "tiny-gpt", "-o", str(ckpt), "--quiet", "--set", "train.steps=10",
            "--set", "train.eval_examples=8", "--set", "train.log_every=2"]
    assert main([*args, "--until", "4", "--metrics", str(metrics)]) == 0
    assert main([*args, "--resume", str(ckpt), "--metrics", str(metrics)]) == 0
    data = json.loads(metrics.read_text())
    assert [entry["step"] for entry in data["history"]] == [2, 4, 6, 8, 10]
    assert {"loss", "lr", "tokens_per_s"} <= set(data["history"][0])
    assert {"loss", "accuracy"} <= set(data["eval"]) and data["example_prompt"].endswith("=")
    out = capsys.readouterr().out
    assert "seqzoo generate" in out and "--prompt" in out
    assert seqzoo.load(ckpt).recipe["train"]["steps"] == 10


def test_resume_from_a_plain_checkpoint_is_a_clear_error(tmp_path):
    model = seqzoo.build("tiny-gpt", device="cpu")
    seqzoo.save(model, tmp_path / "plain.safetensors")
    with pytest.raises(TrainingError, match="not a training checkpoint"):
        train(model, config(), seqzoo.tokenizer(model), resume=str(tmp_path / "plain.safetensors"), quiet=True)


def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_checkpoint(tmp_path):
    model = seqzoo.build("tiny-gpt", device="cpu")
    ckpt = tmp_path / "m.safetensors"
    train(model, config(steps=3), seqzoo.tokenizer(model), output=str(ckpt), quiet=True)
    before = ckpt.read_bytes()
    with torch.no_grad():
        model.decoder.blocks[0].ffn.up.weight.fill_(float("nan"))
    with pytest.raises(TrainingError, match=r"step 1: the loss is nan; stopped, .*m\.safetensors keeps the last good checkpoint"):
        train(model, config(steps=3), seqzoo.tokenizer(model), output=str(ckpt), quiet=True)
    assert ckpt.read_bytes() == before


def test_encoders_cannot_train_on_tasks():
    model = seqzoo.build("tiny-bert", device="cpu")
    with pytest.raises(TrainingError, match="Encoder cannot be trained on tasks"):
        train(model, config(), seqzoo.tokenizer(model), quiet=True)


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="needs torchrun")
def test_torchrun_two_cpu_processes_ddp_and_fsdp_agree(tmp_path):
    outputs = {}
    for parallel in ("ddp", "fsdp"):
        out = tmp_path / f"{parallel}.safetensors"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        run = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "seqzoo",
             "train", "tiny-gpt", "--quiet", "-o", str(out), "--set", "train.steps=6",
             "--set", "train.eval_examples=8", "--set", f"train.parallel={parallel}"],
            capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
        assert run.returncode == 0, run.stderr[-2000:]
        outputs[parallel] = seqzoo.load(out)
    single = seqzoo.build("tiny-gpt", device="cpu")
    for (name, a), b, c in zip(outputs["ddp"].state_dict().items(), outputs["fsdp"].state_dict().values(),
                               single.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)
    assert any(not torch.equal(a, c) for a, c in zip(outputs["ddp"].state_dict().values(),
                                                      single.state_dict().values()))
