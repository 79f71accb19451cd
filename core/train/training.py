"""Training on a task: batches, AdamW with warm-up and decay, gradient clipping, exact-match
evaluation, a progress bar, checkpoints that resume exactly, and torchrun (DDP or FSDP2).

Data is a pure function of (seed, step, rank): batch ``i`` comes from a ``random.Random`` seeded
with those, so a resumed run needs no data-loader state and N steps equal k steps then N − k.
"""
from __future__ import annotations

import json
import math
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import TrainConfig  # the train: section's schema; still importable from here
from ..errors import SeqzooError
from ..interfaces import LanguageModel, MaskedLanguageModel, Task, Tokenizer, auxiliary_losses, auxiliary_statistics
from ..io.checkpoint import check_can_save, read_extras, save, unwrap
from ..nn.generation import generate
from ..registry import registry
from .lora import add_lora, choose_trainable, merge_lora, merged_state, save_adapter
from .progress import progress

IGNORE = -100  # label of positions that carry no loss


class TrainingError(SeqzooError):
    """Training cannot go on: a non-finite loss, or a model or tokenizer the task cannot use."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped training at a step boundary; ``message`` says where the checkpoint is."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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


def lr_factor(step: int, config: TrainConfig) -> float:
    """The learning rate at ``step`` (0-based) as a fraction of ``config.lr``."""
    if step < config.warmup:
        return (step + 1) / config.warmup
    if config.schedule == "constant":
        return 1.0
    span = max(config.steps - config.warmup, 1)
    progress = min((step - config.warmup) / span, 1.0)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if config.schedule == "cosine" else 1 - progress
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * shape


def example_rng(seed: int, step: int | str, rank: int = 0) -> random.Random:
    """The data stream of one step (or of the evaluation set): independent of everything else."""
    return random.Random(f"{seed}:{step}:{rank}")


class Examples:
    """Turns a task's (prompt, answer) pairs into model tensors, one way per model family.

    ``causal`` (decoder_lm, rnn_lm): ``prompt= answer eos``, loss on the answer and eos only — the
    same text a user then gives ``seqzoo generate --prompt`` (an empty prompt starts with bos).
    ``seq2seq`` (encoder_decoder, rnn_seq2seq): source ``prompt eos``; decoder input ``start
    answer``; labels ``answer eos``. Batches are right-padded; padding carries no loss.
    """

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, task: Task) -> None:
        if not isinstance(model, LanguageModel):
            raise TrainingError(f"{type(model).__name__} cannot be trained on tasks: it does not generate "
                                f"(not a seqzoo.interfaces.LanguageModel)")
        self.family = model.family
        if tokenizer.eos_id is None:
            raise TrainingError("the tokenizer has no eos id; tasks need one to end answers")
        self.tokenizer, self.task = tokenizer, task
        self.eos = tokenizer.eos_id
        self.bos = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
        self.pad = tokenizer.pad_id if tokenizer.pad_id is not None else tokenizer.eos_id
        # Models whose forward takes ``targets=`` return the loss without building the logits.
        self.fused_loss = model.fused_loss

    def prompt_text(self, prompt: str) -> str:
        """What a causal model is prompted with at evaluation (and by the user afterwards)."""
        return prompt + self.task.separator if self.task.exact_match else prompt

    def prompt_ids(self, prompt: str) -> list[int]:
        if self.family == "seq2seq":
            return self.tokenizer.encode(prompt) + [self.eos]
        return self.tokenizer.encode(self.prompt_text(prompt)) or [self.bos]

    def example_text(self, pair: tuple[str, str]) -> str:
        """What to try the trained model on: the prompt of ``pair``, as the model is prompted."""
        return self.prompt_text(pair[0]) if self.family == "causal" else pair[0]

    def tokens(self, batch: dict[str, Tensor]) -> int:
        """The tokens a batch trains on (for tokens/s): those with a label."""
        return int((batch["labels"] != IGNORE).sum())

    def batch(self, pairs: list[tuple[str, str]], device: torch.device,
              rng: random.Random | None = None) -> dict[str, Tensor]:
        """The model's tensors for ``pairs`` (``rng``: the step's stream; unused here)."""
        if self.family == "seq2seq":
            sources = [self.prompt_ids(p) for p, _ in pairs]
            answers = [self.tokenizer.encode(a) for _, a in pairs]
            src, src_mask = _pad(sources, self.pad)
            tgt, _ = _pad([[0] + a for a in answers], self.pad)  # 0: replaced by the start id
            labels, _ = _pad([a + [self.eos] for a in answers], IGNORE)
            return {"src": src.to(device), "src_mask": src_mask.to(device),
                    "tgt": tgt.to(device), "labels": labels.to(device)}
        rows, labels = [], []
        for prompt, answer in pairs:
            head, tail = self.prompt_ids(prompt), self.tokenizer.encode(answer) + [self.eos]
            ids = head + tail
            rows.append(ids[:-1])
            labels.append([IGNORE] * (len(head) - 1) + tail)
        ids, _ = _pad(rows, self.pad)
        labels, _ = _pad(labels, IGNORE)
        return {"ids": ids.to(device), "labels": labels.to(device)}

    def logits(self, model: nn.Module, batch: dict[str, Tensor], **kwargs) -> Tensor:
        if self.family == "seq2seq":
            tgt = batch["tgt"].clone()
            tgt[:, 0] = unwrap(model).decoder_start_id
            return model(batch["src"], tgt, src_mask=batch["src_mask"], **kwargs)
        return model(batch["ids"], **kwargs)

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        if self.fused_loss:  # the model fuses its LM head with the loss (seqzoo.nn.losses)
            return self.logits(model, batch, targets=batch["labels"])
        logits = self.logits(model, batch)
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=IGNORE)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, config: TrainConfig, device: torch.device) -> dict:
        """Held-out loss and, for exact-match tasks, the accuracy of greedy answers."""
        rng = example_rng(config.seed, "eval")
        pairs = [self.task.example(rng, "eval") for _ in range(config.eval_examples)]
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        for start in range(0, len(pairs), config.batch_size):
            chunk = pairs[start:start + config.batch_size]
            batch = self.batch(chunk, device)
            total += self.loss(model, batch).item() * len(chunk)
            count += len(chunk)
        result = {"loss": total / count, "examples": count}
        if self.task.exact_match:
            predictions = self.answers(unwrap(model), [p for p, _ in pairs], [a for _, a in pairs], device)
            hits = sum(pred == answer for pred, (_, answer) in zip(predictions, pairs))
            result["accuracy"] = hits / len(pairs)
            result["samples"] = [{"prompt": self.prompt_text(p) if self.family == "causal" else p,
                                  "answer": a, "prediction": pred}
                                 for (p, a), pred in list(zip(pairs, predictions))[:5]]
        model.train(was_training)
        return result

    def answers(self, model: nn.Module, prompts: list[str], answers: list[str],
                device: torch.device) -> list[str]:
        """Greedy answers (decoded, up to eos) to ``prompts``; ``answers`` bound the length."""
        budget = max(len(self.tokenizer.encode(a)) for a in answers) + 1
        out: list[str | None] = [None] * len(prompts)
        encoded = [self.prompt_ids(p) for p in prompts]
        if self.family == "seq2seq":
            groups = [list(range(i, min(i + 64, len(prompts)))) for i in range(0, len(prompts), 64)]
        else:  # prompts of one length batch without padding, which every causal model takes
            by_length: dict[int, list[int]] = {}
            for i, ids in enumerate(encoded):
                by_length.setdefault(len(ids), []).append(i)
            groups = list(by_length.values())
        for group in groups:
            ids, mask = _pad([encoded[i] for i in group], self.pad)
            ids, mask = ids.to(device), mask.to(device)
            generated = generate(model, ids, budget, eos_id=self.eos,
                                 attention_mask=mask if self.family == "seq2seq" else None)
            skip = 1 if self.family == "seq2seq" else ids.shape[1]
            for row, index in enumerate(group):
                new = generated[row, skip:].tolist()
                if self.eos in new:
                    new = new[: new.index(self.eos)]
                out[index] = self.tokenizer.decode(new)
        return out  # type: ignore[return-value]


def examples_for(model: nn.Module, tokenizer: Tokenizer, task: Task):
    """How ``model`` learns from the task: the masked-LM objective (``seqzoo.train.mlm``) for a
    bidirectional ``MaskedLanguageModel``, ``Examples`` (next tokens of the answer) otherwise."""
    if isinstance(model, MaskedLanguageModel) and not isinstance(model, LanguageModel):
        from .mlm import MaskedExamples  # it builds on this module

        return MaskedExamples(model, tokenizer, task)
    return Examples(model, tokenizer, task)


def _pad(rows: list[list[int]], value: int) -> tuple[Tensor, Tensor]:
    """Right-pad rows to one length -> (ids (B, T), mask (B, T) 1 = real)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), value, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


# -- distributed -----------------------------------------------------------------------------------
@dataclass
class Distributed:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> "Distributed":
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls()
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(local)
        return cls(dist.get_rank(), world, local)

    def average(self, value: float, device: torch.device) -> float:
        if self.world == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], device=device, dtype=torch.float64)
        dist.all_reduce(t)
        return t.item() / self.world


def _wrap(model: nn.Module, config: TrainConfig, dist_info: Distributed, device: torch.device) -> nn.Module:
    if dist_info.world == 1:
        return model
    if config.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for module in model.shard_units():  # shard layer by layer, then the rest
            fully_shard(module)
        return fully_shard(model)
    return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


# -- state -----------------------------------------------------------------------------------------
def _optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    matrices = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": matrices, "weight_decay": config.weight_decay},
              {"params": vectors, "weight_decay": 0.0}]
    # The fused kernel (CPU and CUDA) is one pass over each parameter instead of foreach's several.
    fused = all(p.dtype.is_floating_point and p.device.type in ("cpu", "cuda") for p in model.parameters())
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2),
                             fused=fused or None, foreach=None if fused else True)


def train_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict]:
    """Optimizer tensors (by parameter name) and JSON-able optimizer settings, on the CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    _, optim = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    tensors = {}
    if not optim:  # a rank other than 0: the full state was gathered to rank 0 only
        return tensors, {}
    for name, state in optim["state"].items():
        for key, value in state.items():
            tensors[f"optim.{name}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    groups = [{k: v for k, v in group.items() if k != "params"} | {"params": list(group["params"])}
              for group in optim["param_groups"]]
    return tensors, {"param_groups": groups}


def load_train_state(model: nn.Module, optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor],
                     settings: dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    state: dict[str, dict[str, Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            name, field = key[len("optim."):].rsplit(".", 1)
            state.setdefault(name, {})[field] = value
    groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else dict(g) for g in settings["param_groups"]]
    set_state_dict(model, optimizer, model_state_dict={}, optim_state_dict={"state": state, "param_groups": groups},
                   options=StateDictOptions(full_state_dict=True, strict=False))


def _model_state(model: nn.Module) -> dict[str, Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


# -- the loop --------------------------------------------------------------------------------------
@dataclass
class RunResult:
    history: list[dict]
    eval: dict
    example_prompt: str
    steps: int
    seconds: float


def train(model: nn.Module, config: TrainConfig, tokenizer: Tokenizer, *, output: str | None = None,
          resume: str | None = None, until: int | None = None, quiet: bool = False,
          compile: bool = False, on_log: Callable[[int], None] | None = None) -> RunResult:
    """Train ``model`` in place on ``config.task``; write ``output`` (rank 0) at the end, every
    ``save_every`` steps, and when interrupted (Ctrl-C). ``resume`` continues a run from its
    checkpoint; ``until`` stops after that step (a checkpoint to resume from later). ``on_log``
    is called with the step number at every history entry (an experiment's own measurement; the
    model is back in training mode afterwards)."""
    dist_info = Distributed.from_env()
    if output and dist_info.main:  # before the first step: a run must have somewhere to end up
        check_can_save(output)
    device = next(model.parameters()).device
    task = registry().create("task", config.task)
    examples = examples_for(model, tokenizer, task)
    if config.lora is not None:
        if resume is not None:
            raise TrainingError("--resume of a LoRA run is not supported: its checkpoint holds the merged "
                                "weights; start a new run with --init CKPT")
        add_lora(model, config.lora)
    choose_trainable(model, config)
    base = model
    model = _wrap(model, config, dist_info, device)
    optimizer = _optimizer(model, config)
    start, history = 0, []
    if resume is not None:
        start, history = _resume(resume, model, optimizer)
    else:
        torch.manual_seed(config.seed + dist_info.rank)
    runner = torch.compile(model) if compile else model
    autocast = _autocast(config, device)
    last = min(config.steps, until) if until is not None else config.steps
    bar = _progress(start, last, quiet or not dist_info.main)
    began, tokens_seen, window_start = time.perf_counter(), 0, time.perf_counter()
    model.train()
    with _StopRequests() as stop:
        try:
            for step in range(start, last):
                loss, batch, signals = _one_step(step, config, task, examples, runner, model, optimizer,
                                                 autocast, device, dist_info, output)
                done = step + 1
                tokens_seen += examples.tokens(batch)
                if done % config.log_every == 0 or done == last:
                    elapsed = time.perf_counter() - window_start
                    entry = {"step": done, "loss": dist_info.average(loss, device),
                             "lr": optimizer.param_groups[0]["lr"],
                             "tokens_per_s": tokens_seen * dist_info.world / max(elapsed, 1e-9)}
                    if signals:  # a mixture of experts: its auxiliary losses and expert load
                        entry["aux"] = {k: dist_info.average(v, device) for k, v in signals.items()}
                        entry.update(auxiliary_statistics(model))
                    history.append(entry)
                    tokens_seen, window_start = 0, time.perf_counter()
                    bar.set_postfix(loss=f"{entry['loss']:.4f}", tok_s=f"{entry['tokens_per_s']:.0f}",
                                    **{k: f"{v:.3f}" for k, v in entry.get("aux", {}).items()})
                    if on_log is not None:
                        on_log(done)
                        model.train()
                        window_start = time.perf_counter()
                bar.update(1)
                if config.eval_every and done % config.eval_every == 0 and done != last and history:
                    interim = examples.evaluate(model, config, device)
                    history[-1]["eval"] = {k: v for k, v in interim.items() if k != "samples"}
                    window_start = time.perf_counter()  # tokens/s measures training, not evaluation
                if output and config.save_every and done % config.save_every == 0 and done != last:
                    _save(output, model, base, optimizer, done, config, history, dist_info)
                if stop.requested:
                    where = f"; {output} holds step {done}, continue with --resume {output}" if output else ""
                    if output:
                        _save(output, model, base, optimizer, done, config, history, dist_info)
                    raise TrainingInterrupted(f"interrupted after step {done}{where}")
        finally:
            bar.close()
    finished = last
    result_eval = examples.evaluate(model, config, device)
    if output:
        _save_or_rescue(output, model, base, optimizer, finished, config, history, dist_info)
    if config.lora is not None:
        if config.lora.adapter and dist_info.main:
            save_adapter(base, config.lora.adapter, config.lora)
        merge_lora(base)  # the trained model, plain again
    example = examples.example_text(task.example(example_rng(config.seed, "eval"), "eval"))
    return RunResult(history, result_eval, example, finished, time.perf_counter() - began)


def _one_step(step: int, config: TrainConfig, task: Task, examples: Examples, runner: nn.Module,
              model: nn.Module, optimizer: torch.optim.Optimizer, autocast, device: torch.device,
              dist_info: Distributed, output: str | None) -> tuple[float, dict[str, Tensor], dict[str, float]]:
    """One optimizer step on the batch of ``step`` -> (its loss, the batch, the auxiliary losses'
    values). The objective is the loss plus Σ coefficient·auxiliary loss (a mixture of experts'
    balancing and z-losses); the loss reported is the task's alone, comparable across models."""
    rng = example_rng(config.seed, step, dist_info.rank)
    batch = examples.batch([task.example(rng) for _ in range(config.batch_size)], device, rng)
    for group in optimizer.param_groups:
        group["lr"] = config.lr * lr_factor(step, config)
    with autocast:
        loss = examples.loss(runner, batch)
        extra, signals = auxiliary_losses(model)
    objective = loss if extra is None else loss + extra
    if not torch.isfinite(objective):
        raise TrainingError(
            f"step {step + 1}: the loss is {objective.item()}; stopped"
            + (f", {output} keeps the last good checkpoint" if output else "")
            + " (lower train.lr or set train.grad_clip)")
    optimizer.zero_grad(set_to_none=True)
    objective.backward()
    if config.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    return loss.item(), batch, signals


def _save_or_rescue(output: str, model: nn.Module, base: nn.Module, optimizer: torch.optim.Optimizer,
                    step: int, config: TrainConfig, history: list[dict], dist_info: Distributed) -> None:
    """``_save`` at the end of a run; when that fails (disk full, folder removed, ...) the finished
    run is written to a rescue file in the temp folder instead, and the error says where."""
    try:
        _save(output, model, base, optimizer, step, config, history, dist_info)
    except (SeqzooError, OSError, ImportError) as error:
        rescue = Path(tempfile.gettempdir()) / f"seqzoo-rescue-{os.getpid()}-{Path(output).name}"
        try:
            _save(str(rescue), model, base, optimizer, step, config, history, dist_info)
        except (SeqzooError, OSError, ImportError):
            raise error from None
        raise TrainingError(f"could not save {output} ({error}); the finished run (step {step}) is saved "
                            f"at {rescue} instead: copy it where you want it, or continue with "
                            f"--resume {rescue}") from None


def _save(output: str, model: nn.Module, base: nn.Module, optimizer: torch.optim.Optimizer, step: int,
          config: TrainConfig, history: list[dict], dist_info: Distributed) -> None:
    """The model (as ``seqzoo.save`` writes it) plus optimizer state, step, RNG state and history,
    so ``--resume`` continues exactly. Every rank takes part in gathering sharded state; only rank
    0 writes."""
    weights = _model_state(model)
    if config.lora is not None:  # the checkpoint holds the merged weights under their own names
        weights = merged_state(base, weights)
    tensors, settings = train_state(model, optimizer)
    if not dist_info.main:
        return
    tensors["rng.cpu"] = torch.get_rng_state()
    if torch.cuda.is_available():
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    meta = {"step": step, "config": asdict(config), "history": history, **settings}
    save(base, output, state=weights, extra_tensors=tensors,
         extra_metadata={"seqzoo.train": json.dumps(meta, default=str)})


def check_resumable(path: str, metadata: dict[str, str]) -> None:
    """A checkpoint written by ``train`` (optimizer state and step included), or a TrainingError."""
    if "seqzoo.train" not in metadata:
        raise TrainingError(f"{path}: not a training checkpoint (no optimizer state), so there is no run "
                            f"to resume; to train from its weights use --init {path} (or train.init)")


def _resume(path: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, list[dict]]:
    metadata, tensors = read_extras(path)
    check_resumable(path, metadata)
    meta = json.loads(metadata["seqzoo.train"])
    load_train_state(model, optimizer, tensors, meta)
    torch.set_rng_state(tensors["rng.cpu"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    return int(meta["step"]), list(meta.get("history", []))


def _autocast(config: TrainConfig, device: torch.device):
    use_bf16 = config.precision == "bfloat16" or (config.precision == "auto" and device.type == "cuda")
    if use_bf16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


def _progress(start: int, total: int, quiet: bool):
    return progress(total, unit="step", initial=start, show=not quiet)
