"""What a new user meets in the first hour: trained work is never replaced or thrown away
unasked, and the commands say what they did and what they need."""
from __future__ import annotations

import re
import textwrap

import pytest

import seqzoo
from seqzoo.cli import main

FAST = ["--set", "train.steps=2", "--set", "train.eval_examples=4", "--quiet"]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines()
             if line.startswith("seqzoo") and not line.startswith("seqzoo: warning")]
    assert len(lines) == 1, lines
    return lines[0]


def test_build_does_not_replace_a_trained_checkpoint_unless_forced(tmp_path, capsys):
    assert main(["train", "tiny-gpt", "-o", "t1.safetensors", *FAST]) == 0
    before = (tmp_path / "t1.safetensors").read_bytes()
    assert main(["build", "tiny-gpt", "-o", "t1.safetensors"]) == 2
    line = error_line(capsys)
    assert re.search(r"-o t1\.safetensors: the file already holds a decoder_lm with [\d,]+ parameters, trained 2 of "
                     r"2 steps on copy; add --force to replace it, or write elsewhere with -o OTHER", line), line
    assert (tmp_path / "t1.safetensors").read_bytes() == before
    assert main(["build", "tiny-gpt", "-o", "t1.safetensors", "--force"]) == 0
    assert (tmp_path / "t1.safetensors").read_bytes() != before


def test_train_does_not_overwrite_a_finished_run_and_names_resume(tmp_path, capsys):
    assert main(["train", "tiny-gpt", "-o", "t2.safetensors", *FAST]) == 0
    capsys.readouterr()
    assert main(["train", "tiny-gpt", "-o", "t2.safetensors", *FAST]) == 2
    line = error_line(capsys)
    assert "continue that run with --resume t2.safetensors, or add --force to replace it" in line
    assert main(["train", "tiny-gpt", "--resume", "t2.safetensors", "--set", "train.steps=3", "--quiet"]) == 0
    assert main(["train", "tiny-gpt", "-o", "t2.safetensors", "--force", *FAST]) == 0
    assert main(["build", "tiny-gpt", "-o", "w.safetensors"]) == 0
    capsys.readouterr()
    assert main(["train", "tiny-gpt", "-o", "w.safetensors", *FAST]) == 2
    line = error_line(capsys)
    assert "holds a decoder_lm with" in line and "(weights only)" in line and "--resume" not in line
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["build", "tiny-gpt", "-o", "notes.txt"]) == 2
    assert "a file that is not a seqzoo checkpoint" in error_line(capsys)


def test_train_without_o_saves_under_runs_and_never_overwrites_an_earlier_run(tmp_path, capsys):
    assert main(["train", "tiny-gpt", *FAST]) == 0
    assert "saved runs/tiny-gpt.safetensors (resumable)" in capsys.readouterr().out
    assert main(["train", "tiny-gpt", *FAST]) == 0
    assert "saved runs/tiny-gpt-2.safetensors" in capsys.readouterr().out
    assert seqzoo.load(tmp_path / "runs" / "tiny-gpt.safetensors").recipe["train"]["steps"] == 2


PLUGIN = """
import seqzoo
from seqzoo.interfaces import ScoreFunction

class Manhattan(ScoreFunction):
    '''Negative L1 distance as the logit.'''
    def scores(self, q, k):
        return -(q[..., :, None, :] - k[..., None, :, :]).abs().sum(-1)

@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("score", "manhattan_first_hour", Manhattan, summary="negative L1 distance")]
"""


def test_the_try_it_hint_carries_the_plugin_the_run_needed(tmp_path, capsys, fresh):
    plugin = tmp_path / "manhattan.py"
    plugin.write_text(textwrap.dedent(PLUGIN))
    fresh()
    assert main(["--plugin", str(plugin), "train", "tiny-gpt", "-o", "m.safetensors", *FAST,
                 "--set", "model.attention.score=manhattan_first_hour"]) == 0
    out = capsys.readouterr().out
    assert f"seqzoo --plugin {plugin} generate m.safetensors --prompt" in out


def test_a_mistake_below_the_first_key_of_a_set_is_blamed_on_the_set(capsys):
    assert main(["train", "tiny-gpt", "--set", "train.tsak.kind=copy", *FAST]) == 2
    assert error_line(capsys) == "seqzoo: error: --set[1]:1: train.tsak: unknown key 'tsak'; did you mean 'task'?"


def test_list_recipes_lists_the_shipped_recipes_with_their_sizes(capsys):
    assert main(["list", "recipes"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert set(rows) == set(seqzoo.recipe.shipped_recipes())
    assert "6,738,415,616" in rows["llama2-7b"] and "decoder_lm" in rows["gpt2"] and "124,439,808" in rows["gpt2"]


@pytest.mark.parametrize("command", ["show", "train", "build"])
def test_set_has_help(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert re.search(r"--set KEY=VALUE\s+override a recipe value", capsys.readouterr().out)
