"""How a causal LM learns from a token task (``seqzoo.interfaces.TokenTask``): rows read by their
index in the run's stream, the next-token loss, and held-out loss and perplexity per group.

Row ``i`` of the stream is the ``i``-th row the run trains on. At a step that starts with
``consumed`` rows behind it, micro-batch ``m`` of rank ``r`` (of ``W``) reads rows
``consumed + (m·W + r)·b`` onward, ``b`` of them, so ranks never share a row and the step reads
``b·A·W`` rows in all; the checkpoint keeps ``consumed``, which is all a resumed run needs.
"""
from __future__ import annotations

import inspect
import json
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import TrainConfig
from ..errors import TrainingError
from ..interfaces import IGNORE, LanguageModel, Tokenizer, TokenTask
from ..nn.losses import cross_entropy
from ..registry import registry

#: The model inputs a token batch may carry besides ids and labels.
EXTRA_INPUTS = ("documents", "positions")


class TokenExamples:
    """The objective of token tasks: ``micro_batches`` for a step, ``loss``, ``evaluate``."""

    family = "causal"

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, task: TokenTask, seed: int = 0) -> None:
        if not isinstance(model, LanguageModel) or model.family != "causal":
            raise TrainingError(f"{type(model).__name__} cannot be trained on token task "
                                f"{type(task).__name__}: it needs a causal language model (decoder_lm, rnn_lm)")
        self.task, self.tokenizer = task, tokenizer
        self.fused_loss = model.fused_loss
        task.bind(tokenizer, model.recipe["model"]["vocab_size"], seed)
        limit = model.max_positions
        if limit is not None and task.seq_len > limit:
            raise TrainingError(f"{type(task).__name__}: seq_len={task.seq_len} is longer than the model's "
                                f"{limit} positions (model.max_seq_len); use a shorter seq_len or a longer table")
        first = task.batch(0, 1)
        if "documents" in first and not model.supports_documents:
            raise TrainingError(f"{type(model).__name__} cannot take document masks; train it without "
                                f"document_mask")

    def rows_per_step(self, config: TrainConfig, world: int) -> int:
        return config.batch_size * config.accumulate * world

    def micro_batches(self, step: int, consumed: int, config: TrainConfig, rank: int, world: int,
                      device: torch.device) -> list[dict[str, Tensor]]:
        b = config.batch_size
        return [_to(self.task.batch(consumed + (micro * world + rank) * b, b), device)
                for micro in range(config.accumulate)]

    def tokens(self, batch: dict[str, Tensor]) -> Tensor:
        """The tokens a batch trains on (for tokens/s): those with a label, counted on the device."""
        return (batch["labels"] != IGNORE).sum()

    def loss(self, model: nn.Module, batch: dict[str, Tensor], **terms: float) -> Tensor:
        """The next-token loss; ``terms``: ``label_smoothing``, ``z_loss`` (training only)."""
        extra = {k: batch[k] for k in EXTRA_INPUTS if k in batch}
        if self.fused_loss:  # the LM head fused with the loss: no (B, T, V) logits
            return model(batch["ids"], targets=batch["labels"], **extra, **terms)
        logits = model(batch["ids"], **extra)
        return cross_entropy(logits, batch["labels"], ignore_index=IGNORE, **terms)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, config: TrainConfig, device: torch.device) -> dict:
        """Held-out loss (mean over labelled tokens) and perplexity, overall and per group; with the
        task's ``token_accuracy``, the share of labelled tokens predicted by argmax too, and with its
        ``exact_match`` the share of rows predicted right at every labelled token. The same
        rows every time, on every rank (so sharded models step together)."""
        was_training = model.training
        model.eval()
        groups: dict[str, dict[str, float]] = {}
        for name, batch in self.task.held_out(config.eval_examples, config.batch_size):
            batch = _to(batch, device)
            labels = batch["labels"]
            count = int((labels != IGNORE).sum())
            group = groups.setdefault(name, {"loss_sum": 0.0, "tokens": 0, "hits": 0, "rows": 0, "exact": 0})
            if self.task.token_accuracy or self.task.exact_match or not self.fused_loss:
                extra = {k: batch[k] for k in EXTRA_INPUTS if k in batch}
                logits = model(batch["ids"], **extra).float()  # (B, T, V)
                group["loss_sum"] += F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE,
                                                     reduction="sum").item()
                chosen = labels != IGNORE
                right = logits.argmax(-1) == labels  # (B, T)
                group["hits"] += int(right[chosen].sum())
                group["exact"] += int((right | ~chosen).all(-1).sum())
                group["rows"] += labels.shape[0]
            else:
                group["loss_sum"] += self.loss(model, batch).item() * count
            group["tokens"] += count
        model.train(was_training)
        if not groups:
            raise TrainingError(f"{type(self.task).__name__} has no held-out data to evaluate on")
        total = sum(g["loss_sum"] for g in groups.values())
        count = sum(g["tokens"] for g in groups.values())
        result = {"loss": total / count, "perplexity": _perplexity(total / count), "tokens": count}
        scored = {name: {"loss": g["loss_sum"] / g["tokens"], "perplexity": _perplexity(g["loss_sum"] / g["tokens"])}
                  for name, g in groups.items()}
        if self.task.token_accuracy:
            for name, g in groups.items():
                scored[name]["accuracy"] = g["hits"] / g["tokens"]
            result["accuracy"] = sum(s["accuracy"] for s in scored.values()) / len(scored)
        if self.task.exact_match:
            for name, g in groups.items():
                scored[name]["exact"] = g["exact"] / g["rows"]
            result["exact"] = sum(s["exact"] for s in scored.values()) / len(scored)
        if len(groups) > 1:
            result["groups"] = scored
        return result

    def example_prompt(self, config: TrainConfig) -> str:
        """The start of the first held-out row, up to its first line break: a prompt to try."""
        _, batch = next(iter(self.task.held_out(1, 1)))
        text = self.tokenizer.decode(batch["ids"][0, :32].tolist())
        return text.split("\n")[0].strip() or text.strip().split("\n")[0]


def _to(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _perplexity(loss: float) -> float:
    return math.exp(min(loss, 700.0))  # exp(709) overflows a float


def data_override(train_section: dict | None, folder: str) -> str:
    """The ``--set`` that ``--data DIR`` stands for (``seqzoo train``, ``seqzoo compare``): the task
    ``tokens`` reading DIR; a recipe whose task is ``tokens`` already keeps its other settings
    (seq_len, document_mask, ...)."""
    task = (train_section or {}).get("task")
    if isinstance(task, dict) and task.get("kind") == "tokens":
        return f"train.task.path={json.dumps(folder)}"
    return f"train.task={json.dumps({'kind': 'tokens', 'path': folder})}"


def fit_window(recipe: dict, overrides: list[str]) -> list[str]:
    """With ``--data``, the tokens task's window defaults to what the model allows: on a resolved
    ``recipe`` whose task window was left at its default but is longer than ``model.max_seq_len``,
    the ``--set`` that shortens it (none when ``overrides`` set the window themselves)."""
    task, longest = (recipe.get("train") or {}).get("task"), recipe["model"].get("max_seq_len")
    if not isinstance(task, dict) or task.get("kind") != "tokens" or longest is None or task["seq_len"] <= longest:
        return []
    default = inspect.signature(registry().get("task", "tokens").cls).parameters["seq_len"].default
    if task["seq_len"] != default or any(o.startswith(("train.task.seq_len", "train.task=")) for o in overrides):
        return []  # the window is the recipe's or the user's choice: a window too long is their error to see
    return [f"train.task.seq_len={longest}"]
