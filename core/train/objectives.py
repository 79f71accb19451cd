"""Which objective a model learns a task by (``examples_for``): token rows, the masked-LM objective,
or next tokens of text answers. Its own module, so the objectives import one way only."""
from __future__ import annotations

from torch import nn

from ..interfaces import LanguageModel, MaskedLanguageModel, Task, Tokenizer, TokenTask
from .examples import Examples
from .mlm import MaskedExamples
from .token_batches import TokenExamples


def examples_for(model: nn.Module, tokenizer: Tokenizer, task: Task, seed: int = 0):
    """How ``model`` learns from the task: token batches (``TokenExamples``) for a ``TokenTask``,
    the masked-LM objective (``seqzoo.train.mlm``) for a bidirectional ``MaskedLanguageModel``,
    ``Examples`` (next tokens of the answer) otherwise. ``seed`` fixes a token task's stream."""
    if isinstance(task, TokenTask):
        return TokenExamples(model, tokenizer, task, seed)
    if isinstance(model, MaskedLanguageModel) and not isinstance(model, LanguageModel):
        return MaskedExamples(model, tokenizer, task)
    return Examples(model, tokenizer, task)
