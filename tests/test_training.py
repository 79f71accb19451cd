"""Training: schedule, batch format, every model family learns, exact resume (every optimizer and
schedule), metrics, faults, and torchrun with 2 CPU processes (DDP and FSDP2)."""
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
from seqzoo.config import TrainConfig
from seqzoo.errors import TrainingError
from seqzoo.interfaces import IGNORE
from seqzoo.recipe import resolve
from seqzoo.train.examples import Examples
from seqzoo.train.training import lr_factor, train


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
    assert result.eval["loss"] < 0.85 * losses[0], result.eval  # on held-out examples too
    correct = result.eval["accuracy"] * result.eval["examples"]
    assert result.eval["examples"] == 16 and correct == round(correct)  # a count of exact matches


@pytest.mark.parametrize("optimizer, schedule", [
    ("adamw", "cosine"), ("adamw", "linear"), ({"kind": "muon", "matrix_lr": 0.01}, "wsd"), ("muon", "cosine"),
    ("adafactor", "inverse_sqrt"), ("sgd", {"kind": "wsd", "shape": "sqrt", "decay": 0.5}), ("sgd", "constant")])
def test_resume_continues_exactly(optimizer, schedule, tmp_path):
    """Every optimizer and schedule: Muon's momentum, Adafactor's factored moments and SGD's buffers go
    through the checkpoint, and the resumed run lands on the weights of one that never stopped, on the
    schedule's rates."""
    layers = [] if optimizer == "adamw" and schedule == "cosine" else ["model.layers=1"]  # the others: quicker
    recipe = resolve("tiny-gpt", ["model.attention.dropout=0.1", "model.dropout=0.1", *layers]).data
    cfg = config(steps=12, optimizer=optimizer, schedule=schedule, log_every=1)

    def fresh():
        torch.manual_seed(0)
        model = seqzoo.build(recipe, device="cpu")
        model.recipe = {**model.recipe, "train": vars(cfg)}
        return model

    straight = fresh()
    whole = train(straight, cfg, seqzoo.tokenizer(straight), quiet=True)
    first = fresh()
    train(first, cfg, seqzoo.tokenizer(first), output=str(tmp_path / "half.safetensors"), until=5, quiet=True)
    resumed = seqzoo.load(tmp_path / "half.safetensors", device="cpu")
    rest = train(resumed, cfg, seqzoo.tokenizer(resumed), resume=str(tmp_path / "half.safetensors"), quiet=True)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    assert [h["lr"] for h in rest.history] == [h["lr"] for h in whole.history]


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
    with pytest.raises(TrainingError, match=r"step 1: the loss is nan; stopped, .*m\.safetensors keeps the last good "
                                            r"checkpoint"):
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
             "--set", "train.eval_examples=8", "--set", f"train.parallel={parallel}",
             "--set", "train.precision=float32"],
            capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
        assert run.returncode == 0, run.stderr[-2000:]
        outputs[parallel] = seqzoo.load(out)
    single = seqzoo.build("tiny-gpt", device="cpu")
    for (name, a), b in zip(outputs["ddp"].state_dict().items(), outputs["fsdp"].state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)
    assert any(not torch.equal(a, c) for a, c in zip(outputs["ddp"].state_dict().values(),
                                                      single.state_dict().values()))


# -- the first hour: a run is never lost, resume and init say what they do ---------------------------
def test_safetensors_is_declared_with_its_torch_extra():
    """safetensors needs numpy to save torch tensors and declares that only through its extra; the
    CPU torch wheel brings no numpy, so seqzoo must ask for the extra itself."""
    from importlib.metadata import requires

    declared = [r for r in requires("seqzoo") or [] if r.startswith("safetensors") and "extra ==" not in r]
    assert declared and all("[torch]" in r for r in declared), declared


NO_NUMPY = """
import sys
sys.modules["numpy"] = None  # as on a fresh CPU torch install: `import numpy` fails, find_spec says None
from seqzoo.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_train_without_numpy_refuses_before_the_first_step(tmp_path):
    out = subprocess.run([sys.executable, "-c", NO_NUMPY, "train", "tiny-gpt", "-o", str(tmp_path / "m.safetensors"),
                          "--set", "train.steps=100000", "--quiet"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    # (torch itself warns that it found no numpy; seqzoo's own output is the one error line)
    assert [line for line in out.stderr.splitlines() if line.startswith("seqzoo")] == [
        "seqzoo: error: cannot save checkpoints here: safetensors needs numpy to save torch tensors and it is "
        "not installed (pip install 'safetensors[torch]')"]


def test_train_refuses_an_output_folder_that_does_not_exist(tmp_path, capsys):
    target = tmp_path / "missing" / "m.safetensors"
    assert main(["train", "tiny-gpt", "-o", str(target), "--set", "train.steps=100000", "--quiet"]) == 2
    assert f"folder {tmp_path / 'missing'} does not exist" in capsys.readouterr().err


def test_train_refuses_unwritable_metrics_and_log_dir_before_training(tmp_path, capsys):
    folder, file = tmp_path / "a-folder", tmp_path / "a-file"
    folder.mkdir()
    file.write_text("x")
    target = tmp_path / "m.safetensors"
    run = ["train", "tiny-gpt", "-o", str(target), "--set", "train.steps=2", "--quiet"]
    for option, value, message in [
            ("--metrics", folder, f"--metrics {folder}: is a directory; give a file name such as "
                                  f"{folder / 'metrics.json'}"),
            ("--metrics", file / "m.json", f"--metrics {file / 'm.json'}: {file} is a file, not a folder"),
            ("--log-dir", file / "logs", f"--log-dir {file / 'logs'}: {file} is a file, not a folder")]:
        assert main([*run, option, str(value)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"seqzoo: error: {message}"), err
    assert not target.exists()
    assert main(["train", "tiny-gpt", "-o", str(folder), "--quiet"]) == 2  # -o: refused as before, in these words
    assert capsys.readouterr().err.strip() == (f"seqzoo: error: -o {folder}: is a directory; give a file name such "
                                               f"as {folder / 'model.safetensors'}")
    # the metrics may go inside the log folder the run makes
    logs = tmp_path / "logs" / "run1"
    assert main([*run, "--log-dir", str(logs), "--metrics", str(logs / "train.json")]) == 0
    assert json.loads((logs / "train.json").read_text())["steps"] == 2


def test_a_failed_save_at_the_end_rescues_the_finished_run(tmp_path, monkeypatch):
    import seqzoo.train.training as training_module

    model = seqzoo.build("tiny-gpt", device="cpu")
    target = tmp_path / "gone" / "m.safetensors"
    target.parent.mkdir()
    real_save = training_module._save

    def save_after_the_folder_vanished(run, **kwargs):
        if (kwargs.get("output") or run.output) == str(target):
            target.parent.rmdir()  # e.g. a cleaned scratch folder: the save itself fails
        return real_save(run, **kwargs)

    monkeypatch.setattr(training_module, "_save", save_after_the_folder_vanished)
    with pytest.raises(TrainingError, match=r"could not save .*m\.safetensors .*; the finished run \(step 3\) is "
                                            r"saved at (\S+) instead") as caught:
        train(model, config(steps=3), seqzoo.tokenizer(model), output=str(target), quiet=True)
    rescue = str(caught.value).split(" is saved at ")[1].split(" instead")[0]
    try:
        restored = seqzoo.load(rescue)
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), restored.state_dict().values()))
    finally:
        os.unlink(rescue)


@pytest.fixture
def trained(tmp_path):
    ckpt = tmp_path / "gpt.safetensors"
    assert main(["train", "tiny-gpt", "-o", str(ckpt), "--quiet", "--set", "train.steps=4",
                 "--set", "train.eval_examples=4"]) == 0
    return ckpt


def test_resume_with_another_model_recipe_is_refused_naming_the_key(trained, capsys):
    capsys.readouterr()
    assert main(["train", "tiny-llama", "--resume", str(trained), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"seqzoo: error: --resume {trained}: tiny-llama differs from the "
                                               f"checkpoint's recipe at model.")


def test_resume_with_another_task_is_refused(trained, capsys):
    capsys.readouterr()
    assert main(["train", "tiny-gpt", "--resume", str(trained), "--set", "train.task=reverse", "--quiet"]) == 2
    assert "differs from the checkpoint's recipe at train.task.kind ('reverse' here, 'copy' in the checkpoint)" in \
        capsys.readouterr().err


def test_resume_prints_deliberate_train_changes_and_uses_the_checkpoints_recipe(trained, capsys):
    capsys.readouterr()
    assert main(["train", "--resume", str(trained), "--set", "train.steps=6", "--set", "train.eval_examples=4",
                 "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "resume: train.steps: 4 -> 6" in err
    assert seqzoo.load(trained).recipe["model"] == resolve("tiny-gpt").data["model"]


def test_resume_from_a_plain_checkpoint_points_to_init(tmp_path, capsys):
    plain = seqzoo.save(seqzoo.build("tiny-gpt", device="cpu"), tmp_path / "plain.safetensors")
    assert main(["train", "tiny-gpt", "--resume", str(plain), "--quiet"]) == 2
    assert f"use --init {plain}" in capsys.readouterr().err


def test_init_starts_from_the_checkpoints_weights(trained, tmp_path, capsys):
    out = tmp_path / "tuned.safetensors"
    start = seqzoo.load(trained)
    assert main(["train", "tiny-gpt", "--init", str(trained), "-o", str(out), "--quiet",
                 "--set", "train.steps=1", "--set", "train.eval_examples=4", "--set", "train.lr=1e-12",
                 "--set", "train.warmup=0"]) == 0
    assert f"init: weights and tokenizer from {trained}" in capsys.readouterr().err
    tuned = seqzoo.load(out)
    # One step at a vanishing learning rate: the weights are the checkpoint's, not a fresh init.
    for (name, a), b in zip(start.state_dict().items(), tuned.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_train_init_in_the_recipe_that_does_not_fit_names_the_tensors(trained, tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: tiny-gpt\nmodel: {{dim: 32}}\ntrain: {{init: {trained}}}\n")
    assert main(["train", str(recipe), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"r.yaml:3: train.init: {trained}: weights do not match the recipe: wrong shapes" in err


def test_train_given_a_checkpoint_as_the_recipe_says_what_to_do(trained, capsys):
    assert main(["train", str(trained)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"seqzoo: error: {trained}: is a checkpoint (safetensors), not a YAML recipe; its recipe is "
                   f"inside it: `seqzoo train --init {trained}` trains from its weights, `--resume` continues its "
                   f"run, `seqzoo generate {trained}` runs it")


@pytest.mark.parametrize("name", ["tiny-mamba", "tiny-mamba2", "tiny-llama"])
def test_weight_decay_spares_norms_biases_and_mambas_a_and_d(name):
    """AdamW decays weight matrices only: not vectors, and not Mamba's A_log (a matrix in Mamba 1)
    or D, which the reference implementation (mamba_ssm) marks ``_no_weight_decay``."""
    from seqzoo.train.optimization import optimizer_for

    model = seqzoo.build(name, device="cpu")
    decayed, spared = optimizer_for(model, TrainConfig(weight_decay=0.1)).param_groups
    assert decayed["weight_decay"] == 0.1 and spared["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed_names = {names[id(p)] for p in decayed["params"]}
    spared_names = {names[id(p)] for p in spared["params"]}
    assert decayed_names | spared_names == set(names.values())
    assert not any(n.endswith(("A_log", ".D", "norm.weight", "bias")) for n in decayed_names), decayed_names
    assert any(n.endswith("out_proj.weight") or n.endswith("o_proj.weight") for n in decayed_names)
    if name == "tiny-mamba":
        assert "decoder.blocks.0.mixer.A_log" in spared_names  # (inner, state): a matrix, yet spared


# -- the step loop: nanoGPT's micro-step loop ---------------------------------------------------------
def test_the_loop_reads_the_device_only_at_log_steps(monkeypatch):
    """The loss and the token count stay on the device; training.py converts a tensor to a Python
    number (a sync on an accelerator) only where it logs: 2 log steps of 10, whatever the
    micro-batches."""
    import sys

    import seqzoo.train.training as training_module

    reads = []

    def counting(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            caller = sys._getframe(1).f_code
            if caller.co_filename == training_module.__file__ and caller.co_name in ("_loop", "_one_step",
                                                                                      "_note_if_not_finite"):
                reads.append((caller.co_name, name))
            return original(self, *args, **kwargs)
        return read

    for name in ("item", "__float__", "__int__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    model = seqzoo.build("tiny-gpt", device="cpu")
    train(model, config(steps=10, log_every=5, accumulate=2, warmup=2), seqzoo.tokenizer(model), quiet=True)
    assert [where for where, _ in reads] == ["_loop"] * len(reads) and 2 <= len(reads) <= 2 * 3, reads


def test_a_non_finite_loss_between_log_steps_stops_before_the_next_save_and_names_its_step(tmp_path):
    """The weights go NaN during step 3 (after the save at step 2; the log steps are 5 and 9): the
    run stops naming step 3, and the save due at step 4 never writes them."""
    model = seqzoo.build("tiny-gpt", device="cpu")
    calls = []

    def poison(module, args):
        calls.extend([1] if module.training else [])  # the FLOP count's forward runs in eval mode
        if len(calls) == 3 and module.training:  # the third step's forward (one micro-batch a step)
            with torch.no_grad():
                module.weight.fill_(float("nan"))

    model.decoder.blocks[0].ffn.up.register_forward_pre_hook(poison)
    ckpt = tmp_path / "run.safetensors"
    with pytest.raises(TrainingError, match=r"^step 3: the loss is nan; stopped, .*run\.safetensors keeps the last "):
        train(model, config(steps=9, log_every=5, save_every=2, eval_examples=4), seqzoo.tokenizer(model),
              output=str(ckpt), quiet=True)
    assert json.loads(seqzoo.io.checkpoint.read_metadata(ckpt)["seqzoo.train"])["step"] == 2
    assert all(torch.isfinite(t).all() for t in seqzoo.load(ckpt).state_dict().values())


def test_a_run_shorter_than_its_warmup_says_it_never_reaches_its_rate():
    model = seqzoo.build("tiny-gpt", device="cpu")
    with pytest.warns(UserWarning, match=r"train\.warmup=100 is longer than the run's 4 steps: the learning rate "
                                         r"rises to 4% of train\.lr=0\.003 and never reaches it"):
        train(model, config(steps=4, warmup=100), seqzoo.tokenizer(model), quiet=True)
