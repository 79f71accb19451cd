"""Synthetic task `translate`: English-like sentences into an invented language.

The grammar is small and deterministic, so a model can learn it exactly: a sentence is one or more
clauses ``[the|a] NOUN VERB [the|a] NOUN`` joined by ``and``. The invented language reorders each
clause subject–object–verb, swaps every word through a fixed lexicon, marks the object with the
suffix ``-n`` and drops the indefinite article (``a`` has no word): ``the cat sees a dog`` ->
``la kato hundon vidas``.
"""
from __future__ import annotations

import random

from seqzoo.errors import ConfigError
from seqzoo.interfaces import Task
from seqzoo.registry import builtin
from seqzoo.schema import PositiveInt

NOUNS = {"cat": "kato", "dog": "hundo", "bird": "birdo", "fish": "fiso", "child": "infano",
         "teacher": "instruisto", "apple": "pomo", "book": "libro"}
VERBS = {"sees": "vidas", "likes": "satas", "finds": "trovas", "eats": "mangas", "reads": "legas",
         "follows": "sekvas"}
ARTICLES = {"the": "la", "a": None}
CONJUNCTION = ("and", "kaj")


@builtin("toy translation: an invented SOV language with a fixed lexicon")
class TranslateTask(Task):
    """min_len/max_len: clauses per training sentence (1, 2). eval_min_len/eval_max_len: clauses
    per held-out sentence (null = training ones)."""

    def __init__(self, min_len: PositiveInt = 1, max_len: PositiveInt = 2,
                 eval_min_len: PositiveInt | None = None, eval_max_len: PositiveInt | None = None) -> None:
        self.clauses = {"train": (min_len, max_len),
                        "eval": (eval_min_len or min_len, eval_max_len or max_len)}
        for split, (low, high) in self.clauses.items():
            if low > high:
                prefix = "" if split == "train" else "eval_"
                raise ConfigError(f"task translate: {prefix}min_len={low} is larger than {prefix}max_len={high}")

    @staticmethod
    def _noun_phrase(rng: random.Random, accusative: bool) -> tuple[list[str], list[str]]:
        article, noun = rng.choice(list(ARTICLES)), rng.choice(list(NOUNS))
        target = [] if ARTICLES[article] is None else [ARTICLES[article]]
        return [article, noun], target + [NOUNS[noun] + ("n" if accusative else "")]

    def example(self, rng: random.Random, split: str = "train") -> tuple[str, str]:
        source, target = [], []
        for index in range(rng.randint(*self.clauses[split])):
            if index:
                source.append(CONJUNCTION[0])
                target.append(CONJUNCTION[1])
            subject_src, subject_tgt = self._noun_phrase(rng, accusative=False)
            verb = rng.choice(list(VERBS))
            object_src, object_tgt = self._noun_phrase(rng, accusative=True)
            source += subject_src + [verb] + object_src
            target += subject_tgt + object_tgt + [VERBS[verb]]
        return " ".join(source), " ".join(target)
