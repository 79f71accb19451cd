"""lm-evaluation-harness on any zoo model: ``SeqzooLM``, an ``lm_eval`` model, and ``evaluate``,
which runs ``lm_eval.simple_evaluate`` with it (``seqzoo eval CKPT --tasks NAME``; ``pip install
'seqzoo[eval]'``).

The adapter is a ``TemplateLM``, as lm-eval's own ``hf`` model is, so a request is split into
context and continuation tokens by the same rules (trailing spaces move to the continuation; an
empty context is the start token). What differs is what scores them: seqzoo's model, whatever its
architecture (RNN LMs, ALiBi GPTs, third-party plugins, state-space models), and seqzoo's
``generate`` with its KV cache for ``generate_until``.

- ``loglikelihood``: the requests sorted longest first, right-padded into batches, one forward
  each; the log-probabilities of the continuation's tokens summed (float32 log-softmax), and
  whether each is the argmax.
- ``loglikelihood_rolling``: the text in disjoint windows of the model's context, each scored as a
  continuation (lm-eval's own window rules).
- ``generate_until``: batches of prompts with the same settings through ``seqzoo.generate``
  (greedy unless the task samples), cut at the first stop string.
"""
from __future__ import annotations

import difflib
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from ..interfaces import LanguageModel, Tokenizer
from ..io.checkpoint import load
from ..nn.generation import generate
from ..registry import tokenizer as tokenizer_of

INSTALL = "pip install 'seqzoo[eval]' (lm-eval)"
#: The context used when a model states none (no position table, no recipe max_seq_len).
DEFAULT_LENGTH = 2048


def _lm_eval():
    try:
        import lm_eval
        from lm_eval.api.model import TemplateLM
    except ImportError:
        raise InputError(f"seqzoo eval needs lm-evaluation-harness: {INSTALL}") from None
    return lm_eval, TemplateLM


_ADAPTER: type | None = None


def adapter_class() -> type:
    """``SeqzooLM``, defined on first use so that importing seqzoo never imports lm_eval."""
    global _ADAPTER
    if _ADAPTER is not None:
        return _ADAPTER
    lm_eval, TemplateLM = _lm_eval()
    from lm_eval import utils

    class SeqzooLM(TemplateLM):
        """A seqzoo causal LM (``model``, with its ``tokenizer``) as an lm-eval model."""

        def __init__(self, model: nn.Module, tokenizer: Tokenizer, *, batch_size: int = 8,
                     max_length: int | None = None) -> None:
            super().__init__()
            if not isinstance(model, LanguageModel) or model.family != "causal":
                raise InputError(f"seqzoo eval scores causal language models; {type(model).__name__} is not one")
            if tokenizer.eos_id is None and tokenizer.bos_id is None:
                raise InputError("seqzoo eval needs a tokenizer with an end (or start) token to begin an empty "
                                 "context with; this one has neither")
            self.model, self.tok = model.eval(), tokenizer
            self.batch_size = batch_size
            self.max_length = max_length or model.max_positions or \
                model.recipe["model"].get("max_seq_len") or DEFAULT_LENGTH
            self.where = next(model.parameters()).device

        @property
        def eot_token_id(self) -> int:
            return self.tok.eos_id if self.tok.eos_id is not None else self.tok.bos_id

        @property
        def prefix_token_id(self) -> int:
            return self.tok.bos_id if self.tok.bos_id is not None else self.eot_token_id

        def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
            return self.tok.encode(string)

        def tok_decode(self, tokens: list[int]) -> str:
            return self.tok.decode(tokens)

        @torch.no_grad()
        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
            """requests: ((context, continuation), context ids, continuation ids) -> (log p, greedy)."""
            order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1]) - len(requests[i][2]))
            results: list[tuple[float, bool] | None] = [None] * len(requests)
            size = override_bs or self.batch_size
            for first in range(0, len(order), size):
                chosen = order[first:first + size]
                rows = [(requests[i][1] + requests[i][2])[-(self.max_length + 1):][:-1] for i in chosen]
                widths = [len(requests[i][2]) for i in chosen]
                longest = max(len(r) for r in rows)
                ids = torch.zeros(len(rows), longest, dtype=torch.long)
                for row, tokens in enumerate(rows):  # right padding: a causal model never reads it
                    ids[row, :len(tokens)] = torch.tensor(tokens)
                logprobs = F.log_softmax(self.model(ids.to(self.where)).float(), dim=-1)  # (B, T, V)
                for row, (index, width) in enumerate(zip(chosen, widths)):
                    end = len(rows[row])
                    scores = logprobs[row, end - width:end]           # (width, V)
                    target = torch.tensor(requests[index][2][-width:], device=scores.device)
                    picked = scores.gather(-1, target[:, None])[:, 0]
                    answer = (float(picked.sum()), bool((scores.argmax(-1) == target).all()))
                    results[index] = answer
                    if requests[index][0] is not None:
                        self.cache_hook.add_partial("loglikelihood", requests[index][0], answer)
            return results

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
            totals = []
            for (text,) in [request.args for request in requests]:
                windows = [(None, *utils.make_disjoint_window(w)) for w in utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)]
                total = sum(score for score, _ in self._loglikelihood_tokens(windows))
                self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
                totals.append(total)
            return totals

        @torch.no_grad()
        def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
            answers: list[str | None] = [None] * len(requests)
            groups: dict[str, list[int]] = {}
            for index, request in enumerate(requests):
                groups.setdefault(repr(sorted(request.args[1].items())), []).append(index)
            for indices in groups.values():
                settings = dict(requests[indices[0]].args[1])
                until = settings.pop("until", None) or []
                until = [until] if isinstance(until, str) else list(until)
                new_tokens = int(settings.pop("max_gen_toks", 256))
                sample = settings.pop("do_sample", False)
                temperature = float(settings.pop("temperature", 0.0)) if sample else 0.0
                keep = max(1, self.max_length - new_tokens)
                for first in range(0, len(indices), self.batch_size):
                    chosen = indices[first:first + self.batch_size]
                    prompts = [torch.tensor((self.tok_encode(requests[i].args[0]) or [self.prefix_token_id])[-keep:])
                               for i in chosen]
                    outputs = generate(self.model, [p.to(self.where) for p in prompts], new_tokens,
                                       temperature=temperature, eos_id=self.eot_token_id)
                    for i, prompt, output in zip(chosen, prompts, outputs):
                        text = self.tok_decode(output[len(prompt):].tolist())
                        for stop in until:
                            text = text.split(stop)[0] if stop else text
                        answers[i] = text
                        self.cache_hook.add_partial("generate_until", requests[i].args, text)
            return answers

    _ADAPTER = SeqzooLM
    return SeqzooLM


def known_tasks(include_path: str | None = None) -> tuple[object, list[str]]:
    lm_eval, _ = _lm_eval()
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path) if include_path else TaskManager()
    return manager, list(manager.all_tasks)


def evaluate(checkpoint: str | os.PathLike, tasks: list[str], *, include_path: str | None = None,
             batch_size: int = 8, limit: int | None = None, num_fewshot: int | None = None,
             device: str | None = None, log: Callable[[str], None] = print) -> dict:
    """Run lm-eval's ``simple_evaluate`` on a seqzoo checkpoint -> its results dict. Task names
    that lm-eval does not know (with ``include_path``'s local task YAMLs) are refused, with the
    closest names."""
    lm_eval, _ = _lm_eval()
    manager, names = known_tasks(include_path)
    unknown = [t for t in tasks if t not in names]
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=3)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else \
            "; `lm-eval ls tasks` lists them, and --include-path adds a folder of task YAMLs"
        raise InputError(f"unknown lm-eval task {unknown[0]!r}{hint}")
    model = load(checkpoint, device=device)
    adapter = adapter_class()(model, tokenizer_of(model), batch_size=batch_size)
    log(f"evaluating {checkpoint} on {', '.join(tasks)} (lm-eval {lm_eval.__version__}, context {adapter.max_length})")
    return lm_eval.simple_evaluate(model=adapter, tasks=tasks, task_manager=manager, limit=limit,
                                   num_fewshot=num_fewshot, batch_size=batch_size, log_samples=True)


def table(results: dict) -> str:
    """lm-eval's results as a markdown table: task, metric, value, standard error."""
    lines = ["| task | metric | value | ± |", "|---|---|---|---|"]
    for task, metrics in results["results"].items():
        for key, value in metrics.items():
            if "," not in key or "_stderr" in key or not isinstance(value, (int, float)):
                continue  # metrics are "name,filter"; alias, sample_len and the errors are not
            metric, _, how = key.partition(",")
            error = metrics.get(f"{metric}_stderr,{how}")
            lines.append(f"| {task} | {metric} | {value:.4f} | {error:.4f} |" if isinstance(error, float)
                         else f"| {task} | {metric} | {value:.4f} | – |")
    return "\n".join(lines)


# -- a local multiple-choice task every machine can build: Python's own built-in functions ------------
BUILTINS_TASK = "py_builtins"


def builtin_questions(choices: int = 4, seed: int = 0) -> list[dict]:
    """One question per documented built-in function of the running Python: its docstring's first
    sentence, and which built-in it describes among ``choices`` names (the others drawn from the
    rest with a fixed seed) -> [{"question", "choices", "answer"}]."""
    import builtins
    import inspect
    import random

    found = {}
    for name in sorted(dir(builtins)):
        value = getattr(builtins, name)
        doc = inspect.getdoc(value) or ""
        if name.startswith("_") or not callable(value) or isinstance(value, type) or not doc:
            continue
        lines = [line for line in doc.splitlines() if line.strip() and "(" not in line.split(" ")[0]]
        if lines:
            found[name] = lines[0].strip().rstrip(".")
    rng = random.Random(seed)
    names = list(found)
    questions = []
    for name in names:
        options = [name, *rng.sample([n for n in names if n != name], choices - 1)]
        rng.shuffle(options)
        questions.append({"question": f"Python's built-in function that does this: {found[name]}.\nIts name:",
                          "choices": [f" {option}" for option in options], "answer": options.index(name)})
    return questions


def write_builtins_task(folder: str | os.PathLike, seed: int = 0) -> str:
    """Write ``py_builtins.jsonl`` and the task's YAML into ``folder`` (for ``--include-path``) ->
    the task name."""
    import json
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{BUILTINS_TASK}.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in builtin_questions(seed=seed)), encoding="utf-8")
    (folder / f"{BUILTINS_TASK}.yaml").write_text(
        f"task: {BUILTINS_TASK}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data.resolve()}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n"
        "    aggregation: mean\n    higher_is_better: true\n  - metric: acc_norm\n    aggregation: mean\n"
        "    higher_is_better: true\n", encoding="utf-8")
    return BUILTINS_TASK
