"""The run's optimizer and schedule (``seqzoo.train.optimization``): which tensors are hidden
matrices, from what the model declares; the FSDP2 refusals and a resume with another optimizer;
label smoothing and the z-loss through the trainer; the default run unchanged; transformer-base's
recipe; torchrun with DDP. (Every optimizer and schedule resuming bit for bit: tests/test_training.py.)"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import seqzoo
from seqzoo.cli import main
from seqzoo.config import TrainConfig
from seqzoo.errors import TrainingError
from seqzoo.recipe import resolve
from seqzoo.train.examples import Examples
from seqzoo.train.optimization import optimizer_for, trained_parameters, update_rule
from seqzoo.train.training import train


def names(model, tensors) -> set[str]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return {by_id[id(p)] for p in tensors}


# -- the split -------------------------------------------------------------------------------------------
def test_hidden_matrices_are_the_2d_weights_inside_the_layers():
    model = seqzoo.build("tiny-llama", ["model.tie_embeddings=false"], device="meta")
    sorted_ = trained_parameters(model)
    hidden = names(model, sorted_.hidden)
    assert hidden == {f"decoder.blocks.{i}.{part}.weight" for i in range(2)
                      for part in ("mixer.qkv_proj", "mixer.out_proj", "ffn.gate", "ffn.up", "ffn.down")}
    assert {"embed.weight", "lm_head.weight"} <= names(model, sorted_.decayed) - hidden  # AdamW, decayed
    assert not any("norm" in n for n in hidden)
    assert names(model, sorted_.decayed) | names(model, sorted_.undecayed) == {n for n, _ in model.named_parameters()}


@pytest.mark.parametrize("recipe, spared", [
    ("tiny-mamba", ("mixer.A_log", "mixer.conv1d.weight")),  # a 2-D A_log the mixer keeps from decay; a 3-D kernel
    ("tiny-rwkv7", ("mixer.x_mix", "mixer.r_k")),  # matrices by shape, declared no_weight_decay
    ("tiny-moe", ("ffn.experts.gate_up", "ffn.experts.down")),  # stacked experts: 3-D
])
def test_what_a_part_declares_its_own_and_non_matrices_train_with_adamw(recipe, spared):
    model = seqzoo.build(recipe, device="meta")
    sorted_ = trained_parameters(model)
    hidden, every = names(model, sorted_.hidden), {n for n, _ in model.named_parameters()}
    for suffix in spared:
        found = {n for n in every if n.endswith(suffix)}
        assert found and not found & hidden, (suffix, found & hidden)
    assert hidden and "embed.weight" not in hidden


def test_stacked_weights_are_reported_with_their_blocks_and_a_wrong_sum_is_refused():
    model = seqzoo.build("tiny-llama", device="meta")
    attention = model.decoder.blocks[0].mixer
    h, k, d = attention.heads, attention.kv_heads, attention.head_dim
    found = trained_parameters(model).stacked
    assert found == {id(b.mixer.qkv_proj.weight): (h * d, k * d, k * d) for b in model.decoder.blocks}
    mamba2 = seqzoo.build("tiny-mamba2", device="meta")
    mixer = mamba2.decoder.blocks[0].mixer
    blocks = trained_parameters(mamba2).stacked[id(mixer.in_proj.weight)]
    assert blocks == (mixer.inner, mixer.inner, mixer.groups * mixer.state_size, mixer.groups * mixer.state_size,
                      mixer.heads)
    attention.stacked_rows = {"qkv_proj.weight": (h * d, k * d)}
    with pytest.raises(TrainingError, match=r"AttentionMixer \(decoder.blocks.0.mixer\) declares qkv_proj.weight "
                                            r"as blocks of \[.*\] rows, and it has .*: its stacked_rows must add up"):
        trained_parameters(model)


def test_muon_builds_three_groups_from_a_model():
    model = seqzoo.build("tiny-gpt", device="cpu")
    optimizer = optimizer_for(model, TrainConfig(optimizer="muon", weight_decay=0.1))
    muon, decayed, spared = optimizer.param_groups
    assert names(model, muon["params"]) == names(model, trained_parameters(model).hidden)
    assert "embed.weight" in names(model, decayed["params"]) and decayed["weight_decay"] == 0.1
    assert spared["weight_decay"] == 0.0 and all(p.dim() == 1 for p in spared["params"])


# -- refusals --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["muon", "adafactor"])
def test_optimizers_that_need_whole_matrices_are_refused_under_fsdp2(name):
    config = TrainConfig(optimizer=name, parallel="fsdp")
    with pytest.raises(TrainingError, match=rf"train.optimizer={name} cannot train under FSDP2 \(train.parallel=fsdp\)"
                                            rf": its update needs each matrix whole.*set train.parallel=ddp"):
        update_rule(config, world=2)
    update_rule(config, world=1)  # one process: nothing is sharded
    update_rule(TrainConfig(optimizer=name, parallel="ddp"), world=2)
    update_rule(TrainConfig(optimizer="adamw", parallel="fsdp"), world=2)


def test_resume_with_another_optimizer_is_refused(tmp_path):
    model = seqzoo.build("tiny-gpt", ["model.layers=1"], device="cpu")
    ckpt = str(tmp_path / "run.safetensors")
    config = TrainConfig(task={"kind": "copy", "max_len": 4}, steps=2, batch_size=4, warmup=1, eval_examples=4)
    train(model, config, seqzoo.tokenizer(model), output=ckpt, quiet=True)
    with pytest.raises(TrainingError, match=r"the run trained with train.optimizer=adamw, and its state does not fit "
                                            r"muon; resume with train.optimizer=adamw"):
        train(model, TrainConfig(**{**vars(config), "optimizer": "muon", "steps": 4}), seqzoo.tokenizer(model),
              resume=ckpt, quiet=True)


# -- the objective ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", ["tiny-gpt", "tiny-t5", "rnn-lm"])
def test_training_passes_label_smoothing_and_z_loss_to_the_loss(recipe, monkeypatch):
    """The step's loss is the smoothed objective with the z-loss (fused or on the logits); the
    held-out loss stays plain cross-entropy."""
    from seqzoo.nn.losses import cross_entropy

    overrides = ["model.dim=32", "model.hidden=32"] if recipe == "rnn-lm" else []
    model = seqzoo.build(recipe, overrides, device="cpu").eval()
    examples = Examples(model, seqzoo.tokenizer(model), seqzoo.registry().create("task", "reverse"))
    batch = examples.batch([("abc", "cba"), ("de", "ed")], torch.device("cpu"))
    with torch.no_grad():
        logits = examples.logits(model, batch)
        got = examples.loss(model, batch, label_smoothing=0.1, z_loss=1e-2)
        plain = examples.loss(model, batch)
    torch.testing.assert_close(got, cross_entropy(logits, batch["labels"], label_smoothing=0.1, z_loss=1e-2))
    torch.testing.assert_close(plain, cross_entropy(logits, batch["labels"]))
    assert got > plain

    seen = []
    original = Examples.loss
    monkeypatch.setattr(Examples, "loss",
                        lambda self, m, b, **terms: seen.append(terms) or original(self, m, b, **terms))
    config = TrainConfig(task="reverse", steps=2, batch_size=4, warmup=1, eval_examples=4, label_smoothing=0.1,
                         z_loss=1e-4)
    train(model, config, seqzoo.tokenizer(model), quiet=True)
    assert {"label_smoothing": 0.1, "z_loss": 1e-4} in seen and {} in seen  # the steps; the held-out evaluation


def test_label_smoothing_of_one_is_refused_naming_the_key(capsys):
    assert main(["train", "tiny-gpt", "--set", "train.label_smoothing=1.0", "--quiet"]) == 2
    assert "train.label_smoothing: 1.0 is out of range: must be < 1.0" in capsys.readouterr().err


# -- the default run ---------------------------------------------------------------------------------------
#: `seqzoo train tiny-gpt --set train.steps=20` (log_every 1), recorded with seqzoo before optimizers and
#: schedules were components: AdamW, cosine, no label smoothing, no z-loss.
BEFORE = [5.538014888763428, 5.562841415405273, 5.548154354095459, 5.521699905395508, 5.522635459899902,
          5.521350860595703, 5.4754486083984375, 5.481247425079346, 5.441532611846924, 5.397074222564697,
          5.389671325683594, 5.340096950531006, 5.297001361846924, 5.296684741973877, 5.25715970993042,
          5.2144880294799805, 5.2288031578063965, 5.2072434425354, 5.177048206329346, 5.171145915985107]


def test_the_default_run_gives_the_losses_it_gave_before(tmp_path, monkeypatch):
    """The default run, where ``auto`` finds float32 faster (a CPU without fast bfloat16: the
    probe is made to say so, as each machine's own answer differs)."""
    monkeypatch.setattr("seqzoo.train.precision.FASTER", float("inf"))
    metrics = tmp_path / "m.json"
    assert main(["train", "tiny-gpt", "--set", "train.steps=20", "--set", "train.log_every=1", "--quiet",
                 "--metrics", str(metrics), "-o", str(tmp_path / "m.safetensors")]) == 0
    losses = [entry["loss"] for entry in json.loads(metrics.read_text())["history"]]
    assert losses == pytest.approx(BEFORE, abs=1e-5)
    train_section = seqzoo.load(tmp_path / "m.safetensors").recipe["train"]
    assert train_section["optimizer"] == {"kind": "adamw", "eps": 1e-8}
    assert train_section["schedule"] == {"kind": "cosine"}
    assert train_section["label_smoothing"] == 0.0 and train_section["z_loss"] == 0.0


def test_transformer_base_trains_with_its_papers_schedule_and_label_smoothing():
    train_section = resolve("transformer-base").data["train"]
    assert train_section["schedule"] == {"kind": "inverse_sqrt"} and train_section["warmup"] == 4000
    assert train_section["label_smoothing"] == 0.1
    assert (train_section["beta1"], train_section["beta2"], train_section["optimizer"]["eps"]) == (0.9, 0.98, 1e-9)
    assert train_section["lr"] == pytest.approx(512 ** -0.5 * 4000 ** -0.5, rel=1e-3)  # d^−0.5·w^−0.5, the peak


# -- torchrun ------------------------------------------------------------------------------------------------
RANKS = textwrap.dedent("""
    import sys, torch, seqzoo
    from seqzoo.config import TrainConfig
    from seqzoo.errors import TrainingError
    from seqzoo.train.training import train
    shards, out = sys.argv[1], sys.argv[2]
    for name in ("adamw", "muon", "adafactor", "sgd"):
        torch.manual_seed(0)
        model = seqzoo.build("tiny-gpt", ["model.layers=1"], device="cpu")
        config = TrainConfig(task={"kind": "tokens", "path": shards, "seq_len": 32}, steps=3, batch_size=4,
                             lr=3e-3, warmup=1, eval_examples=4, log_every=1, optimizer=name, precision="float32")
        train(model, config, seqzoo.tokenizer(model), output=f"{out}/{name}.safetensors", quiet=True)
        try:
            train(model, TrainConfig(**{**vars(config), "parallel": "fsdp"}), seqzoo.tokenizer(model), quiet=True)
        except TrainingError as error:
            print(f"refused {name}: {error}", flush=True)
""")


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="needs torchrun")
def test_every_optimizer_trains_under_ddp_as_one_process_of_the_whole_batch(grammar_shards, tmp_path):
    """2 ranks of batch 4 read the rows one process of batch 8 reads: every optimizer lands on its
    weights (up to the float noise of averaging gradients over ranks); under FSDP2 Muon and
    Adafactor are refused on every rank, the others train."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(script),
                          grammar_shards, str(tmp_path)], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    refused = sorted({line.split(":")[0] for line in run.stdout.splitlines() if line.startswith("refused")})
    assert refused == ["refused adafactor", "refused muon"], run.stdout
    for name in ("adamw", "muon", "adafactor", "sgd"):
        torch.manual_seed(0)
        model = seqzoo.build("tiny-gpt", ["model.layers=1"], device="cpu")
        config = TrainConfig(task={"kind": "tokens", "path": grammar_shards, "seq_len": 32}, steps=3, batch_size=8,
                             lr=3e-3, warmup=1, eval_examples=4, log_every=1, optimizer=name, precision="float32")
        start = [p.detach().clone() for p in model.parameters()]
        train(model, config, seqzoo.tokenizer(model), quiet=True)
        ddp = seqzoo.load(tmp_path / f"{name}.safetensors")
        moved = max((p - s).abs().max().item() for p, s in zip(model.parameters(), start))
        gap = max((a - b).abs().max().item() for a, b in zip(model.state_dict().values(), ddp.state_dict().values()))
        assert gap < 0.05 * moved, (name, gap, moved)
