"""The component catalog: docs/components.md is what ``seqzoo catalog`` makes of today's built-ins, the
command writes it, and ``--from`` documents one plugin's components only (what a plugin author
runs for their own package).

Tests that load a plugin build their own registry (``fresh``) for that test only, as
tests/test_plugins.py does, so nothing registered here leaks into other tests.
"""
from __future__ import annotations

import difflib
import inspect
import sys
import textwrap
from pathlib import Path

import pytest

import seqzoo
from seqzoo.cli import main
from seqzoo.cli.catalog import COMMAND, builtin, catalog, lead

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS_MD = ROOT / "docs" / "components.md"

# A local plugin in the house style: one module, whose docstring opens with the paper and the
# formula (an indented display), and a second component from the same module, which therefore
# falls back to its class docstring.
PLUGIN = '''
"""Manhattan attention (after no one in particular, 2099).

    score(q, k) = −scale · ‖q − k‖₁

Shown in the catalog; this paragraph is not.
"""
import seqzoo
from seqzoo.interfaces import ScoreFunction


class Manhattan(ScoreFunction):
    """scale: multiplies the distance (1.0)."""

    def __init__(self, query_dim: int, key_dim: int, heads: int, scale: float = 1.0) -> None:
        super().__init__(query_dim, key_dim, heads)
        self.scale = scale

    def scores(self, q, k):
        return -self.scale * (q[..., :, None, :] - k[..., None, :, :]).abs().sum(-1)


class Chebyshev(Manhattan):
    """−max |q − k|, the L∞ distance, as the logit."""

    def scores(self, q, k):
        return -(q[..., :, None, :] - k[..., None, :, :]).abs().amax(-1)


@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("score", "manhattan", Manhattan, summary="negative L1 distance"),
            seqzoo.Component("score", "chebyshev", Chebyshev, aliases=("linf",))]
'''


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    path = tmp_path / "manhattan_plugin.py"
    path.write_text(textwrap.dedent(PLUGIN), encoding="utf-8")
    return path


def test_docs_components_md_is_current(fresh):
    """Fails whenever a built-in component, its parameters or its docstrings change without the
    catalog being regenerated; the message says how."""
    expected = catalog(builtin(fresh()))
    committed = COMPONENTS_MD.read_text(encoding="utf-8") if COMPONENTS_MD.exists() else ""
    if committed != expected:
        diff = "".join(list(difflib.unified_diff(committed.splitlines(True), expected.splitlines(True),
                                                 "docs/components.md (committed)", "catalog (now)", n=1))[:40])
        pytest.fail(f"docs/components.md is stale: run `{COMMAND}` in the repository root and commit "
                    f"the result.\n{diff}", pytrace=False)


def test_catalog_lists_every_builtin_with_its_reference_and_parameters(fresh):
    reg = fresh()
    text = catalog(builtin(reg))
    for component in builtin(reg):
        assert f"\n### {component.kind} `{component.name}`\n" in text, component
    assert "(no docstring)" not in text
    # Only seqzoo's own components, and nothing that differs between machines.
    assert all(c.distribution == "seqzoo" for c in builtin(reg))
    assert str(ROOT) not in text and seqzoo.__version__ not in text
    rope = text.split("\n### position `rope`\n", 1)[1].split("\n### ", 1)[0]
    assert "x'_a = x_a cos θ − x_b sin θ" in rope  # the module docstring's display formula
    assert "| `base` | `float > 0` | `10000.0` |" in rope
    assert "| `scaling` | `Spec[\"rope_scaling\"] \\| None` | `None` |" in rope  # a pipe escaped in a table
    assert "aliases `rotary`" in rope and "core arguments `dim`, `head_dim`, `heads`, `max_seq_len`" in rope
    decoder = text.split("\n### model `decoder_lm`\n", 1)[1].split("\n### ", 1)[0]
    assert "| `attention.heads` | `int in [1, 1024]` | required |" in decoder  # a section's own keys


@pytest.mark.parametrize("kind", ["activation", "cell", "ffn", "mixer", "norm", "optimizer", "position", "rope_scaling",
                                  "schedule", "score"])
def test_every_builtin_of_a_mathematical_kind_states_its_formula(fresh, kind):
    """The catalog's reference line for these kinds is a formula, not just a paper: the lead of the
    module docstring (its first paragraph and an indented display after it) has an equation or at
    least a product (the house style writes products with ``·``)."""
    for component in (c for c in builtin(fresh()) if c.kind == kind):
        if (kind, component.name) == ("position", "none"):
            continue  # nothing to compute
        doc = inspect.getdoc(sys.modules[component.cls.__module__]) or ""
        text = " ".join(part for _, part in lead(doc))
        assert any(sign in text for sign in "=≈·"), (
            f"{kind} {component.name}: the first paragraph of its module docstring (or an indented display "
            f"right after it) should give the formula; it reads {text!r}")


def test_cli_writes_the_catalog_and_one_kind_to_stdout(fresh, tmp_path, capsys):
    reg = fresh()
    out = tmp_path / "components.md"
    assert main(["catalog", "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == catalog(builtin(reg))
    assert capsys.readouterr().out.startswith("wrote ")
    assert main(["catalog", "norm"]) == 0
    text = capsys.readouterr().out
    assert "Generated by `seqzoo catalog norm`" in text
    assert "\n### norm `rmsnorm`\n" in text and "\n## score\n" not in text


def test_from_a_local_plugin_lists_only_its_components(fresh, plugin, tmp_path, capsys):
    fresh()
    out = tmp_path / "docs" / "manhattan.md"
    out.parent.mkdir()
    assert main(["--plugin", str(plugin), "catalog", "--from", str(plugin), "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    headings = [line for line in text.splitlines() if line.startswith("### ")]
    assert headings == ["### score `chebyshev`", "### score `manhattan`"]
    assert text.startswith("# Components of manhattan_plugin.py\n")
    assert str(tmp_path) not in text  # the file is named, not its absolute path
    manhattan = text.split("### score `manhattan`\n", 1)[1]
    # Two components share the module, so each entry reads its class docstring, not the module's.
    assert "score(q, k) = −scale · ‖q − k‖₁" not in text
    assert manhattan.startswith("\nnegative L1 distance\n\nscale: multiplies the distance (1.0).\n")
    assert "| `scale` | `float` | `1.0` |" in manhattan
    assert "Class `manhattan_plugin.py:Manhattan`; from the local plugin file `manhattan_plugin.py`" in manhattan
    chebyshev = text.split("### score `chebyshev`\n", 1)[1].split("\n### ", 1)[0]
    assert "−max |q − k|, the L∞ distance, as the logit." in chebyshev
    assert "aliases `linf`" in chebyshev


def test_a_module_of_one_component_gives_its_module_docstring(fresh, plugin, capsys):
    single = plugin.with_name("single_plugin.py")
    single.write_text(plugin.read_text(encoding="utf-8").replace(
        ',\n            seqzoo.Component("score", "chebyshev", Chebyshev, aliases=("linf",))', ""), encoding="utf-8")
    fresh()
    assert main(["--plugin", str(single), "catalog", "--from", str(single)]) == 0
    text = capsys.readouterr().out
    assert ("Manhattan attention (after no one in particular, 2099).\n\n"
            "```text\nscore(q, k) = −scale · ‖q − k‖₁\n```") in text
    assert "Shown in the catalog" not in text
    assert "\nscale: multiplies the distance (1.0).\n" in text  # the class docstring follows


def test_from_an_unknown_origin_exits_2_with_one_line(fresh, capsys):
    fresh()
    assert main(["catalog", "--from", "seqzoo-nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--from seqzoo-nope: no component comes from a plugin" in err[0]


def test_an_output_that_is_a_folder_exits_2_naming_it(tmp_path, capsys):
    assert main(["catalog", "-o", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (f"seqzoo: error: -o {tmp_path}: is a directory; give a file name "
                                               f"such as {tmp_path / 'components.md'}")


@pytest.mark.parametrize("doc, parts", [
    ("One line.", [("text", "One line.")]),
    ("First\nparagraph.\n\nSecond.", [("text", "First paragraph.")]),
    ("Intro:\n\n    a = b\n    c = d\n\nMore.", [("text", "Intro:"), ("display", "a = b\nc = d")]),
    ("", []),
])
def test_lead_is_the_first_paragraph_and_an_indented_display(doc, parts):
    assert lead(doc) == parts


def test_every_worked_recipe_builds_and_runs():
    """The worked recipes docs/components.md shows (``recipe_example``) are real recipes."""
    import inspect

    import torch
    import yaml

    import seqzoo

    examples = [(c.kind, c.name, vars(c.cls)["recipe_example"]) for c in seqzoo.registry().list()
                if isinstance(vars(c.cls).get("recipe_example"), str)]
    assert {(k, n) for k, n, _ in examples} >= {("ffn", "moe"), ("mixer", "mla"), ("router", "sigmoid_grouped")}
    for kind, name, text in examples:
        recipe = yaml.safe_load(inspect.cleandoc(text))
        model = seqzoo.build(recipe, device="cpu").eval()
        assert name in repr(recipe), (kind, name)  # the example shows its own component
        with torch.no_grad():
            assert model(torch.randint(3, 259, (1, 6))).shape == (1, 6, 259)
