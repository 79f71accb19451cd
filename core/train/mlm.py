"""The masked-LM objective (BERT, Devlin et al., 2019) for bidirectional models with an MLM head.

Each text is encoded as a whole (the tokenizer adds its [CLS] ... [SEP] as it does for
``fill-mask``). Of its real, non-special tokens each is chosen with probability 15%; a chosen token
becomes the mask token with probability 80%, a random token with 10%, and stays itself with 10%
(BERT's 80/10/10 rule, as transformers' ``DataCollatorForLanguageModeling``). The loss is the
cross-entropy of the original tokens at the chosen positions only. The masks are drawn from the
step's data stream, so a resumed run masks exactly as the uninterrupted one.
"""
from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import TrainConfig
from ..errors import InputError, TrainingError
from ..interfaces import IGNORE, MaskedLanguageModel, Task, Tokenizer
from ..io.checkpoint import unwrap
from ..nn.fill_mask import MASK_TEXT, encode_masked, mask_token
from ..nn.losses import cross_entropy
from .examples import PairObjective, example_rng

#: BERT's share of tokens that carry the loss, and how the chosen ones are shown to the model.
MASK_PROB, AS_MASK, AS_RANDOM = 0.15, 0.8, 0.1


def mask_tokens(ids: Tensor, special: Tensor, mask_id: int, vocab_size: int, generator: torch.Generator,
                prob: float = MASK_PROB) -> tuple[Tensor, Tensor]:
    """BERT's masking of ids (B, T) -> (inputs (B, T), labels (B, T)).

    ``special`` (B, T) bool marks positions never chosen (special tokens, padding). Each other
    position is chosen with probability ``prob``; chosen ones become ``mask_id`` (80%), a uniform
    random id below ``vocab_size`` (10%) or stay (10%). labels hold the original id at chosen
    positions and IGNORE elsewhere. A batch where no position was chosen gets one, so its loss
    is defined."""
    draw = torch.rand(ids.shape, generator=generator)
    chosen = (draw < prob) & ~special
    if not bool(chosen.any()) and not bool(special.all()):
        candidates = (~special).flatten().nonzero()[:, 0]
        pick = candidates[torch.randint(len(candidates), (1,), generator=generator)]
        chosen.view(-1)[pick] = True
    how = torch.rand(ids.shape, generator=generator)
    inputs = ids.clone()
    inputs[chosen & (how < AS_MASK)] = mask_id
    randomise = chosen & (how >= AS_MASK) & (how < AS_MASK + AS_RANDOM)
    inputs[randomise] = torch.randint(vocab_size, ids.shape, generator=generator)[randomise]
    return inputs, torch.where(chosen, ids, torch.full_like(ids, IGNORE))


class MaskedExamples(PairObjective):
    """Turns a task's (prompt, answer) pairs into masked-LM batches for a ``MaskedLanguageModel``:
    the text is the answer (``text`` task) or ``prompt separator answer``. Batches are
    right-padded; ``batch`` needs the step's ``random.Random`` to draw the masks."""

    family = "masked"

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, task: Task) -> None:
        if not (isinstance(model, MaskedLanguageModel) and model.has_mlm_head):
            raise TrainingError(f"{type(model).__name__} cannot be trained on tasks: it does not generate and has no "
                        f"masked-LM head; give it one (model.mlm_head: {{}}) for the masked-LM objective")
        self.tokenizer, self.task = tokenizer, task
        try:
            self.mask = mask_token(tokenizer, model.recipe["model"]["vocab_size"])
        except InputError as problem:
            raise TrainingError(f"masked-LM training: {problem}") from None
        self.special = sorted(tokenizer.special_ids() | {self.mask.id})
        self.pad = tokenizer.pad_id if tokenizer.pad_id is not None else self.special[0]
        self.vocab = tokenizer.vocab_size  # random replacements are ids the tokenizer produces
        self.limit = model.max_positions  # longer texts are cut (a window of multi-byte characters)

    def text(self, pair: tuple[str, str]) -> str:
        prompt, answer = pair
        return prompt + self.task.separator + answer if prompt else answer

    def example_text(self, pair: tuple[str, str]) -> str:
        """A text to try the trained model on: the first words of ``pair``'s, the last one masked."""
        words = self.text(pair).split()[:8] or [""]
        return " ".join([*words[:-1], self.mask.text if self.mask.own else MASK_TEXT])

    def batch(self, pairs: list[tuple[str, str]], device: torch.device,
              rng: random.Random | None = None) -> dict[str, Tensor]:
        rows = [encode_masked(self.tokenizer, self.text(p), self.mask)[:self.limit] for p in pairs]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad, dtype=torch.long)
        real = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            real[i, : len(row)] = True
        generator = torch.Generator().manual_seed((rng or random.Random(0)).getrandbits(63))
        special = ~real | torch.isin(ids, torch.tensor(self.special, dtype=torch.long))
        inputs, labels = mask_tokens(ids, special, self.mask.id, self.vocab, generator)
        return {"ids": inputs.to(device), "mask": real.long().to(device), "labels": labels.to(device)}

    def tokens(self, batch: dict[str, Tensor]) -> Tensor:
        """The tokens a batch trains on (for tokens/s): every real token is read, counted on the device."""
        return batch["mask"].sum()

    def loss(self, model: nn.Module, batch: dict[str, Tensor], **terms: float) -> Tensor:
        """The masked-LM loss at the chosen positions; ``terms``: ``label_smoothing``, ``z_loss``."""
        chosen = batch["labels"] != IGNORE
        logits = model(batch["ids"], attention_mask=batch["mask"], head=True, select=chosen)  # (N, V)
        return cross_entropy(logits, batch["labels"][chosen], **terms)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, config: TrainConfig, device: torch.device) -> dict:
        """Held-out masked-LM loss and the share of masked tokens predicted exactly, on the same
        examples and masks at every evaluation."""
        rng = example_rng(config.seed, "eval")
        pairs = [self.task.example(rng, "eval") for _ in range(config.eval_examples)]
        was_training = model.training
        model.eval()
        total, hits, count = 0.0, 0, 0
        for start in range(0, len(pairs), config.batch_size):
            batch = self.batch(pairs[start:start + config.batch_size], device, rng)
            chosen = batch["labels"] != IGNORE
            logits = unwrap(model)(batch["ids"], attention_mask=batch["mask"], head=True, select=chosen)
            labels = batch["labels"][chosen]
            total += F.cross_entropy(logits.float(), labels, reduction="sum").item()
            hits += int((logits.argmax(-1) == labels).sum())
            count += len(labels)
        model.train(was_training)
        return {"loss": total / count, "examples": len(pairs), "masked_accuracy": hits / count}
