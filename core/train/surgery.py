"""Model surgery: ``seqzoo.edit(model, overrides)`` and ``seqzoo edit SRC --set k=v -o OUT``.

A recipe change is applied to a *trained* model: the changed recipe is resolved, the keys that
differ are found, and every key must be claimed by a registered transfer rule (kind ``transfer``,
``seqzoo.interfaces.TransferRule``) — a change no rule covers is refused, naming the key and the
rules that exist. The new model is built; each rule writes the tensors it makes (K/V heads
pooled, experts copied, rows added); every other tensor is copied bit for bit from the old model
(same name, same shape). Then the edit measures what changed: the largest logit difference on a
probe batch (over the old vocabulary), which exact rules must hold at float rounding, and each
rule's own reconstruction error. ``dry_run`` stops after the plan.
"""
from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import InputError
from ..interfaces import LanguageModel, TransferRule
from ..io.build import instantiate
from ..io.checkpoint import unwrap
from ..recipe import resolve
from ..registry import registry

#: The largest logit difference an exact rule may leave (float32 rounding).
EXACT = 1e-4


@dataclass
class EditReport:
    """What an edit did: each changed key and the rule that took it, each new tensor and how it was
    made (``copied``, or a rule's note), each rule's exactness and errors, and the logit
    difference between the old and the new model (None for a dry run)."""

    changed: dict[str, str] = field(default_factory=dict)
    tensors: dict[str, str] = field(default_factory=dict)
    rules: dict[str, dict] = field(default_factory=dict)
    logit_difference: float | None = None

    def lines(self) -> list[str]:
        """The plan and the measurements as lines of text."""
        counts: dict[str, int] = {}
        for how in self.tensors.values():
            counts[how.split(":")[0]] = counts.get(how.split(":")[0], 0) + 1
        out = [f"{key}: {rule}" for key, rule in self.changed.items()]
        out.append("tensors: " + ", ".join(f"{n} {how}" for how, n in sorted(counts.items())))
        out += [f"  {name}: {how}" for name, how in self.tensors.items() if how != "copied"]
        for name, info in self.rules.items():
            errors = ", ".join(f"{k} {v:.3g}" for k, v in info["errors"].items())
            kind = "exact" if info["exact"] else "approximate"
            out.append(f"rule {name}: {kind}" + (f" ({errors})" if errors else ""))
        if self.logit_difference is not None:
            out.append(f"max |Δ logit| on a probe batch: {self.logit_difference:.3g}")
        return out


def changed_keys(old: object, new: object, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two recipe sections (mappings recursed into,
    anything else compared whole)."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = list(dict.fromkeys([*old, *new]))
        return [k for key in keys for k in changed_keys(old.get(key), new.get(key), f"{prefix}{key}.")]
    return [] if old == new else [prefix.rstrip(".")]


def edit(model: nn.Module, overrides: list[str], *, dry_run: bool = False, seed: int = 0,
         probe: torch.Tensor | None = None) -> tuple[nn.Module | None, EditReport]:
    """(the edited model — None for a dry run —, the report) for ``model`` with ``overrides``
    (``--set`` strings: ``model.attention.kv_heads=1``) applied to its recipe."""
    model = unwrap(model)
    old_recipe = model.recipe
    new_recipe = resolve(_for_kind(old_recipe, overrides), overrides, label="edit").data
    old, new = old_recipe["model"], new_recipe["model"]
    changed = changed_keys(old, new)
    other = [k for k in changed_keys({k: v for k, v in old_recipe.items() if k != "model"},
                                     {k: v for k, v in new_recipe.items() if k != "model"})
             if not k.startswith(("train", "runtime"))]
    if other:
        raise InputError(f"edit: {other[0]} changes outside model:; an edit changes the model (train: and "
                         f"runtime: may change freely)")
    report = EditReport()
    rules: list[tuple[str, TransferRule]] = []
    for component in registry().list("transfer"):
        rule = component.cls()
        taken = [k for k in rule.claims(old, new, changed) if k in changed and k not in report.changed]
        if taken:
            rules.append((component.name, rule))
            report.changed.update(dict.fromkeys(taken, component.name))
    uncovered = [k for k in changed if k not in report.changed]
    if uncovered:
        names = ", ".join(c.name for c in registry().list("transfer"))
        raise InputError(f"edit: no transfer rule covers model.{uncovered[0]}; the rules are {names}")
    torch.manual_seed(seed)
    device = next(model.parameters()).device
    built = instantiate(resolve(new_recipe), device="meta" if dry_run else device)
    old_state = model.state_dict()
    new_state = built.state_dict()
    made: dict[str, str] = {}
    for name, rule in rules:
        if not dry_run:
            made.update({t: f"{name}: {how}" for t, how in rule.transfer(old, new, old_state, new_state).items()})
        else:  # the plan without the work: what the rule would write, from a meta copy
            made.update({t: f"{name}" for t in _planned(rule, old, new, old_state, new_state)})
    for tensor_name, tensor in new_state.items():
        if tensor_name in made:
            report.tensors[tensor_name] = made[tensor_name]
        elif tensor_name in old_state and old_state[tensor_name].shape == tensor.shape:
            if not dry_run:
                with torch.no_grad():
                    tensor.copy_(old_state[tensor_name])
            report.tensors[tensor_name] = "copied"
        else:
            raise InputError(f"edit: no rule makes {tensor_name} of the edited model (the changes: "
                             f"{', '.join('model.' + k for k in changed)})")
    if dry_run:
        return None, report
    built.load_state_dict(new_state)
    if model.tokenizer_state is not None:
        built.tokenizer_state = model.tokenizer_state
    built.eval()
    probe = probe if probe is not None else torch.randint(3, old["vocab_size"], (2, min(32, old["max_seq_len"])),
                                                           generator=torch.Generator().manual_seed(1))
    model.eval()
    for name, rule in rules:
        with torch.no_grad():
            measured = rule.measure(model, built, probe.to(device))
        report.rules[name] = {"exact": rule.exact, "errors": {**rule.error(old_state, new_state), **measured}}
    if isinstance(built, LanguageModel) and built.family == "causal":
        report.logit_difference = _logit_difference(model, built, probe)
    if all(rule.exact for _, rule in rules) and (report.logit_difference or 0.0) > EXACT:
        raise AssertionError(f"edit: exact rules left a logit difference of {report.logit_difference:.3g}")
    return built, report


def _planned(rule: TransferRule, old: dict, new: dict, old_state: dict, new_state: dict) -> list[str]:
    """The tensors a rule writes, found by running it on zero-cost meta copies."""
    meta_old = {k: torch.empty_like(v, device="meta") for k, v in old_state.items()}
    meta_new = {k: torch.empty_like(v, device="meta") for k, v in new_state.items()}
    try:
        return list(rule.transfer(old, new, meta_old, meta_new))
    except (NotImplementedError, RuntimeError):  # a rule whose arithmetic meta tensors cannot do
        return []


def _for_kind(recipe: dict, overrides: list[str]) -> dict:
    """The recipe to apply ``overrides`` to: when they change ``model.kind``, without the model
    keys the new kind does not take (a decoder's ``tie_embeddings`` for an encoder)."""
    recipe = copy.deepcopy(recipe)
    kinds = [o.split("=", 1)[1].strip() for o in overrides if o.split("=", 1)[0].strip() == "model.kind"]
    if kinds and kinds[-1] != recipe["model"]["kind"]:
        accepted = inspect.signature(registry().get("model", kinds[-1]).cls.__init__).parameters
        # (its first parameter, the builder, is no recipe key; no recipe names it either)
        recipe["model"] = {k: v for k, v in recipe["model"].items() if k in accepted or k == "kind"}
    return recipe


def _logit_difference(old: nn.Module, new: nn.Module, probe: torch.Tensor) -> float:
    """max |logits_old − logits_new| over the old vocabulary on ``probe``."""
    vocab = old.recipe["model"]["vocab_size"]
    device = next(old.parameters()).device
    old.eval()
    with torch.no_grad():
        a, b = old(probe.to(device)), new(probe.to(device))
    return (a[..., :vocab].float() - b[..., :vocab].float()).abs().max().item()
