"""Training on a task: batches (``seqzoo.train.examples`` for text pairs,
``seqzoo.train.token_batches`` for token tasks), gradient accumulation, the recipe's optimizer and
schedule (``seqzoo.train.optimization``), gradient clipping, held-out evaluation, a progress bar,
metrics files (JSON lines, TensorBoard), checkpoints that resume exactly, and torchrun (DDP or
FSDP2).

A run's data is a pure function of its position: text-pair tasks draw step ``i``'s examples from
a stream seeded with (seed, step, rank); token tasks read rows by their index in the run, and the
checkpoint keeps how many were read. So N steps equal k steps, a save, and N − k more.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch import Tensor, nn

from ..config import TrainConfig
from ..errors import SeqzooError, TrainingError, TrainingInterrupted
from ..interfaces import Schedule, Task, Tokenizer, TokenTask, auxiliary_losses, auxiliary_statistics
from ..io.checkpoint import check_can_save, read_extras, save
from ..registry import registry
from .distributed import Distributed, gradient_sync, load_train_state, model_state, train_state, wrap
from .lora import add_lora, choose_trainable, merge_lora, merged_state, save_adapter
from .metrics import MetricsLog, flops_per_token, peak_flops, peak_memory_mb
from .objectives import examples_for
from .optimization import (
    check_same_optimizer,
    loss_terms,
    lr_factor,
    optimizer_for,
    peak_rates,
    schedule_for,
    set_learning_rate,
    update_rule,
)
from .precision import Precision, autocast_for, model_width
from .precision import resolve as resolve_precision
from .progress import progress
from .token_batches import TokenExamples

__all__ = ["Position", "Run", "RunResult", "check_resumable", "held_out_summary", "lr_factor", "planned_steps", "train"]


class _StopRequests:
    """While training, the first Ctrl-C (SIGINT) asks the loop to stop at the end of the current
    step — so the checkpoint it writes is never half an optimizer update; a second one stops at
    once."""

    def __init__(self) -> None:
        self.requested = False
        self.previous = None

    def __enter__(self) -> "_StopRequests":
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


# -- the loop --------------------------------------------------------------------------------------
@dataclass
class RunResult:
    history: list[dict]
    eval: dict
    example_prompt: str
    steps: int
    seconds: float
    flops_per_token: float | None = None
    #: The precision the run computed in (``Precision.record``: name, why, the CPU probe's rates).
    precision: dict | None = None


@dataclass
class Position:
    """Where a run stands: optimizer steps done, stream rows read (``consumed``, what a token task
    needs to continue), tokens trained on and seconds spent training (evaluation and saving excluded)."""

    step: int = 0
    consumed: int = 0
    tokens: int = 0
    seconds: float = 0.0


def planned_steps(config: TrainConfig, examples, world: int = 1) -> int:
    """``config.steps``, or with a token budget (``train.tokens``) the steps that read it:
    ⌈tokens / (batch_size · seq_len · accumulate · ranks)⌉. Refused for tasks whose rows have no
    fixed length, and for a budget under one step."""
    if config.tokens is None:
        return config.steps
    if not isinstance(examples, TokenExamples):
        raise TrainingError(f"train.tokens needs a task of fixed-length rows (tokens, mqar); task "
                            f"{type(examples.task).__name__} has examples of varying length: set train.steps")
    per_step = examples.rows_per_step(config, world) * examples.task.seq_len
    if config.tokens < per_step:
        raise TrainingError(f"train.tokens={config.tokens:,} is less than one step ({per_step:,} tokens: batch_size "
                            f"{config.batch_size} × seq_len {examples.task.seq_len} × accumulate {config.accumulate}"
                            f" × {world} rank(s)); raise it or make the batch smaller")
    return math.ceil(config.tokens / per_step)


@dataclass
class Run:
    """Everything one training run carries from step to step, in one place (nanoGPT keeps these
    as the globals of train.py): the model as trained (``model``, wrapped for DDP/FSDP), the model
    itself (``base``), what the forward runs through (``runner``: compiled or not), the optimizer
    with each param group's peak rate and the schedule that scales them, the data, the checkpoint
    path and where the run stands."""

    config: TrainConfig
    model: nn.Module
    base: nn.Module
    runner: nn.Module
    optimizer: torch.optim.Optimizer
    examples: object
    task: Task
    dist: Distributed
    device: torch.device
    output: str | None
    schedule: Schedule
    peaks: list[float]
    precision: Precision
    at: Position = field(default_factory=Position)
    history: list[dict] = field(default_factory=list)
    #: The first optimizer step whose objective was not finite, and that objective, kept on the
    #: device so that no step waits for it; read at the run's sync points (``check_finite``).
    bad_step: Tensor | None = None
    bad_value: Tensor | None = None

    def check_finite(self) -> None:
        """Stop with the step and value of the first non-finite objective, if there was one. A sync
        point: called where the loop reads the device anyway (log steps, saves, the end), so a
        non-finite loss never reaches a checkpoint."""
        if self.bad_step is None or int(self.bad_step) < 0:
            return
        where = f", {self.output} keeps the last good checkpoint" if self.output else ""
        raise TrainingError(f"step {int(self.bad_step) + 1}: the loss is {self.bad_value.item()}; stopped{where} "
                            f"(lower train.lr or set train.grad_clip)")


def train(model: nn.Module, config: TrainConfig, tokenizer: Tokenizer, *, output: str | None = None,
          resume: str | None = None, until: int | None = None, quiet: bool = False,
          compile: bool = False, on_log: Callable[[int], None] | None = None,
          log_dir: str | None = None, weights_only: bool = False) -> RunResult:
    """Train ``model`` in place on ``config.task``; write ``output`` (rank 0) at the end, every
    ``save_every`` steps, and when interrupted (Ctrl-C). ``resume`` continues a run from its
    checkpoint; ``until`` stops after that step (a checkpoint to resume from later). ``on_log``
    is called with the step number at every history entry (an experiment's own measurement; the
    model is back in training mode afterwards). Metrics go to ``log_dir``/metrics.jsonl (and
    TensorBoard event files there when tensorboard is installed), else beside ``output``.
    ``weights_only``: the final save holds the weights alone (a third of the size; not resumable —
    saves along the way and on Ctrl-C stay resumable)."""
    dist_info = Distributed.from_env()
    if output and dist_info.main:  # before the first step: a run must have somewhere to end up
        check_can_save(output)
    device = next(model.parameters()).device
    task = registry().create("task", config.task)
    examples = examples_for(model, tokenizer, task, seed=config.seed)
    config = replace(config, steps=planned_steps(config, examples, dist_info.world))
    warn_short_warmup(config)
    if config.lora is not None:
        if resume is not None:
            raise TrainingError("--resume of a LoRA run is not supported: its checkpoint holds the merged "
                                "weights; start a new run with --init CKPT")
        add_lora(model, config.lora)
    choose_trainable(model, config)
    rule = update_rule(config, dist_info.world)  # refused under FSDP2 before anything is sharded
    precision = resolve_precision(config.precision, device, model_width(model))
    if dist_info.from_first(precision.autocast, device) != precision.autocast:  # the ranks' probes disagreed
        precision = Precision("float32" if precision.autocast else "bfloat16", "auto: rank 0's probe", precision.rates)
    if not quiet and dist_info.main:
        print(f"seqzoo: computing in {precision.describe()}", file=sys.stderr)
    cost = _step_cost(model, examples, config, device, precision)  # before wrapping: a sharded forward is collective
    wrapped = wrap(model, config, dist_info, device)
    optimizer = optimizer_for(model, config, rule)  # FSDP2 shards the model in place; DDP shares its tensors
    run = Run(config, wrapped, model, torch.compile(wrapped) if compile else wrapped, optimizer, examples, task,
              dist_info, device, output, schedule_for(config), peak_rates(optimizer), precision)
    if resume is not None:
        run.at, run.history = _resume(resume, run.model, run.optimizer, task, config)
    else:
        torch.manual_seed(config.seed + dist_info.rank)
    last = min(config.steps, until) if until is not None else config.steps
    report = _Report(config, run.at, cost, quiet or not dist_info.main, dist_info, device,
                     _metrics_log(output, log_dir, run.at.step if resume else None, dist_info))
    began = time.perf_counter()
    run.model.train()
    with _StopRequests() as stop:
        try:
            _loop(run, last, report, stop, on_log)
        finally:
            report.close()
    run.check_finite()
    result_eval = examples.evaluate(run.model, config, device)
    if run.history and last == config.steps:  # the run's end (not an --until pause): its curve ends here
        run.history[-1]["eval"] = {k: v for k, v in result_eval.items() if k != "samples"}
        report.log(run.history[-1])
    if output:
        _save_or_rescue(run, weights_only)
    report.metrics.close()
    if config.lora is not None:
        if config.lora.adapter and dist_info.main:
            save_adapter(model, config.lora.adapter, config.lora)
        merge_lora(model)  # the trained model, plain again
    return RunResult(run.history, result_eval, examples.example_prompt(config), last, time.perf_counter() - began,
                     cost["flops_per_token"], precision.record())


def _loop(run: Run, last: int, report: _Report, stop: _StopRequests, on_log: Callable[[int], None] | None) -> None:
    """The optimizer steps from ``run.at.step`` up to ``last``: each step's loss and token count
    stay on the device, and the loop reads them (a sync) only when it logs."""
    config, at = run.config, run.at
    window_start, window_tokens = time.perf_counter(), 0
    for step in range(at.step, last):
        loss, batches, signals = _one_step(run, step)
        at.step, at.consumed = step + 1, at.consumed + len(batches) * config.batch_size * run.dist.world
        window_tokens = window_tokens + sum(run.examples.tokens(b) for b in batches) * run.dist.world
        evaluate = bool(config.eval_every) and at.step % config.eval_every == 0 and at.step != last
        if at.step % config.log_every == 0 or at.step == last or evaluate:
            run.check_finite()  # sync point: the step's loss and token count are read below
            elapsed = time.perf_counter() - window_start
            window_tokens = int(window_tokens)
            at.seconds, at.tokens = at.seconds + elapsed, at.tokens + window_tokens
            entry = report.entry(float(loss), run.optimizer, window_tokens / max(elapsed, 1e-9),
                                 {name: float(value) for name, value in signals.items()}, run.model)
            run.history.append(entry)
            if evaluate:
                entry["eval"] = _held_out(run.examples, run.model, config, run.device)
                report.held_out(entry)
            if at.step != config.steps:  # the run's last entry is written with its final evaluation
                report.log(entry)
            if on_log is not None:
                on_log(at.step)
                run.model.train()
            window_start, window_tokens = time.perf_counter(), 0
        report.bar.update(1)
        periodic = bool(config.save_every) and at.step % config.save_every == 0 and at.step != last
        if run.output and (periodic or stop.requested):
            run.check_finite()  # a sync, as at a log line: the save counts the steps since that line
            at.seconds, at.tokens = at.seconds + time.perf_counter() - window_start, at.tokens + int(window_tokens)
            _save(run)
            window_start, window_tokens = time.perf_counter(), 0  # saving, like evaluation, is not training
        if stop.requested:
            raise TrainingInterrupted(f"interrupted after step {at.step}" + (
                f"; {run.output} holds step {at.step}, continue with --resume {run.output}" if run.output else ""))


def warn_short_warmup(config: TrainConfig) -> None:
    """A run shorter than its warm-up never reaches the learning rate it was given: say so."""
    if config.warmup > config.steps:
        peak = lr_factor(config.steps - 1, config)
        warnings.warn(f"train.warmup={config.warmup} is longer than the run's {config.steps} steps: the learning "
                      f"rate rises to {peak:.0%} of train.lr={config.lr:g} and never reaches it, nor decays; lower "
                      f"train.warmup or train longer", stacklevel=3)


def _held_out(examples, model: nn.Module, config: TrainConfig, device: torch.device) -> dict:
    return {k: v for k, v in examples.evaluate(model, config, device).items() if k != "samples"}


def _step_cost(model: nn.Module, examples, config: TrainConfig, device: torch.device, precision: Precision) -> dict:
    """FLOPs per trained token (counted on one row of the first batch, in eval mode and with the
    random state put back, so training is exactly what it would be without it) and the peak
    FLOP/s MFU is measured against."""
    rng = torch.get_rng_state()
    was_training = model.training
    model.eval()
    try:
        batch = examples.micro_batches(0, 0, replace(config, accumulate=1), 0, 1, device)[0]
        flops = flops_per_token(lambda row: examples.loss(model, row), examples.tokens, batch)
    finally:
        model.train(was_training)
        torch.set_rng_state(rng)
    dtype = next(model.parameters()).dtype
    peak = config.peak_flops or peak_flops(device, torch.bfloat16 if precision.autocast else dtype)
    return {"flops_per_token": flops, "peak_flops": peak}


def _metrics_log(output: str | None, log_dir: str | None, resume_step: int | None,
                 dist_info: Distributed) -> MetricsLog:
    """The run's metrics files: ``log_dir``/metrics.jsonl (and TensorBoard there), else the JSON lines
    beside the checkpoint (``run.safetensors`` -> ``run.metrics.jsonl``); rank 0 only."""
    if not dist_info.main:
        return MetricsLog(None, None, None, print)
    if log_dir is not None:
        jsonl = Path(log_dir) / "metrics.jsonl"
    elif output is not None:
        jsonl = Path(output).with_suffix(".metrics.jsonl")
    else:
        jsonl = None
    return MetricsLog(jsonl, Path(log_dir) if log_dir else None, resume_step,
                      lambda message: print(f"seqzoo: {message}", file=sys.stderr))


class _Report:
    """The history entries of a run and how they are shown: the progress bar (or its log lines), the
    held-out results printed as they come, and the metrics files."""

    def __init__(self, config: TrainConfig, at: Position, cost: dict, quiet: bool,
                 dist_info: Distributed, device: torch.device, metrics: MetricsLog) -> None:
        self.config, self.at, self.cost, self.dist_info, self.device = config, at, cost, dist_info, device
        self.metrics = metrics
        self.quiet = quiet
        # Out of config.steps, also when --until stops earlier: the bar says how far the run is.
        self.bar = progress(config.steps, unit="step", initial=at.step, show=not quiet, every=config.log_every)

    def entry(self, loss: float, optimizer, tokens_per_s: float, signals: dict, model: nn.Module) -> dict:
        at, dist_info, device = self.at, self.dist_info, self.device
        entry = {"step": at.step, "loss": dist_info.average(loss, device), "lr": optimizer.param_groups[0]["lr"],
                 "tokens": at.tokens, "seconds": round(at.seconds, 3), "tokens_per_s": tokens_per_s,
                 "mfu": tokens_per_s * self.cost["flops_per_token"] / (self.cost["peak_flops"] * dist_info.world),
                 "peak_memory_mb": round(peak_memory_mb(device), 1)}
        if signals:  # a mixture of experts: its auxiliary losses and expert load
            entry["aux"] = {k: dist_info.average(v, device) for k, v in signals.items()}
            entry.update(auxiliary_statistics(model))
        self.bar.set_postfix(loss=f"{entry['loss']:.4f}", tok_s=f"{tokens_per_s:.0f}", mfu=f"{entry['mfu']:.1%}",
                             mem=f"{entry['peak_memory_mb']:.0f}MB",
                             **{k: f"{v:.3f}" for k, v in entry.get("aux", {}).items()})
        return entry

    def held_out(self, entry: dict) -> None:
        if not self.quiet:
            self.bar.write(f"step {entry['step']}: {held_out_summary(entry['eval'])}")

    def log(self, entry: dict) -> None:
        self.metrics.log(entry)

    def close(self) -> None:
        self.bar.close()


def held_out_summary(result: dict) -> str:
    """``held-out loss 1.2345 (perplexity 3.44), accuracy 0.812`` from an evaluation's result."""
    text = f"held-out loss {result['loss']:.4f}"
    if "perplexity" in result:
        text += f" (perplexity {result['perplexity']:.2f})"
    if "accuracy" in result:  # exact match of greedy answers (pair tasks), of argmax tokens (token tasks)
        text += f", {'accuracy' if 'perplexity' in result else 'exact match'} {result['accuracy']:.3f}"
    if "exact" in result:  # rows right at every labelled token (token tasks with exact_match)
        text += f", exact rows {result['exact']:.3f}"
    if "masked_accuracy" in result:
        text += f", masked accuracy {result['masked_accuracy']:.3f}"
    return text


def _one_step(run: Run, step: int) -> tuple[Tensor, list[dict[str, Tensor]], dict[str, Tensor]]:
    """One optimizer step over the ``config.accumulate`` micro-batches of ``step`` -> (their mean
    loss, the micro-batches, the auxiliary losses' values), all still on the device (nanoGPT's
    micro-step loop: nothing here waits for the device). The objective is the loss plus
    Σ coefficient·auxiliary loss (a mixture of experts' balancing and z-losses); the loss reported
    is the task's alone, comparable across models (with ``train.label_smoothing`` or ``z_loss``
    it is the smoothed cross-entropy plus λ·log²Z: the model computes them in its loss). The
    forward runs under autocast, the backward outside it. Gradients are synchronised across ranks
    on the last micro-batch only."""
    config, model = run.config, run.model
    batches = run.examples.micro_batches(step, run.at.consumed, config, run.dist.rank, run.dist.world, run.device)
    set_learning_rate(run.optimizer, run.peaks, lr_factor(step, config, run.schedule))
    run.optimizer.zero_grad(set_to_none=True)
    total, objective_total, signals = None, None, {}
    terms = loss_terms(config)
    for micro, batch in enumerate(batches):
        with gradient_sync(model, micro == len(batches) - 1):
            with autocast_for(run.precision, run.device):
                loss = run.examples.loss(run.runner, batch, **terms)
                extra, signals = auxiliary_losses(model)
                objective = loss if extra is None else loss + extra
            # One micro-batch backpropagates the objective itself (bit for bit what it always did).
            (objective if len(batches) == 1 else objective / len(batches)).backward()
        total = loss.detach() if total is None else total + loss.detach()
        objective_total = objective.detach() if objective_total is None else objective_total + objective.detach()
    _note_if_not_finite(run, step, objective_total)
    if config.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    run.optimizer.step()
    return total / len(batches), batches, signals


def _note_if_not_finite(run: Run, step: int, objective: Tensor) -> None:
    """Keep, on the device, the first step whose objective is not finite and its value."""
    objective = objective.float()
    if run.bad_step is None:
        run.bad_step = torch.full((), -1, dtype=torch.long, device=objective.device)
        run.bad_value = torch.zeros((), device=objective.device)
    first = ~torch.isfinite(objective) & (run.bad_step < 0)
    run.bad_step = torch.where(first, torch.full_like(run.bad_step, step), run.bad_step)
    run.bad_value = torch.where(first, objective, run.bad_value)


def _save_or_rescue(run: Run, weights_only: bool = False) -> None:
    """``_save`` at the end of a run; when that fails (disk full, folder removed, ...) the finished
    run is written to a rescue file in the temp folder instead, and the error says where."""
    try:
        _save(run, weights_only=weights_only)
    except (SeqzooError, OSError, ImportError) as error:
        rescue = Path(tempfile.gettempdir()) / f"seqzoo-rescue-{os.getpid()}-{Path(run.output).name}"
        try:
            _save(run, keep=False, output=str(rescue))
        except (SeqzooError, OSError, ImportError):
            raise error from None
        raise TrainingError(f"could not save {run.output} ({error}); the finished run (step {run.at.step}) is saved "
                            f"at {rescue} instead: copy it where you want it, or continue with "
                            f"--resume {rescue}") from None


def _save(run: Run, *, keep: bool = True, weights_only: bool = False, output: str | None = None) -> None:
    """The model (as ``seqzoo.save`` writes it) plus optimizer state, the run's position (step and
    stream rows read), RNG state and history, so ``--resume`` continues exactly, to ``output``
    (default: the run's). Every rank takes part in gathering sharded state; only rank 0 writes.
    With ``train.keep`` > 1 the last few saves also stay as ``NAME.stepN.safetensors`` beside it.
    ``weights_only``: the weights and recipe alone, as ``seqzoo.save`` writes them. A sync point:
    a non-finite loss stops the run before its weights are written."""
    run.check_finite()
    config, output = run.config, output or run.output
    weights = model_state(run.model)
    if config.lora is not None:  # the checkpoint holds the merged weights under their own names
        weights = merged_state(run.base, weights)
    if weights_only:
        if run.dist.main:
            save(run.base, output, state=weights)
        return
    tensors, settings = train_state(run.model, run.optimizer)
    if not run.dist.main:
        return
    tensors["rng.cpu"] = torch.get_rng_state()
    if torch.cuda.is_available():
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    data = {"consumed": run.at.consumed, "identity": run.task.identity() if isinstance(run.task, TokenTask) else ""}
    meta = {"step": run.at.step, "tokens": run.at.tokens, "seconds": run.at.seconds, "config": asdict(config),
            "history": run.history, "data": data, **settings}
    save(run.base, output, state=weights, extra_tensors=tensors,
         extra_metadata={"seqzoo.train": json.dumps(meta, default=str)})
    if keep and config.keep > 1:
        keep_last(Path(output), run.at.step, config.keep)


def keep_last(output: Path, step: int, count: int) -> None:
    """Keep ``output`` (just written) as ``NAME.stepN.SUFFIX`` too — a hard link, no copy: each save
    writes a new file and renames it over the old — and delete all but the newest ``count``."""
    pattern = re.compile(re.escape(output.stem) + r"\.step(\d+)" + re.escape(output.suffix) + "$")
    kept = output.with_name(f"{output.stem}.step{step:07d}{output.suffix}")
    kept.unlink(missing_ok=True)
    try:
        os.link(output, kept)
    except OSError:  # a filesystem without hard links
        shutil.copy2(output, kept)
    saved = sorted((int(m.group(1)), f) for f in output.parent.iterdir() if (m := pattern.match(f.name)))
    for _, old in saved[:-count]:
        old.unlink(missing_ok=True)


def check_resumable(path: str, metadata: dict[str, str]) -> None:
    """A checkpoint written by ``train`` (optimizer state and step included), or a TrainingError."""
    if "seqzoo.train" not in metadata:
        raise TrainingError(f"{path}: not a training checkpoint (no optimizer state), so there is no run "
                            f"to resume; to train from its weights use --init {path} (or train.init)")


def _resume(path: str, model: nn.Module, optimizer: torch.optim.Optimizer, task: Task,
            config: TrainConfig) -> tuple[Position, list[dict]]:
    metadata, tensors = read_extras(path)
    check_resumable(path, metadata)
    meta = json.loads(metadata["seqzoo.train"])
    check_same_optimizer(path, meta.get("config", {}), config)
    data = meta.get("data", {})
    if isinstance(task, TokenTask) and data.get("identity") and data["identity"] != task.identity():
        raise TrainingError(f"--resume {path}: the run trained on other data (fingerprint "
                            f"{data['identity'][:16]}) than the task reads now ({task.identity()[:16]}); "
                            f"resume on the data it started on, or start a new run with --init {path}")
    load_train_state(model, optimizer, tensors, meta)
    torch.set_rng_state(tensors["rng.cpu"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    history, step, config = list(meta.get("history", [])), int(meta["step"]), meta.get("config", {})
    last = history[-1] if history else {}
    # Checkpoints written before the position was kept read their rows at the old batch size, and
    # those written before the counts were kept take the last logged line's.
    consumed = int(data.get("consumed", step * config.get("batch_size", 0) * config.get("accumulate", 1)))
    tokens, seconds = meta.get("tokens", last.get("tokens", 0)), meta.get("seconds", last.get("seconds", 0.0))
    return Position(step, consumed, int(tokens), float(seconds)), history
