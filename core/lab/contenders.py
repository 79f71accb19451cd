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

from ..errors import closest
from ..recipe import Override
from ..recipe.yaml_lines import read_yaml
from ..schema import describe
from .compare import Arm, CompareError, arm_names

#: The keys of one contender.
KEYS = ("name", "recipe", "set")


def read_contenders(path: str | Path) -> list[Arm]:
    """The arms a contender file lists, in its order (a CompareError or RecipeError names the file,
    the line, the entry and the key that is wrong; a contender's overrides name their own line)."""
    path = Path(path)
    try:
        data, where = read_yaml(path.read_text(encoding="utf-8"), str(path))
    except OSError as error:
        raise CompareError(f"--contenders {path}: cannot read it ({error.strerror or error})") from None
    entries = data.get("contenders") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        typo = next((str(key) for key in data if key != "contenders" and closest(str(key), ["contenders"])), None) \
            if isinstance(data, dict) else None
        fix = f"did you mean 'contenders' for {typo!r}?" if typo else "each entry a mapping of name, recipe and set"
        raise CompareError(f"{path}:1: expected a mapping with a non-empty list under 'contenders:' ({fix})")
    arms = []
    for index, entry in enumerate(entries):
        line = where.get(("contenders", index), (str(path), 1))[1]
        at = f"{path}:{line}: contenders[{index}]"
        if not isinstance(entry, dict):
            raise CompareError(f"{at}: expected a mapping of name, recipe and set, got {describe(entry)}")
        for key in entry:
            if key not in KEYS:
                match = closest(str(key), KEYS)
                fix = f"did you mean {match!r}?" if match else f"the keys are {', '.join(KEYS)}"
                raise CompareError(f"{at}: unknown key {key!r}; {fix}")
        recipe = entry.get("recipe")
        if not isinstance(recipe, str) or not recipe:
            raise CompareError(f"{at}.recipe: expected a recipe path or shipped name, got {describe(recipe)}")
        local = path.parent / recipe
        if recipe.endswith((".yaml", ".yml")) and not local.is_file():
            raise CompareError(f"{at}.recipe: no such file {local} (a recipe path is relative to the contender "
                               f"file; a shipped recipe is named without .yaml)")
        resolved = str(local) if recipe.endswith((".yaml", ".yml")) or local.exists() else recipe
        overrides = entry.get("set", [])
        if not isinstance(overrides, list):
            raise CompareError(f"{at}.set: expected a list of KEY.PATH=VALUE overrides, got {describe(overrides)}")
        for number, override in enumerate(overrides):
            if not isinstance(override, str) or "=" not in override:
                raise CompareError(f"{at}.set[{number}]: expected KEY.PATH=VALUE (such as train.lr=1.0e-3), got "
                                   f"{override!r}" + (", which has no '='" if isinstance(override, str) else ""))
        name = entry.get("name", arm_names([recipe])[0])
        if not isinstance(name, str) or not name:
            raise CompareError(f"{at}.name: expected a name, got {describe(name)}")
        located = tuple(Override(text, where.get(("contenders", index, "set", number), (str(path), line)))
                        for number, text in enumerate(overrides))
        arms.append(Arm(name, resolved, located))
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
