"""Training on token shards: the tokens task, exact resume, gradient accumulation, token budgets,
document masking against per-document forwards, DDP sharding over 2 processes, the metrics files,
and the refusals (another tokenizer, too small a budget)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import seqzoo
from seqzoo.cli import main
from seqzoo.config import TrainConfig
from seqzoo.data.shards import DataError
from seqzoo.errors import TrainingError
from seqzoo.train.training import train


@pytest.fixture
def shards(grammar_shards) -> str:
    return grammar_shards


def config(path: str, **overrides) -> TrainConfig:
    # float32 whatever the CPU (auto may pick bfloat16 autocast): these tests compare runs exactly
    base = {"task": {"kind": "tokens", "path": path, "seq_len": 32}, "steps": 12, "batch_size": 4, "lr": 3e-3,
            "warmup": 2, "eval_examples": 8, "log_every": 1, "precision": "float32"}
    return TrainConfig(**{**base, **overrides})


def fresh(seed: int = 0):
    torch.manual_seed(seed)
    return seqzoo.build("tiny-gpt", device="cpu")


def test_a_model_learns_from_token_shards_and_reports_perplexity(shards):
    model = fresh()
    result = train(model, config(shards, steps=40), seqzoo.tokenizer(model), quiet=True)
    first, last = result.history[0]["loss"], result.history[-1]["loss"]
    assert last < 0.75 * first  # bytes of a 12-word grammar: far below the uniform log(259) ≈ 5.6
    assert result.eval["perplexity"] == pytest.approx(torch.tensor(result.eval["loss"]).exp().item(), rel=1e-6)
    assert result.eval["tokens"] == 8 * 32
    entry = result.history[-1]
    assert entry["tokens"] == 40 * 4 * 32 and entry["seconds"] > 0
    assert 0 < entry["mfu"] < 1 and entry["peak_memory_mb"] > 0 and result.flops_per_token > 0


def test_a_killed_run_resumed_gives_the_same_loss_curve_bit_for_bit(shards, tmp_path):
    whole = fresh()
    uninterrupted = train(whole, config(shards), seqzoo.tokenizer(whole), quiet=True)
    part = fresh()
    ckpt = str(tmp_path / "run.safetensors")
    train(part, config(shards), seqzoo.tokenizer(part), output=ckpt, until=5, quiet=True)
    again = seqzoo.load(ckpt)
    resumed = train(again, config(shards), seqzoo.tokenizer(again), output=ckpt, resume=ckpt, quiet=True)
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in uninterrupted.history]
    assert [h["tokens"] for h in resumed.history] == [h["tokens"] for h in uninterrupted.history]
    for a, b in zip(whole.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)
    lines = [json.loads(line) for line in (tmp_path / "run.metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, 13))  # one line a step, none twice


@pytest.mark.parametrize("save_every", [3, 4])
def test_a_run_resumed_from_a_save_between_log_lines_counts_every_token(shards, tmp_path, save_every):
    """A periodic save (or Ctrl-C) can fall between two log lines (save_every 3, log_every 4). The
    checkpoint keeps the tokens and seconds trained up to its own step, so the resumed run counts
    the tokens the uninterrupted run counts, and its clock goes on from the checkpoint's. A save on
    a log line's step (save_every 4) counts nothing twice."""
    from seqzoo.io.checkpoint import read_extras

    cfg = config(shards, log_every=4, save_every=save_every, keep=2)
    whole = fresh()
    uninterrupted = train(whole, cfg, seqzoo.tokenizer(whole), quiet=True)
    part = fresh()
    train(part, cfg, seqzoo.tokenizer(part), output=str(tmp_path / "run.safetensors"), until=5, quiet=True)
    saved = tmp_path / f"run.step{save_every:07d}.safetensors"  # the periodic save, kept beside the last
    position = json.loads(read_extras(str(saved))[0]["seqzoo.train"])
    assert position["step"] == save_every and position["tokens"] == save_every * 4 * 32 and position["seconds"] > 0
    again = seqzoo.load(saved)
    resumed = train(again, cfg, seqzoo.tokenizer(again), resume=str(saved), quiet=True)
    assert [h["step"] for h in resumed.history] == [4, 8, 12]  # with the checkpoint's own history
    assert [h["tokens"] for h in resumed.history] == [h["tokens"] for h in uninterrupted.history]
    assert next(h for h in resumed.history if h["step"] > save_every)["seconds"] > position["seconds"]


def step_gradients(shards: str, **overrides) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss and the gradients of one training step (an optimizer that does not move)."""
    from seqzoo.train.distributed import Distributed
    from seqzoo.train.objectives import examples_for
    from seqzoo.train.optimization import peak_rates, schedule_for
    from seqzoo.train.precision import resolve
    from seqzoo.train.training import Position, Run, _one_step

    model = fresh()
    cfg = config(shards, **overrides)
    task = seqzoo.registry().create("task", cfg.task)
    examples = examples_for(model, seqzoo.tokenizer(model), task, seed=cfg.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    run = Run(cfg, model, model, model, optimizer, examples, task, Distributed(), torch.device("cpu"), None,
              schedule_for(cfg), peak_rates(optimizer), resolve(cfg.precision, torch.device("cpu")),
              at=Position(consumed=16))
    loss, _, _ = _one_step(run, 0)
    return float(loss), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_gradient_accumulation_equals_the_larger_batch(shards):
    """Two micro-batches of 4 rows read rows 16..23 as one batch of 8 does, and their gradient is
    the mean of the two: the same as the batch of 8 (clipping off, so nothing rescales it)."""
    loss, grads = step_gradients(shards, batch_size=8, grad_clip=None)
    loss_acc, grads_acc = step_gradients(shards, batch_size=4, accumulate=2, grad_clip=None)
    assert loss_acc == pytest.approx(loss, rel=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_acc[name], grad, atol=1e-7, rtol=1e-5, msg=name)
    _, halves = step_gradients(shards, batch_size=4, grad_clip=None)  # the first micro-batch alone differs
    assert any(not torch.allclose(halves[n], g, atol=1e-5) for n, g in grads.items())
    big, accumulated = fresh(), fresh()
    a = train(big, config(shards, batch_size=8, steps=4), seqzoo.tokenizer(big), quiet=True)
    b = train(accumulated, config(shards, batch_size=4, accumulate=2, steps=4), seqzoo.tokenizer(accumulated),
              quiet=True)
    assert [h["loss"] for h in a.history] == pytest.approx([h["loss"] for h in b.history], rel=1e-5)


def test_a_token_budget_sets_the_steps_and_refuses_less_than_one_step(shards):
    model = fresh()
    result = train(model, config(shards, tokens=1000), seqzoo.tokenizer(model), quiet=True)
    assert result.steps == 8  # ⌈1000 / (4 · 32)⌉
    with pytest.raises(TrainingError, match=r"train.tokens=100 is less than one step \(128 tokens: batch_size 4 × "
                                            r"seq_len 32 × accumulate 1 × 1 rank\(s\)\)"):
        train(fresh(), config(shards, tokens=100), seqzoo.tokenizer(model), quiet=True)
    with pytest.raises(TrainingError, match="train.tokens needs a task of fixed-length rows"):
        train(fresh(), TrainConfig(task="copy", tokens=1000), seqzoo.tokenizer(model), quiet=True)


def test_shards_of_another_tokenizer_are_refused_naming_both(shards, tmp_path):
    hf = pytest.importorskip("tokenizers")
    backend = hf.Tokenizer(hf.models.BPE())
    backend.add_special_tokens(["<|endoftext|>"])
    (tmp_path / "tok.json").write_text(backend.to_str())
    model = seqzoo.build("tiny-gpt", ["tokenizer={kind: hf, path: %s, eos_id: 0}" % (tmp_path / "tok.json")],
                         device="cpu")
    with pytest.raises(DataError, match=r"was prepared with the tokenizer bytes \(bytes, 259 ids\) but the model's "
                                        r"is HFTokenizer \(hf:[0-9a-f]+, 1 ids\)"):
        train(model, config(shards), seqzoo.tokenizer(model), quiet=True)


def test_a_vocabulary_smaller_than_the_shards_is_refused(shards):
    task = seqzoo.registry().create("task", {"kind": "tokens", "path": shards})
    with pytest.raises(DataError, match="holds ids up to 258 but the model has vocab_size=200; set "
                                        "model.vocab_size=259"):
        task.bind(seqzoo.registry().create("tokenizer", "bytes"), 200, seed=0)


# -- document masking ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama", "tiny-mla", "tiny-gemma2"])
def test_document_masking_equals_each_document_run_alone(name):
    """A packed row with documents 0, 1, 2 (positions restarting) gives every token the logits it
    gets when its document is the whole input."""
    model = seqzoo.build(name, device="cpu").eval()
    ids = torch.randint(0, 256, (1, 20))
    documents = torch.tensor([[0] * 7 + [1] * 9 + [2] * 4])
    positions = torch.tensor([[*range(7), *range(9), *range(4)]])
    packed = model(ids, documents=documents, positions=positions)
    alone = torch.cat([model(ids[:, :7]), model(ids[:, 7:16]), model(ids[:, 16:])], dim=1)
    torch.testing.assert_close(packed, alone, atol=2e-6, rtol=1e-5)


def test_the_tokens_task_hands_out_documents_and_restarted_positions(shards):
    task = seqzoo.registry().create("task", {"kind": "tokens", "path": shards, "seq_len": 64,
                                             "document_mask": True, "restart_positions": True})
    task.bind(seqzoo.registry().create("tokenizer", "bytes"), 259, seed=0)
    batch = task.batch(0, 8)
    eos = batch["ids"] == 258
    for row in range(8):
        documents, positions = batch["documents"][row].tolist(), batch["positions"][row].tolist()
        for t in range(1, 64):
            after_eos = bool(eos[row, t - 1])
            assert documents[t] == documents[t - 1] + after_eos  # a new document right after each end token
            assert positions[t] == (0 if after_eos else positions[t - 1] + 1)
    model = fresh()
    cfg = config(shards, task={"kind": "tokens", "path": shards, "seq_len": 32, "document_mask": True}, steps=2)
    train(model, cfg, seqzoo.tokenizer(model), quiet=True)  # the model takes the masks


def test_document_masking_refuses_a_recurrent_layer(shards):
    model = seqzoo.build("tiny-mamba", device="cpu")
    cfg = config(shards, task={"kind": "tokens", "path": shards, "seq_len": 32, "document_mask": True}, steps=1)
    with pytest.raises(seqzoo.InputError, match="document masking needs every layer to read an attention mask, but "
                                                "Mamba carries its state"):
        train(model, cfg, seqzoo.tokenizer(model), quiet=True)


# -- torchrun ------------------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="needs torchrun")
def test_two_ddp_processes_read_disjoint_rows_that_make_up_the_single_process_batch(shards, tmp_path):
    """Rank r reads rows c + r·b ... of each step, so 2 ranks of batch 4 train exactly as one
    process of batch 8: the same rows, gradients averaged — only if no row is read twice."""
    recipe = ["--set", f"train={{task: {{kind: tokens, path: {shards}, seq_len: 32}}, steps: 4, lr: 3.0e-3, "
                       f"warmup: 1, eval_examples: 8, log_every: 1, batch_size: 4, precision: float32}}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "seqzoo",
                          "train", "tiny-gpt", "--quiet", "-o", str(tmp_path / "ddp.safetensors"), *recipe],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert main(["train", "tiny-gpt", "--quiet", "-o", str(tmp_path / "one.safetensors"), *recipe,
                 "--set", "train.batch_size=8"]) == 0
    # Rows read twice (both ranks on the same 4) would train as one process of batch 4 does.
    assert main(["train", "tiny-gpt", "--quiet", "-o", str(tmp_path / "half.safetensors"), *recipe]) == 0
    ddp, one, half = (seqzoo.load(tmp_path / f"{n}.safetensors") for n in ("ddp", "one", "half"))
    # Adam's first steps move every weight by about lr (3e-3) whatever the gradient's size, so the
    # float noise of averaging over ranks shows up to ~1e-5; other rows move weights by ~lr.
    gap = max((a - b).abs().max().item() for a, b in zip(ddp.state_dict().values(), one.state_dict().values()))
    other = max((a - b).abs().max().item() for a, b in zip(half.state_dict().values(), one.state_dict().values()))
    assert gap < 1e-4 < 1e-3 < other, (gap, other)


# -- the command line ------------------------------------------------------------------------------------
def test_train_data_resume_without_output_writes_back_and_logs(shards, tmp_path, capsys):
    ckpt = str(tmp_path / "run.safetensors")
    base = ["train", "tiny-gpt", "--data", shards, "--set", "train.task.seq_len=32", "--set", "train.steps=6",
            "--set", "train.batch_size=4", "--set", "train.eval_every=2", "--set", "train.eval_examples=4",
            "--threads", "1"]
    assert main([*base, "-o", ckpt, "--until", "3", "--log-dir", str(tmp_path / "logs")]) == 0
    out = capsys.readouterr()
    assert "step 3/6 (50%) · loss=" in out.err  # stderr is no terminal here: log lines, not a redrawn bar
    assert "step 2: held-out loss" in out.err  # eval_every results are printed as they come
    assert main(["train", "--resume", ckpt, "--log-dir", str(tmp_path / "logs")]) == 0
    out = capsys.readouterr()
    assert f"saved {ckpt} (resumable)" in out.out and "step 4: held-out loss" in out.err
    assert json.loads(seqzoo.io.checkpoint.read_metadata(ckpt)["seqzoo.train"])["step"] == 6  # written back
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    # every log_every (10, so none), every eval_every (2, 4), the stop at --until 3 and the end
    assert [json.loads(line)["step"] for line in lines] == [2, 3, 4, 6]
    pytest.importorskip("tensorboard")
    assert list((tmp_path / "logs").glob("events.out.tfevents.*"))


def test_the_hint_after_training_is_a_command_that_works(shards, tmp_path, capsys):
    ckpt = str(tmp_path / "m.safetensors")
    assert main(["train", "tiny-gpt", "--data", shards, "--set", "train.task.seq_len=32", "--set", "train.steps=2",
                 "--set", "train.eval_examples=4", "-o", ckpt, "--quiet"]) == 0
    hint = capsys.readouterr().out.strip().splitlines()[-1].strip()
    import shlex

    words = shlex.split(hint)
    assert words[:3] == ["seqzoo", "generate", ckpt] and words[3] == "--prompt"
    assert main([*words[1:], "--max-new-tokens", "4"]) == 0
    assert main(["generate", ckpt, "--prompt", "", "--max-new-tokens", "4"]) == 0  # empty: from the start token


def test_weights_only_export_and_describe_say_which_is_which(shards, tmp_path, capsys):
    ckpt, light = str(tmp_path / "run.safetensors"), str(tmp_path / "light.safetensors")
    args = ["train", "tiny-gpt", "--data", shards, "--set", "train.task.seq_len=32", "--set", "train.steps=2",
            "--set", "train.eval_examples=4", "--quiet"]
    assert main([*args, "-o", ckpt]) == 0
    assert main(["describe", ckpt]) == 0
    out = capsys.readouterr().out
    assert "training checkpoint: step 2 of 2 on task tokens, with optimizer and random state" in out
    assert main(["export", ckpt, "-o", light]) == 0
    assert main(["describe", light]) == 0
    assert "weights only: loads, generates and exports" in capsys.readouterr().out
    assert os.path.getsize(ckpt) > 2.5 * os.path.getsize(light)
    assert main([*args, "-o", str(tmp_path / "w.safetensors"), "--weights-only"]) == 0
    assert "(weights only)" in capsys.readouterr().out
    assert "seqzoo.train" not in seqzoo.io.checkpoint.read_metadata(str(tmp_path / "w.safetensors"))
    for a, b in zip(seqzoo.load(ckpt).state_dict().values(), seqzoo.load(light).state_dict().values()):
        assert torch.equal(a, b)


def test_threads_are_set_and_checked(capsys):
    before = torch.get_num_threads()
    try:
        assert main(["train", "tiny-gpt", "--threads", "0", "--quiet"]) == 2
        assert "--threads must be >= 1, got 0" in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)


def test_keep_holds_the_last_saves_beside_the_checkpoint(shards, tmp_path):
    model = fresh()
    ckpt = tmp_path / "run.safetensors"
    train(model, config(shards, steps=8, save_every=2, keep=2), seqzoo.tokenizer(model), output=str(ckpt),
          quiet=True)
    kept = sorted(p.name for p in tmp_path.glob("run.step*.safetensors"))
    assert kept == ["run.step0000006.safetensors", "run.step0000008.safetensors"]
    assert (tmp_path / kept[-1]).read_bytes() == ckpt.read_bytes()  # the last is the checkpoint itself
    step = json.loads(seqzoo.io.checkpoint.read_metadata(str(tmp_path / kept[0]))["seqzoo.train"])["step"]
    assert step == 6


def test_the_line_bar_prints_every_n_units_and_at_the_end():
    import io

    from seqzoo.train.progress import LineBar

    stream = io.StringIO()
    bar = LineBar(10, unit="step", every=4, stream=stream)
    for _ in range(10):
        bar.set_postfix(loss="1.0")
        bar.update(1)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert [line.split(" · ")[0] for line in lines] == ["step 4/10 (40%)", "step 8/10 (80%)", "step 10/10 (100%)"]
    assert all("loss=1.0" in line for line in lines)
