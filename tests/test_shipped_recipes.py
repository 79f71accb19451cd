"""Every shipped recipe with a train: section trains for 2 steps from a clean checkout with no
flags, or fails with one line that names the flag to add."""
from __future__ import annotations

import pytest

from seqzoo.cli import main
from seqzoo.recipe import resolve, shipped_recipes

TRAINABLE = [name for name in shipped_recipes() if resolve(name).data.get("train") is not None]
#: The recipes that need input no checkout has, and the flag their one line of error names.
NEEDS = {"tiny-bert-mlm": "--set train.task.path=FILE"}
#: Full-size models whose two steps (and resumable checkpoint) take most of a minute on 2 CPU cores:
#: walked by the slow run (transformer-base: 63M parameters, a 37k vocabulary).
HEAVY = {"transformer-base"}
CASES = [pytest.param(name, marks=pytest.mark.slow) if name in HEAVY else name for name in TRAINABLE]


@pytest.mark.parametrize("recipe", CASES)
def test_a_shipped_recipe_trains_two_steps_or_names_the_flag_it_needs(recipe, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a clean folder: nothing the recipe could find by chance
    code = main(["train", recipe, "--set", "train.steps=2", "--set", "train.eval_examples=4", "--quiet"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("seqzoo")]
    if recipe in NEEDS:
        assert code == 2 and len(err) == 1 and NEEDS[recipe] in err[0], err
    else:
        assert code == 0, err
        assert (tmp_path / "runs" / f"{recipe}.safetensors").exists()  # saved where a run without -o goes


def test_every_trainable_recipe_is_walked():
    assert len(TRAINABLE) >= 15 and set(NEEDS) <= set(TRAINABLE)
