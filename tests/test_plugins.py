"""Third-party and local plugins: discovery, failure isolation, clashes, provenance, ``requires:``,
and the conformance kit failing components that break their contract.

Every test builds its own registry (``fresh``) and puts it in place of the process-wide one for
that test only, so nothing registered here leaks into other tests. Installed plugins are simulated
by a ``*.dist-info`` folder with an ``entry_points.txt`` on ``sys.path`` — exactly what
``importlib.metadata`` reads for a real install (tests/test_plugins_example.py does a real one).
"""
from __future__ import annotations

import importlib
import itertools
import json
import os
import re
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import seqzoo
from seqzoo import testing
from seqzoo.cli import main
from seqzoo.errors import PluginWarning
from seqzoo.io.checkpoint import ProvenanceWarning
from seqzoo.recipe import resolve
from seqzoo.recipe.requires import _parse_requirement_fallback, parse_requirement

registry_module = importlib.import_module("seqzoo.registry")  # the attribute seqzoo.registry is the function

_ids = itertools.count()

GOOD = """
import seqzoo
from seqzoo.interfaces import ScoreFunction

class Manhattan(ScoreFunction):
    '''Negative L1 distance as the logit.'''
    def scores(self, q, k):
        return -(q[..., :, None, :] - k[..., None, :, :]).abs().sum(-1)

@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("score", "manhattan", Manhattan, summary="negative L1 distance")]
"""

IMPORT_ERROR = "import seqzoo_no_such_module_anywhere\n"

HOOK_RAISES = """
import seqzoo

@seqzoo.hookimpl
def seqzoo_components():
    raise ValueError("boom")
"""

HOOK_RETURNS_NONE = """
import seqzoo

@seqzoo.hookimpl
def seqzoo_components():
    [seqzoo.Component]  # forgot the return
"""

HOOK_TYPO = """
import seqzoo

@seqzoo.hookimpl
def seqzoo_component():
    return []
"""

UNDECORATED = """
def seqzoo_components():
    return []
"""

BAD_COMPONENT = """
import seqzoo
from torch import nn
from seqzoo.interfaces import ScoreFunction

class Manhattan(ScoreFunction):
    def scores(self, q, k):
        return -(q[..., :, None, :] - k[..., None, :, :]).abs().sum(-1)

class NotAScore(nn.Module):
    def __init__(self, query_dim: int, key_dim: int, heads: int) -> None:
        super().__init__()

@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("score", "manhattan", Manhattan), seqzoo.Component("score", "bad", NotAScore)]
"""

CLASH = """
import seqzoo
from seqzoo.interfaces import ScoreFunction

class Fake(ScoreFunction):
    def scores(self, q, k):
        return q @ k.transpose(-2, -1)

@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("score", "scaled_dot", Fake, summary="not the real one"),
            seqzoo.Component("score", "fake", Fake, summary="survives the clash")]
"""

# Deliberately wrong components for the conformance kit.
WRONG = """
import torch
import seqzoo
from seqzoo.functional import expand_kv, masked_softmax_attend
from seqzoo.interfaces import Norm, RecurrentCell, ScoreFunction

class Transposed(ScoreFunction):
    '''Returns (B, T, H, D) instead of (B, H, T, D).'''
    def scores(self, q, k):
        return q @ k.transpose(-2, -1)
    def attend(self, q, k, v, *, mask=None, bias=None, causal=False, dropout=0.0):
        return super().attend(q, k, v, mask=mask, bias=bias, causal=causal).transpose(1, 2)

class Peeking(ScoreFunction):
    '''Ignores causal=True: every query sees every key.'''
    def scores(self, q, k):
        return q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    def attend(self, q, k, v, *, mask=None, bias=None, causal=False, dropout=0.0):
        heads = q.shape[1]
        return masked_softmax_attend(self.scores(q, expand_kv(k, heads)), expand_kv(v, heads),
                                     mask=mask, bias=bias)

class Drifting(RecurrentCell):
    '''Its whole-sequence forward doubles what its steps give.'''
    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__(input_size, hidden_size)
        self.proj = torch.nn.Linear(input_size + hidden_size, hidden_size)
    def step(self, x_t, state):
        h = torch.tanh(self.proj(torch.cat([x_t, state], dim=-1)))
        return h, h
    def forward(self, x, state=None, lengths=None):
        out, state = super().forward(x, state, lengths)
        return out * 2, state

class TimeMeanNorm(Norm):
    '''Normalises by the mean over the time axis: it leaks later tokens into earlier ones.'''
    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.weight = torch.nn.Parameter(torch.ones(dim))
    def forward(self, x):
        return (x - x.mean(dim=-2, keepdim=True)) * self.weight

@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("score", "transposed", Transposed, summary="wrong output shape"),
            seqzoo.Component("score", "peeking", Peeking, summary="not causal"),
            seqzoo.Component("cell", "drifting", Drifting, summary="forward disagrees with step"),
            seqzoo.Component("norm", "time_mean", TimeMeanNorm, summary="mixes positions")]
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path where ``install`` fakes installed distributions with entry points."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    modules = []

    def install(code: str, dist: str = "seqzoo-acme", version: str = "1.0", entry: str = "acme") -> str:
        module = f"seqzoo_test_plugin_{next(_ids)}"
        modules.append(module)
        (root / f"{module}.py").write_text(textwrap.dedent(code))
        info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[seqzoo]\n{entry} = {module}\n")
        return module

    yield install
    for module in modules:
        sys.modules.pop(module, None)


def write_plugin(folder: Path, code: str, name: str | None = None) -> Path:
    path = folder / (name or f"local_plugin_{next(_ids)}.py")
    path.write_text(textwrap.dedent(code))
    return path


def one_warning(recwarn) -> str:
    """The one plugin warning raised, as the command line prints it."""
    lines = [f"seqzoo: warning: {w.message}" for w in recwarn if issubclass(w.category, PluginWarning)]
    assert len(lines) == 1, lines
    assert lines[0].startswith("seqzoo: warning: plugin ")
    return lines[0]


TINY = {"seqzoo": 1, "extends": "tiny-gpt", "model": {"layers": 1}}


def with_score(score: str, **top) -> dict:
    return {**TINY, **top, "model": {"layers": 1, "attention": {"heads": 4, "score": score}}}


# -- discovery -------------------------------------------------------------------------------------
def test_entry_point_plugin_is_discovered_and_attributed(site, fresh, capsys):
    site(GOOD, dist="seqzoo-acme", version="1.2.0", entry="acme")
    reg = fresh()
    component = reg.get("score", "manhattan")
    assert (component.plugin, component.distribution, component.version) == ("acme", "seqzoo-acme", "1.2.0")
    assert component.origin == "seqzoo-acme 1.2.0"
    assert reg.plugins["acme"].source == "entry point" and reg.plugins["acme"].hooks == ("seqzoo_components",)
    assert capsys.readouterr().err == ""


def test_entry_point_component_builds_from_a_recipe(site, fresh):
    site(GOOD)
    fresh()
    model = seqzoo.build(with_score("manhattan"), device="cpu")
    assert model.components["model.attention.score"]["distribution"] == "seqzoo-acme"
    assert model(torch.tensor([[1, 2, 3]])).shape == (1, 3, 259)


def test_registry_is_built_once_per_process(site, fresh):
    site(GOOD)
    reg = fresh()
    assert seqzoo.registry() is reg


@pytest.mark.parametrize("value", ["1", "true", "all"])
def test_disable_plugins_turns_every_entry_point_off(site, fresh, monkeypatch, value):
    site(GOOD)
    monkeypatch.setenv("SEQZOO_DISABLE_PLUGINS", value)
    reg = fresh()
    assert "manhattan" not in reg.names("score")
    assert reg.plugins["acme"].status == "disabled"


def test_disable_plugins_by_name_turns_only_those_off(site, fresh, monkeypatch):
    site(GOOD, dist="seqzoo-acme", entry="acme")
    site(GOOD.replace('"manhattan"', '"taxicab"'), dist="seqzoo-zeta", entry="zeta")
    monkeypatch.setenv("SEQZOO_DISABLE_PLUGINS", "seqzoo_Acme, other")  # distribution names compare like pip's
    reg = fresh()
    assert "manhattan" not in reg.names("score") and "taxicab" in reg.names("score")


def test_local_plugin_by_path_is_loaded_only_when_named(tmp_path, fresh):
    path = write_plugin(tmp_path, GOOD)
    reg = fresh()
    assert "manhattan" not in reg.names("score")
    info = seqzoo.load_plugin(path)
    assert info.source == "local" and info.name == str(path.resolve())
    component = reg.get("score", "manhattan")
    assert component.plugin == str(path.resolve()) and component.distribution == ""
    assert component.origin == f"local {path.resolve()}"
    assert seqzoo.load_plugin(str(path)) is info  # loading twice is harmless


def test_local_plugin_by_module_name(tmp_path, fresh, monkeypatch):
    module = f"seqzoo_test_module_{next(_ids)}"
    write_plugin(tmp_path, GOOD, f"{module}.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    fresh()
    seqzoo.load_plugin(module)
    assert seqzoo.registry().get("score", "manhattan").plugin == module
    sys.modules.pop(module, None)


def test_local_plugins_from_the_environment(tmp_path, fresh, monkeypatch):
    first = write_plugin(tmp_path, GOOD)
    second = write_plugin(tmp_path, GOOD.replace('"manhattan"', '"taxicab"'))
    monkeypatch.setenv("SEQZOO_PLUGINS", f"{first}{os.pathsep}{second}")
    reg = fresh()
    assert {"manhattan", "taxicab"} <= set(reg.names("score"))


def test_cli_plugin_option_before_or_after_the_command(tmp_path, fresh, capsys):
    path = write_plugin(tmp_path, GOOD)
    fresh()
    assert main(["--plugin", str(path), "list", "score"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "manhattan" in line)
    assert line.split()[:2] == ["score", "manhattan"] and "negative L1 distance" in line
    assert line.endswith(f"[local {path.resolve()}]")
    fresh()
    assert main(["list", "score", "--plugin", str(path)]) == 0
    assert "manhattan" in capsys.readouterr().out


def test_load_plugin_missing_file_raises(tmp_path, fresh):
    fresh()
    with pytest.raises(seqzoo.RegistryError, match=r"plugin '.*nope\.py' \(local\) skipped: .*nope\.py: no such file"):
        seqzoo.load_plugin(tmp_path / "nope.py")


def test_load_plugin_directory_raises(tmp_path, fresh):
    fresh()
    with pytest.raises(seqzoo.RegistryError, match=r"a directory, not a \.py file"):
        seqzoo.load_plugin(f"{tmp_path}/")


def test_load_plugin_unknown_module_raises(fresh):
    fresh()
    with pytest.raises(seqzoo.RegistryError, match=r"plugin 'seqzoo_nope_mod' \(local\) skipped: cannot import "
                                                   r"seqzoo_nope_mod: ModuleNotFoundError"):
        seqzoo.load_plugin("seqzoo_nope_mod")


def test_load_plugin_module_name_next_to_a_file_hints_the_path(tmp_path, fresh, monkeypatch):
    write_plugin(tmp_path, GOOD, "seqzoo_nearby_plugin.py")
    monkeypatch.chdir(tmp_path)  # a console script does not put the working folder on sys.path
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    fresh()
    with pytest.raises(seqzoo.RegistryError, match=r"cannot import seqzoo_nearby_plugin: ModuleNotFoundError: .*"
                                                   r"\(to load the file, write \./seqzoo_nearby_plugin\.py\)"):
        seqzoo.load_plugin("seqzoo_nearby_plugin")


# -- failure isolation -------------------------------------------------------------------------------
@pytest.mark.parametrize("code, reason", [
    (IMPORT_ERROR, r"cannot import seqzoo_test_plugin_\d+: ModuleNotFoundError: No module named "
                   r"'seqzoo_no_such_module_anywhere'"),
    (HOOK_RAISES, r"seqzoo_components\(\) raised ValueError: boom"),
    (HOOK_RETURNS_NONE, r"seqzoo_components\(\) returned None; expected a list of seqzoo\.Component records"),
    (HOOK_TYPO, r"unknown hook 'seqzoo_component'; did you mean 'seqzoo_components'\?"),
    (UNDECORATED, r"seqzoo_components is not decorated with @seqzoo\.hookimpl"),
    ("x = 1\n", r"it has no seqzoo_components hook"),
], ids=["import-error", "hook-raises", "hook-returns-none", "hook-typo", "undecorated", "no-hook"])
def test_broken_entry_point_is_skipped_with_one_line(site, fresh, recwarn, code, reason):
    site(code, dist="seqzoo-broken", version="0.3", entry="broken")
    site(GOOD, dist="seqzoo-acme", entry="acme")
    reg = fresh()
    line = one_warning(recwarn)
    assert line.startswith("seqzoo: warning: plugin 'broken' (seqzoo-broken 0.3) skipped: ")
    assert re.search(reason, line), line
    assert reg.plugins["broken"].status == "skipped"
    assert "manhattan" in reg.names("score")  # everything else keeps working
    model = seqzoo.build(with_score("scaled_dot"), device="meta")
    assert model.components["model.attention.score"]["plugin"] == "seqzoo.plugins.score.scaled_dot"


def test_broken_plugin_does_not_change_the_exit_code(site, fresh, capsys, recwarn):
    site(IMPORT_ERROR, entry="broken")
    fresh()
    assert main(["list", "norm"]) == 0
    captured = capsys.readouterr()
    assert "plugin 'broken'" in one_warning(recwarn) and "layernorm" in captured.out


def test_broken_plugin_is_an_error_when_strict(site, monkeypatch, capsys):
    site(HOOK_RAISES, entry="broken")
    monkeypatch.setenv("SEQZOO_STRICT_PLUGINS", "1")
    monkeypatch.setattr(registry_module, "_registry", None)  # main() builds it, strictly
    assert main(["list"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["seqzoo: error: plugin 'broken' (seqzoo-acme 1.0) skipped: seqzoo_components() raised ValueError: "
                   "boom"]


def test_a_plugin_named_with_plugin_that_does_not_load_is_an_error(tmp_path, fresh, capsys):
    """The user asked for it: running without it would quietly do less than asked."""
    path = write_plugin(tmp_path, HOOK_RAISES)
    fresh()
    assert main(["--plugin", str(path), "list", "norm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("seqzoo: error:")
    assert "seqzoo_components() raised ValueError: boom" in err[0]
    fresh()
    assert main(["--plugin", str(tmp_path / "missing.py"), "list"]) == 2
    assert "missing.py: no such file" in capsys.readouterr().err


def test_broken_local_plugin_from_the_environment_is_skipped(tmp_path, fresh, monkeypatch, capsys, recwarn):
    monkeypatch.setenv("SEQZOO_PLUGINS", str(write_plugin(tmp_path, IMPORT_ERROR)))
    reg = fresh()
    assert "No module named 'seqzoo_no_such_module_anywhere'" in one_warning(recwarn)
    assert "scaled_dot" in reg.names("score")


def test_component_breaking_its_interface_is_rejected_alone(site, fresh, capsys, recwarn):
    site(BAD_COMPONENT, entry="acme")
    reg = fresh()
    line = one_warning(recwarn)
    assert line == ("seqzoo: warning: plugin 'acme' (seqzoo-acme 1.0): score 'bad' rejected: "
                    "NotAScore must subclass ScoreFunction")
    assert "manhattan" in reg.names("score") and "bad" not in reg.names("score")
    assert [c.name for c in reg.plugins["acme"].components] == ["manhattan"]


def test_name_clash_keeps_the_builtin_and_names_both_origins(site, fresh, capsys, recwarn):
    site(CLASH, dist="seqzoo-acme", version="1.0", entry="acme")
    reg = fresh()
    line = one_warning(recwarn)
    assert line == ("seqzoo: warning: plugin 'acme' (seqzoo-acme 1.0): score 'scaled_dot' rejected: the name "
                    "is taken by score 'scaled_dot' from plugin 'seqzoo.plugins.score.scaled_dot' "
                    "(seqzoo 0.1.0), which is kept; rename one of them")
    assert reg.get("score", "scaled_dot").distribution == "seqzoo"
    assert reg.get("score", "fake").plugin == "acme"  # the rest of the plugin keeps working


def test_name_clash_between_two_plugins_keeps_the_first_by_name(site, fresh, capsys, recwarn):
    site(GOOD, dist="seqzoo-zeta", entry="zeta")
    site(GOOD, dist="seqzoo-acme", entry="acme")
    reg = fresh()
    line = one_warning(recwarn)
    assert "plugin 'zeta' (seqzoo-zeta 1.0): score 'manhattan' rejected" in line
    assert "from plugin 'acme' (seqzoo-acme 1.0), which is kept" in line
    assert reg.get("score", "manhattan").plugin == "acme"


def test_plugins_command_lists_version_hooks_counts_and_failures(site, tmp_path, fresh, capsys):
    site(GOOD, dist="seqzoo-acme", version="1.2.0", entry="acme")
    site(IMPORT_ERROR, dist="seqzoo-broken", version="0.1", entry="broken")
    fresh()
    capsys.readouterr()
    assert main(["--plugin", str(write_plugin(tmp_path, GOOD.replace('"manhattan"', '"taxicab"'))), "plugins"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert rows["acme"].split()[1:] == ["seqzoo-acme", "1.2.0", "loaded", "seqzoo_components", "1", "(score", "1)"]
    assert "skipped" in rows["broken"] and "ModuleNotFoundError" in rows["broken"]
    assert next(r for n, r in rows.items() if n.endswith(".py")).split()[1:3] == ["local", "loaded"]
    assert rows["seqzoo.plugins"].split()[3:5] == ["seqzoo", "0.1.0"]


# -- safety: recipes and checkpoints never import code -------------------------------------------------
EVIL = """
from pathlib import Path
Path(__file__).with_suffix(".imported").write_text("imported")
"""


def test_recipe_plugins_key_is_an_error_and_imports_nothing(tmp_path, fresh):
    fresh()
    evil = write_plugin(tmp_path, EVIL, "evil.py")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"seqzoo: 1\nextends: tiny-gpt\nplugins: [{evil}]\n")
    with pytest.raises(seqzoo.RecipeError, match=r"r\.yaml:3: plugins: unknown key 'plugins'"):
        resolve(recipe)
    with pytest.raises(seqzoo.RecipeError, match=r"unknown score 'evil'"):
        resolve(with_score("evil"))
    assert not evil.with_suffix(".imported").exists()


def test_recipe_requires_entry_is_not_imported(tmp_path, fresh, monkeypatch):
    fresh()
    write_plugin(tmp_path, EVIL, "evil.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(seqzoo.RecipeError, match=r"score 'evil' is not available: the recipe requires evil, which is "
                                                 r"not installed"):
        resolve(with_score("evil", requires=["evil"]))
    assert not (tmp_path / "evil.imported").exists() and "evil" not in sys.modules


# -- requires: ---------------------------------------------------------------------------------------
def test_requires_names_a_missing_distribution(fresh):
    fresh()
    # The missing distribution is the cause, so it comes first, with no did-you-mean.
    with pytest.raises(seqzoo.RecipeError, match=r"model\.attention\.score: score 'manhattan' is not available: "
                                                 r"the recipe requires seqzoo-acme>=1\.2, which is not "
                                                 r"installed \(pip install 'seqzoo-acme>=1\.2'\)$"):
        resolve(with_score("manhattan", requires=["seqzoo-acme>=1.2"]))


def test_requires_names_a_distribution_that_is_too_old(site, fresh):
    site(GOOD.replace('"manhattan"', '"taxicab"'), dist="seqzoo-acme", version="1.1")
    fresh()
    with pytest.raises(seqzoo.RecipeError, match=r"the recipe requires seqzoo-acme>=1\.2, but seqzoo-acme 1\.1 is "
                                                 r"installed \(pip install -U 'seqzoo-acme>=1\.2'\)"):
        resolve(with_score("manhattan", requires=["seqzoo-acme>=1.2"]))


def test_requires_names_a_disabled_distribution(site, fresh, monkeypatch):
    site(GOOD, dist="seqzoo-acme", version="1.3")
    monkeypatch.setenv("SEQZOO_DISABLE_PLUGINS", "1")
    fresh()
    with pytest.raises(seqzoo.RecipeError, match=r"requires seqzoo-acme>=1\.2, and seqzoo-acme 1\.3 is disabled by "
                                                 r"SEQZOO_DISABLE_PLUGINS"):
        resolve(with_score("manhattan", requires=["seqzoo-acme>=1.2"]))


def test_requires_names_a_distribution_whose_plugin_failed(site, fresh, capsys):
    site(IMPORT_ERROR, dist="seqzoo-acme", version="1.3")
    fresh()
    with pytest.raises(seqzoo.RecipeError, match=r"seqzoo-acme 1\.3 is installed but its plugin failed to load "
                                                 r"\(see `seqzoo plugins`\)"):
        resolve(with_score("manhattan", requires=["seqzoo-acme>=1.2"]))


def test_requires_names_a_loaded_distribution_that_lacks_the_component(site, fresh):
    site(GOOD, dist="seqzoo-acme", version="1.3")
    fresh()
    with pytest.raises(seqzoo.RecipeError, match=r"seqzoo-acme 1\.3 is loaded but does not provide it"):
        resolve(with_score("manhatan", requires=["seqzoo-acme>=1.2"]))


def test_requires_satisfied_builds_and_is_kept_in_the_resolved_recipe(site, fresh):
    site(GOOD, dist="seqzoo-acme", version="1.3")
    fresh()
    data = resolve(with_score("manhattan", requires=["seqzoo-acme>=1.2"])).data
    assert data["requires"] == ["seqzoo-acme>=1.2"]


@pytest.mark.parametrize("value, message", [
    (["seqzoo acme"],
     r"requires\.0: 'seqzoo acme' is not a distribution requirement \(.*\); write e\.g\. seqzoo-acme>=1\.2"),
    ([3], r"requires\.0: expected a requirement string such as 'seqzoo-acme>=1\.2', got 3"),
    ("seqzoo-acme",
     r"requires: expected a list of distribution requirements such as \[seqzoo-acme>=1\.2\], got 'seqzoo-acme'"),
])
def test_requires_malformed_is_a_recipe_error(fresh, value, message):
    fresh()
    with pytest.raises(seqzoo.RecipeError, match=message):
        resolve({**TINY, "requires": value})


def test_requires_malformed_in_a_file_names_the_line(tmp_path, fresh):
    fresh()
    recipe = tmp_path / "r.yaml"
    recipe.write_text("seqzoo: 1\nextends: tiny-gpt\nrequires:\n  - seqzoo-acme>=1.2\n  - '>=2'\n")
    with pytest.raises(seqzoo.RecipeError, match=r"r\.yaml:5: requires\.1: '>=2' is not a distribution requirement"):
        resolve(recipe)


@pytest.mark.parametrize("parse", [parse_requirement, _parse_requirement_fallback], ids=["packaging", "fallback"])
@pytest.mark.parametrize("text, version, ok", [
    ("acme>=1.2", "1.2.0", True), ("acme>=1.2", "1.1.9", False), ("acme~=1.4.2", "1.4.9", True),
    ("acme~=1.4.2", "1.5", False), ("acme==1.*", "1.9", True), ("acme==1.*", "2.0", False),
    ("acme>=1,<2", "1.5", True), ("acme[extra]>=1", "1.0", True), ("acme!=1.0", "1.0.0", False),
    ("acme", "0.0.1", True),
])
def test_requirement_parsers_agree(parse, text, version, ok):
    assert parse(text).satisfied_by(version) is ok and parse(text).name == "acme"


def test_requirement_fallback_rejects_garbage():
    with pytest.raises(ValueError, match="not NAME or NAME followed by version clauses"):
        _parse_requirement_fallback("acme>=")


# -- provenance in checkpoints -------------------------------------------------------------------------
def test_checkpoint_records_origins_and_load_is_quiet_when_they_match(site, fresh, tmp_path):
    site(GOOD, dist="seqzoo-acme", version="1.2.0", entry="acme")
    fresh()
    path = seqzoo.save(seqzoo.build(with_score("manhattan"), device="cpu"), tmp_path / "m.safetensors")
    saved = json.loads(seqzoo.io.checkpoint.read_metadata(path)["seqzoo.components"])
    assert saved["model.attention.score"] == {"kind": "score", "name": "manhattan", "plugin": "acme",
                                              "distribution": "seqzoo-acme", "version": "1.2.0"}
    assert saved["model.norm"]["distribution"] == "seqzoo"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seqzoo.load(path)


def _saved_with_acme(site, fresh, tmp_path, version: str, recipe: dict | None = None) -> Path:
    module = site(GOOD, dist="seqzoo-acme", version=version, entry="acme")
    fresh()
    recipe = recipe or with_score("manhattan")
    path = seqzoo.save(seqzoo.build(recipe, device="cpu"), tmp_path / "m.safetensors")
    for info in (tmp_path / "site").glob("*.dist-info"):  # "uninstall" it
        for file in info.iterdir():
            file.unlink()
        info.rmdir()
    (tmp_path / "site" / f"{module}.py").unlink()
    return path


def test_load_names_the_distribution_when_its_plugin_is_missing(site, fresh, tmp_path):
    path = _saved_with_acme(site, fresh, tmp_path, "1.2.0")
    fresh()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one error, not a warning and then a different error
        with pytest.raises(seqzoo.CheckpointError,
                           match=r"m\.safetensors: recipe key model\.attention\.score: score 'manhattan' comes from "
                                 r"seqzoo-acme 1\.2\.0, which is not installed here; pip install "
                                 r"'seqzoo-acme==1\.2\.0'$"):
            seqzoo.load(path)


def test_load_says_the_plugin_is_turned_off_when_it_is_installed_but_disabled(site, fresh, tmp_path, monkeypatch):
    site(GOOD, dist="seqzoo-acme", version="1.2.0", entry="acme")
    fresh()
    path = seqzoo.save(seqzoo.build(with_score("manhattan"), device="cpu"), tmp_path / "m.safetensors")
    monkeypatch.setenv("SEQZOO_DISABLE_PLUGINS", "1")
    fresh()
    with pytest.raises(seqzoo.CheckpointError,
                       match=r"score 'manhattan' comes from seqzoo-acme 1\.2\.0, which is installed here but turned "
                             r"off by SEQZOO_DISABLE_PLUGINS; unset it \(or take acme out of it\)") as caught:
        seqzoo.load(path)
    assert "pip install" not in str(caught.value)


def test_load_of_a_missing_plugin_gives_the_recipes_own_requirement(site, fresh, tmp_path):
    recipe = with_score("manhattan", requires=["seqzoo-acme>=1.0"])
    path = _saved_with_acme(site, fresh, tmp_path, "1.2.0", recipe)
    fresh()
    with pytest.raises(seqzoo.CheckpointError) as caught:
        seqzoo.load(path)
    assert "pip install 'seqzoo-acme>=1.0'" in str(caught.value)
    with pytest.raises(seqzoo.RecipeError, match=r"pip install 'seqzoo-acme>=1\.0'"):
        resolve(recipe)


def test_unknown_name_without_a_close_match_mentions_missing_plugins(fresh):
    fresh()
    with pytest.raises(seqzoo.RecipeError, match=r"unknown score 'qqqqzz'; available: .*; it may come from a plugin "
                                                 r"that is not installed \(`seqzoo plugins` lists the loaded ones\)"):
        resolve(with_score("qqqqzz"))


def test_load_warns_when_the_plugin_is_a_different_major_version(site, fresh, tmp_path):
    path = _saved_with_acme(site, fresh, tmp_path, "1.2.0")
    site(GOOD, dist="seqzoo-acme", version="2.0.1", entry="acme")
    fresh()
    with pytest.warns(ProvenanceWarning, match=r"score 'manhattan' was saved with seqzoo-acme 1\.2\.0 but 2\.0\.1 is "
                                               r"loaded, a different major version"):
        seqzoo.load(path)


def test_load_is_quiet_for_a_different_minor_version(site, fresh, tmp_path):
    path = _saved_with_acme(site, fresh, tmp_path, "1.2.0")
    site(GOOD, dist="seqzoo-acme", version="1.9", entry="acme")
    fresh()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seqzoo.load(path)


def test_load_warns_when_another_distribution_provides_the_component(site, fresh, tmp_path):
    path = _saved_with_acme(site, fresh, tmp_path, "1.2.0")
    site(GOOD, dist="seqzoo-zeta", version="1.2.0", entry="zeta")
    fresh()
    with pytest.warns(ProvenanceWarning, match=r"was saved from seqzoo-acme 1\.2\.0 but is now provided by "
                                               r"seqzoo-zeta 1\.2\.0"):
        seqzoo.load(path)


def test_load_never_imports_a_local_plugin_named_in_the_checkpoint(tmp_path, fresh, capsys):
    path = write_plugin(tmp_path, GOOD + EVIL)
    fresh()
    seqzoo.load_plugin(path)
    checkpoint = seqzoo.save(seqzoo.build(with_score("manhattan"), device="cpu"), tmp_path / "m.safetensors")
    path.with_suffix(".imported").unlink()
    fresh()
    assert main(["generate", str(checkpoint), "--ids", "1,2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"seqzoo: error: {checkpoint}: recipe key model.attention.score: score 'manhattan' comes from "
                   f"local plugin {path.resolve()}, which is not loaded here; load it with seqzoo --plugin "
                   f"{path.resolve()} or SEQZOO_PLUGINS"]
    assert not path.with_suffix(".imported").exists()


# -- the conformance kit and `seqzoo check` ---------------------------------------------------------------
@pytest.fixture
def wrong(tmp_path, fresh):
    fresh()
    seqzoo.load_plugin(write_plugin(tmp_path, WRONG))


def _failed(kind: str, name: str) -> dict[str, str]:
    return {r.check: r.detail for r in testing.check_component(kind, name) if not r.passed}


def test_kit_fails_a_score_with_the_wrong_output_shape(wrong):
    failed = _failed("score", "transposed")
    assert "attend gave (2, 5, 4, 8), expected (2, 4, 5, 8)" in failed["shapes"]


def test_kit_fails_a_score_that_ignores_causal(wrong):
    failed = _failed("score", "peeking")
    assert set(failed) == {"causal_attend", "causality_kv_cache_padding"}
    assert "a later key changed an earlier query's output" in failed["causal_attend"]


def test_kit_fails_a_cell_whose_forward_disagrees_with_its_steps(wrong):
    failed = _failed("cell", "drifting")
    assert "forward differs from the step loop" in failed["step_matches_sequence"]


def test_kit_fails_a_norm_that_mixes_positions(wrong):
    """Shapes, dtypes, gradients and state_dict all pass for a norm over the time axis; what a norm
    promises — each position on its own — does not."""
    failed = _failed("norm", "time_mean")
    assert set(failed) == {"positions_stay_apart"}
    assert "changing the other positions changed position 2's output" in failed["positions_stay_apart"]


def test_check_command_prints_each_check_and_exits_1_on_failure(wrong, capsys):
    assert main(["check", "score", "peeking"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "PASSED  score/peeking shapes" in out
    assert any(line.startswith("FAILED  score/peeking causal_attend: AssertionError: with causal=True") for line in out)
    assert re.fullmatch(r"\d+ passed, 2 failed, 0 skipped \(1 component\)", out[-1])


def test_check_command_exits_0_when_everything_passes(fresh, capsys):
    fresh()
    assert main(["check", "norm", "rmsnorm"]) == 0
    assert re.fullmatch(r"\d+ passed, 0 failed, 0 skipped \(1 component\)",
                                      capsys.readouterr().out.splitlines()[-1])


def test_check_command_from_a_plugin_checks_only_its_components(tmp_path, fresh, capsys, monkeypatch):
    path = write_plugin(tmp_path, GOOD)
    fresh()
    assert main(["--plugin", str(path), "check", "--from", str(path.resolve())]) == 0
    assert {line.split()[1] for line in capsys.readouterr().out.splitlines()[:-1]} == {"score/manhattan"}
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--from", f"./{path.name}"]) == 0  # a relative path names it too
    assert {line.split()[1] for line in capsys.readouterr().out.splitlines()[:-1]} == {"score/manhattan"}


@pytest.mark.parametrize("args, message", [
    (["check", "model"], "the conformance kit has no checks for kind 'model'; it checks score, "),
    (["check", "scor"], "unknown component kind 'scor'; did you mean 'score'?"),
    (["check", "score", "nope"], "unknown score 'nope'"),
    (["check", "--from", "seqzoo-nope"], "--from seqzoo-nope: no checked component comes from a plugin"),
])
def test_check_command_bad_input_exits_2(fresh, capsys, args, message):
    fresh()
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_parametrize_components_covers_a_loaded_plugin(tmp_path, fresh):
    path = write_plugin(tmp_path, GOOD)
    fresh()
    seqzoo.load_plugin(path)
    mark = testing.parametrize_components("score")
    cases = mark.args[1]
    assert ("manhattan", "shapes") in cases and ("scaled_dot", "shapes") in cases
