"""Contender files for ``seqzoo compare --contenders FILE``: comparisons whose arms differ in their
training recipe as well as their model — an optimizer, a learning rate, a schedule — each arm a
name, a recipe and that arm's own overrides (``seqzoo.lab.compare.Arm``)::

    contenders:
      - {name: llama-adamw, recipe: llama.yaml, set: [train.lr=1.0e-3]}
      - {name: llama-muon, recipe: llama.yaml, set: [train.optimizer=muon, train.lr=1.0e-3]}
      - {name: mamba2-wsd, recipe: mamba2.yaml, set: ["train.schedule={kind: wsd, decay: 0.2}"]}

``recipe`` is a path relative to the file (as ``extends:`` is) or a shipped recipe's name; ``set``
holds ``KEY.PATH=VALUE`` overrides, the value read as YAML, applied after the command's own
``--set`` (so a contender's setting wins). ``name`` defaults to the recipe's stem. The arms still
share the data and the budget: ``plan`` refuses contenders that differ in the task, the batch or
the number of steps.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import closest
from ..schema import describe
from .compare import Arm, CompareError, arm_names

#: The keys of one contender.
KEYS = ("name", "recipe", "set")


def read_contenders(path: str | Path) -> list[Arm]:
    """The arms a contender file lists, in its order (a CompareError names the file, the entry and
    the key that is wrong)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CompareError(f"--contenders {path}: cannot read it ({error.strerror or error})") from None
    except yaml.YAMLError as error:
        raise CompareError(f"--contenders {path}: not valid YAML ({str(error).splitlines()[0]})") from None
    entries = data.get("contenders") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise CompareError(f"--contenders {path}: expected a mapping with a non-empty list under 'contenders:' "
                           f"(each a mapping of name, recipe and set)")
    arms = []
    for index, entry in enumerate(entries):
        where = f"--contenders {path}: contenders[{index}]"
        if not isinstance(entry, dict):
            raise CompareError(f"{where}: expected a mapping of name, recipe and set, got {describe(entry)}")
        for key in entry:
            if key not in KEYS:
                match = closest(str(key), KEYS)
                fix = f"did you mean {match!r}?" if match else f"the keys are {', '.join(KEYS)}"
                raise CompareError(f"{where}: unknown key {key!r}; {fix}")
        recipe = entry.get("recipe")
        if not isinstance(recipe, str) or not recipe:
            raise CompareError(f"{where}.recipe: expected a recipe path or shipped name, got {describe(recipe)}")
        overrides = entry.get("set", [])
        if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
            raise CompareError(f"{where}.set: expected a list of KEY.PATH=VALUE overrides, got {describe(overrides)}")
        local = path.parent / recipe
        resolved = str(local) if recipe.endswith((".yaml", ".yml")) or local.exists() else recipe
        name = entry.get("name", arm_names([recipe])[0])
        if not isinstance(name, str) or not name:
            raise CompareError(f"{where}.name: expected a name, got {describe(name)}")
        arms.append(Arm(name, resolved, tuple(overrides)))
    return arms


def with_contenders(recipes: list[str], contender_files: list[str]) -> list[Arm]:
    """The arms of a comparison: the recipes named on the command line (named by their stems), then
    every contender file's, in order; two arms may not share a name."""
    arms = [Arm(name, recipe) for name, recipe in zip(arm_names(recipes), recipes)]
    for path in contender_files:
        arms += read_contenders(path)
    seen: set[str] = set()
    for arm in arms:
        if arm.name in seen:
            raise CompareError(f"two contenders are named {arm.name!r}; give each its own name (its runs and its "
                               f"row in the table go by it)")
        seen.add(arm.name)
    return arms
