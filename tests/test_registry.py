"""The registry: lookup, creation, errors, and the rules plugins must follow."""
from __future__ import annotations

import importlib
import pkgutil
import re

import pytest
import torch
from torch import nn

import seqzoo
from seqzoo.errors import PluginWarning
from seqzoo.interfaces import CORE_ARGS, ScoreFunction
from seqzoo.registry import Registry, build_registry


def test_list_kind_returns_only_that_kind_sorted():
    scores = seqzoo.registry().list("score")
    assert scores and all(c.kind == "score" for c in scores)
    assert [c.name for c in scores] == sorted(c.name for c in scores)


def test_get_resolves_aliases_to_the_same_component():
    reg = seqzoo.registry()
    assert reg.get("score", "sdpa") is reg.get("score", "scaled_dot")


def test_get_unknown_name_suggests_the_closest():
    with pytest.raises(seqzoo.RegistryError, match=r"unknown score 'scaled_dt'; did you mean 'scaled_dot'\?"):
        seqzoo.registry().get("score", "scaled_dt")


def test_get_unknown_name_without_match_lists_available():
    with pytest.raises(seqzoo.RegistryError, match=r"unknown norm 'zzz'; available: .*layernorm.*rmsnorm"):
        seqzoo.registry().get("norm", "zzz")


def test_get_unknown_kind_names_the_kinds():
    with pytest.raises(seqzoo.RegistryError, match=r"unknown component kind 'scor'; did you mean 'score'\?"):
        seqzoo.registry().get("scor", "scaled_dot")


def test_create_passes_core_args_and_validated_params():
    norm = seqzoo.registry().create("norm", {"kind": "layernorm", "eps": 1e-12}, 8)
    assert norm.eps == 1e-12 and norm.weight.shape == (8,)
    score = seqzoo.registry().create("score", "scaled_dot", query_dim=16, key_dim=16, heads=2)
    assert score.scale == pytest.approx(0.25)


def test_create_rejects_unknown_param_with_suggestion():
    with pytest.raises(seqzoo.RegistryError, match=r"norm\.esp: unknown key 'esp'; did you mean 'eps'\?"):
        seqzoo.registry().create("norm", {"kind": "layernorm", "esp": 1e-5}, 8)


def test_create_rejects_wrong_param_type():
    with pytest.raises(seqzoo.RegistryError, match=r"norm\.eps: expected a number, got 'small'"):
        seqzoo.registry().create("norm", {"kind": "layernorm", "eps": "small"}, 8)


def test_create_missing_core_args_raises():
    with pytest.raises(TypeError, match="needs core arguments"):
        seqzoo.registry().create("norm", "layernorm")


def test_every_builtin_is_registered_under_its_file_name():
    import seqzoo.plugins as root

    for kind in pkgutil.iter_modules(root.__path__):
        package = importlib.import_module(f"seqzoo.plugins.{kind.name}")
        for variant in pkgutil.iter_modules(package.__path__):
            if variant.name.startswith("_"):
                continue
            component = seqzoo.registry().get(kind.name, variant.name)
            assert component.plugin == f"seqzoo.plugins.{kind.name}.{variant.name}"
            assert component.distribution == "seqzoo" and component.summary


def test_every_builtin_component_subclasses_its_kind_base_and_takes_core_args():
    import inspect

    from seqzoo.interfaces import BASES

    for component in seqzoo.registry().list():
        if component.kind in BASES:
            assert issubclass(component.cls, BASES[component.kind])
        core = CORE_ARGS.get(component.kind, ())
        params = [p for p in inspect.signature(component.cls.__init__).parameters if p != "self"]
        assert tuple(params[: len(core)]) == core


class _Score(ScoreFunction):
    def scores(self, q, k):
        return q @ k.transpose(-2, -1)


def _registry_with(*components: seqzoo.Component) -> Registry:
    reg = build_registry()
    for component in components:
        reg.add(component)
    return reg


def warned(recwarn) -> list[str]:
    """The plugin warnings raised, as the command line prints them (one line each)."""
    return [f"seqzoo: warning: {w.message}" for w in recwarn if issubclass(w.category, PluginWarning)]


def test_add_same_kind_and_name_reports_both_plugins_and_keeps_the_builtin(recwarn):
    reg = build_registry()
    clash = seqzoo.Component("score", "scaled_dot", _Score, plugin="acme", distribution="seqzoo-acme", version="1.0")
    assert reg.add(clash) is False
    err = warned(recwarn)
    assert len(err) == 1 and err[0].startswith("seqzoo: warning: ")
    assert re.search(r"plugin 'acme' \(seqzoo-acme 1\.0\): score 'scaled_dot' rejected: the name is taken by "
                     r"score 'scaled_dot' from plugin 'seqzoo\.plugins\.score\.scaled_dot' \(seqzoo 0\.1\.0\), "
                     r"which is kept", err[0])
    assert reg.get("score", "scaled_dot").plugin == "seqzoo.plugins.score.scaled_dot"
    assert reg.problems and "scaled_dot" in reg.problems[0]


def test_add_same_name_as_an_alias_is_a_clash(recwarn):
    reg = build_registry()
    assert reg.add(seqzoo.Component("score", "sdpa", _Score, plugin="acme")) is False
    assert "the name is taken by score 'scaled_dot'" in "".join(warned(recwarn))


def test_add_same_kind_and_name_raises_when_strict(monkeypatch):
    monkeypatch.setenv("SEQZOO_STRICT_PLUGINS", "1")
    reg = build_registry()
    clash = seqzoo.Component("score", "scaled_dot", _Score, plugin="acme")
    with pytest.raises(seqzoo.RegistryError, match=r"plugin 'acme' \(local\): score 'scaled_dot' rejected: "
                                                   r"the name is taken by .*seqzoo\.plugins\.score\.scaled_dot"):
        reg.add(clash)


def test_add_rejects_a_component_with_the_wrong_base_class(monkeypatch):
    class NotAScore(nn.Module):
        def __init__(self, query_dim: int, key_dim: int, heads: int) -> None:
            super().__init__()

    monkeypatch.setenv("SEQZOO_STRICT_PLUGINS", "1")
    with pytest.raises(seqzoo.RegistryError, match="score 'bad' rejected: NotAScore must subclass ScoreFunction"):
        _registry_with(seqzoo.Component("score", "bad", NotAScore, plugin="acme"))


def test_add_rejects_a_constructor_without_core_args(monkeypatch):
    class NoCore(ScoreFunction):
        def __init__(self, width: int = 3) -> None:
            super().__init__(1, 1, 1)

    monkeypatch.setenv("SEQZOO_STRICT_PLUGINS", "1")
    with pytest.raises(seqzoo.RegistryError, match="must start with the core arguments query_dim, key_dim, heads"):
        _registry_with(seqzoo.Component("score", "nocore", NoCore, plugin="acme"))


@pytest.mark.parametrize("kind, name, cls, message", [
    ("score", "has space", _Score, r"name must be a word .*got 'has space'"),
    ("", "x", _Score, r"kind must be a word such as 'score', got ''"),
    ("score", "inst", _Score(1, 1, 1), r"expected a class, got"),
])
def test_add_rejects_a_malformed_record_and_keeps_going(recwarn, kind, name, cls, message):
    reg = build_registry()
    assert reg.add(seqzoo.Component(kind, name, cls, plugin="acme")) is False
    assert re.search(message, "".join(warned(recwarn)))
    assert (kind, name) not in reg.components


@pytest.mark.parametrize("fields, message", [
    ({"aliases": ("ok", 3)}, r"aliases must be non-empty strings, got \('ok', 3\)"),
    ({"summary": "two\nlines"}, r"summary must be one line of text"),
])
def test_add_rejects_malformed_aliases_and_summaries(recwarn, fields, message):
    reg = build_registry()
    assert reg.add(seqzoo.Component("score", "plain", _Score, plugin="acme", **fields)) is False
    assert re.search(message, "".join(warned(recwarn)))


def test_add_new_component_is_creatable():
    reg = _registry_with(seqzoo.Component("score", "plain", _Score, summary="test", plugin="acme"))
    score = reg.create("score", "plain", 4, 4, 2)
    q = torch.randn(1, 2, 3, 4)
    assert score.attend(q, q, q).shape == (1, 2, 3, 4)


def test_import_seqzoo_does_not_import_plugins():
    import subprocess
    import sys

    code = "import sys, seqzoo; print(any(m.startswith('seqzoo.plugins.') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


