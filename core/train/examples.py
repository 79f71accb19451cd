"""How a model learns from a task of (prompt, answer) text pairs: the examples of a step drawn from
that step's own random stream, turned into the tensors of the model's family, and scored.

Data is a pure function of (seed, step, rank): batch ``i`` comes from a ``random.Random`` seeded
with those, so a resumed run needs no data-loader state and N steps equal k steps then N − k.
Token tasks (``seqzoo.train.token_batches``) read rows by their index in the run instead.
"""
from __future__ import annotations

import random

import torch
from torch import Tensor, nn

from ..config import TrainConfig
from ..errors import TrainingError
from ..interfaces import IGNORE, LanguageModel, Task, Tokenizer
from ..io.checkpoint import unwrap
from ..nn.generation import generate
from ..nn.losses import cross_entropy


def example_rng(seed: int, step: int | str, rank: int = 0) -> random.Random:
    """The data stream of one step (or of the evaluation set): independent of everything else."""
    return random.Random(f"{seed}:{step}:{rank}")


class PairObjective:
    """What the pair objectives (``Examples``, the masked-LM ``MaskedExamples``) share: the task's
    examples of one step come from that step's own random stream."""

    task: Task

    def micro_batches(self, step: int, consumed: int, config: TrainConfig, rank: int, world: int,
                      device: torch.device) -> list[dict[str, Tensor]]:
        """The ``config.accumulate`` micro-batches of ``step`` on this rank (``consumed``, the rows
        the run has read, matters to token tasks only)."""
        batches = []
        for micro in range(config.accumulate):
            # One micro-batch keeps the stream of runs that predate accumulation: (seed, step, rank).
            rng = example_rng(config.seed, step if config.accumulate == 1 else f"{step}.{micro}", rank)
            batches.append(self.batch([self.task.example(rng) for _ in range(config.batch_size)], device, rng))
        return batches

    def batch(self, pairs: list[tuple[str, str]], device: torch.device,
              rng: random.Random | None = None) -> dict[str, Tensor]:
        raise NotImplementedError

    def example_prompt(self, config: TrainConfig) -> str:
        """What to try the trained model on (the hint printed after training)."""
        return self.example_text(self.task.example(example_rng(config.seed, "eval"), "eval"))

    def example_text(self, pair: tuple[str, str]) -> str:
        raise NotImplementedError


class Examples(PairObjective):
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

    def tokens(self, batch: dict[str, Tensor]) -> Tensor:
        """The tokens a batch trains on (for tokens/s): those with a label, counted on the device
        (the trainer reads the count at log steps only)."""
        return (batch["labels"] != IGNORE).sum()

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

    def loss(self, model: nn.Module, batch: dict[str, Tensor], **terms: float) -> Tensor:
        """The answer's next-token loss; ``terms``: ``label_smoothing``, ``z_loss`` (training only)."""
        if self.fused_loss:  # the model fuses its LM head with the loss (seqzoo.nn.losses)
            return self.logits(model, batch, targets=batch["labels"], **terms)
        logits = self.logits(model, batch)
        return cross_entropy(logits, batch["labels"], ignore_index=IGNORE, **terms)

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


def _pad(rows: list[list[int]], value: int) -> tuple[Tensor, Tensor]:
    """Right-pad rows to one length -> (ids (B, T), mask (B, T) 1 = real)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), value, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


