"""``seqzoo list KIND NAME``: one component in full, and components without a docstring of their own
(no inherited summary; ``seqzoo check`` warns about them without failing).

Tests that load a plugin build their own registry (``fresh``) for that test only, as
tests/test_plugins.py does, so nothing registered here leaks into other tests.
"""
from __future__ import annotations

import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest

import seqzoo
from seqzoo import testing
from seqzoo.cli import main
from seqzoo.cli.describe import describe, format_hint
from seqzoo.schema import Probability, Size, Spec

registry_module = importlib.import_module("seqzoo.registry")  # seqzoo.registry is the function

BARE = """
import torch
import seqzoo
from seqzoo.interfaces import RecurrentCell

class Bare(RecurrentCell):
    def __init__(self, input_size: int, hidden_size: int, gain: float = 1.0) -> None:
        super().__init__(input_size, hidden_size)
        self.gain = gain
        self.proj = torch.nn.Linear(input_size + hidden_size, hidden_size)

    def step(self, x_t, state):
        h = torch.tanh(self.gain * self.proj(torch.cat([x_t, state], dim=-1)))
        return h, h

class Documented(Bare):
    '''A documented tanh cell.

    gain: multiplies the pre-activation (1.0).
    '''

@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("cell", "bare", Bare), seqzoo.Component("cell", "documented", Documented)]
"""


@pytest.fixture
def bare(tmp_path: Path, fresh) -> Path:
    """A local plugin file with a cell that has no docstring and a subclass that has one."""
    path = tmp_path / "bare_plugin.py"
    path.write_text(textwrap.dedent(BARE))
    fresh()
    return path


def test_list_kind_name_shows_parameters_aliases_origin_and_docstring(fresh, capsys):
    fresh()
    assert main(["list", "score", "additive"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "score additive: Bahdanau vᵀtanh(W_q q + W_k k + b) per head, chunked over queries"
    assert re.search(r"^class +seqzoo\.plugins\.score\.additive\.Additive$", out, re.MULTILINE)
    assert re.search(r"^aliases +none$", out, re.MULTILINE)
    assert re.search(r"^plugin +seqzoo\.plugins\.score\.additive$", out, re.MULTILINE)
    assert re.search(rf"^distribution +seqzoo {re.escape(seqzoo.__version__)}$", out, re.MULTILINE)
    # The core arguments come first, apart from the recipe parameters, with no defaults.
    core = lines.index("core arguments (passed by the core, not recipe parameters):")
    params = lines.index("parameters:")
    assert lines[core + 1:core + 4] == ["  query_dim: int", "  key_dim: int", "  heads: int"]
    assert core < params
    assert lines[params + 1:params + 4] == ["  hidden: (int in [1, 16777216]) | None = None",
                                            "  bias: bool = True",
                                            "  chunk: int >= 1 = 64"]
    from seqzoo.plugins.score.additive import Additive

    assert out.rstrip().endswith(inspect.cleandoc(Additive.__doc__))


def test_list_kind_alias_shows_the_component_and_its_aliases(fresh, capsys):
    fresh()
    assert main(["list", "position", "rotary"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("position rope: ")
    assert re.search(r"^aliases +rotary$", out, re.MULTILINE)
    assert "  scaling: Spec[\"rope_scaling\"] | None = None" in out.splitlines()


def test_list_model_shows_required_keys_and_nested_sections(fresh):
    text = describe(fresh().get("model", "decoder_lm"))
    assert "  vocab_size: int in [1, 16777216] (required)" in text.splitlines()
    assert "  attention: AttentionConfig | None = None" in text.splitlines()  # a pure SSM stack needs none
    assert "  vocab_size: int in [1, 16777216] (required)" in text.splitlines()
    assert "    heads: int in [1, 1024] (required)" in text.splitlines()  # the section's own keys
    assert "  parts: Parts" in text.splitlines()  # the builder is a model's one core argument


@pytest.mark.parametrize("hint, text", [
    (Size | None, "(int in [1, 16777216]) | None"),
    (Probability, "float in [0.0, 1.0)"),
    (Spec["norm"], 'Spec["norm"]'),
    (list[int], "list[int]"),
    (tuple[float, ...], "tuple[float, ...]"),
])
def test_hints_read_as_a_plugin_author_writes_them(hint, text):
    assert format_hint(hint) == text


def test_list_unknown_name_exits_2_with_one_line(fresh, capsys):
    fresh()
    assert main(["list", "cell", "nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("seqzoo: error: unknown cell 'nosuch'; available: gru, lstm, rnn")


def test_a_class_without_its_own_docstring_has_no_summary(bare, capsys):
    assert main(["--plugin", str(bare), "list", "cell"]) == 0
    rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines()}
    # Not "A recurrent cell. ...": the interface's docstring does not describe the component.
    assert seqzoo.registry().get("cell", "bare").summary == ""
    assert re.fullmatch(r"cell +bare +\[local .*bare_plugin\.py\]", rows["bare"]), rows["bare"]
    assert seqzoo.registry().get("cell", "documented").summary == "A documented tanh cell."

    assert main(["list", "cell", "bare"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "cell bare"
    assert out.rstrip().endswith("(no docstring)") and "A recurrent cell" not in out
    assert re.search(rf"^plugin +{re.escape(str(bare.resolve()))}$", out, re.MULTILINE)
    assert re.search(r"^distribution +none \(a local plugin\)$", out, re.MULTILINE)
    assert "  gain: float = 1.0" in out.splitlines()


def test_check_warns_about_a_missing_docstring_without_failing(bare, capsys):
    seqzoo.load_plugin(bare)
    assert main(["check", "cell", "bare"]) == 0
    out = capsys.readouterr().out.splitlines()
    warned = [line for line in out if line.startswith("WARNED")]
    assert warned == [("WARNED  cell/bare docstring: Bare has no docstring of its own; `seqzoo list` shows "
                       "no summary for it; add one saying what it computes, its parameters and the paper")]
    # The closing line keeps its format (CI parses it) and does not count the warning.
    passed = sum(line.startswith("PASSED") for line in out)
    assert out[-1] == f"{passed} passed, 0 failed, 0 skipped (1 component)"
    assert testing.component_warnings("cell", "documented") == []
    assert testing.component_warnings("score", "additive") == []
