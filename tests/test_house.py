"""The house's counts, checked on every run: no probing of a model, tokenizer or component in the
core; no plugin and no nn module asking the registry for its parts; no core file over 500 lines;
every package of the core under import-linter's no-circle contract (CI runs ``lint-imports``); and
no plugin module importing a sibling family (shared code lives in ``_underscore`` modules)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
CORE, PLUGINS = ROOT / "core", ROOT / "plugins"
MAX_LINES = 500

#: The getattr-with-default reads the core keeps, each of an object that is not a model, tokenizer
#: or component of seqzoo's: {file: the first argument read}.
EXTERNAL_READS = {
    "nn/losses.py": ["_local"],                        # a threading.local
    "schema.py": ["hint"],                             # a typing construct
    "train/metrics.py": ["torch.ops.aten"],            # an operator torch may not have
    "train/distributed.py": ["model"],                 # FSDP2's fully_shard wrapper method
    "cli/catalog.py": ["sys.modules.get(cls.__module__)"],  # a Python module's docstring
    "cli/describe.py": ["fn", "origin", "hint"],       # annotations and typing constructs
    "registry/loading.py": ["obj", "point", "module"],  # a plugin's module, an entry point
    "io/gguf/reader.py": ["gguf.quants"],              # the gguf package's quantizers
    "io/checkpoint.py": ["model", "model"],            # torch.compile's OptimizedModule wrapper
    "io/build.py": ["func"],                           # a torch function in a TorchFunctionMode
}


def python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def calls(tree: ast.AST):
    return (node for node in ast.walk(tree) if isinstance(node, ast.Call))


def called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def test_the_core_probes_nothing_with_hasattr_or_getattr_defaults():
    found = {}
    for path in python_files(CORE):
        for call in calls(ast.parse(path.read_text())):
            name = called_name(call)
            if name == "hasattr" or (name == "getattr" and len(call.args) == 3):
                found.setdefault(str(path.relative_to(CORE)), []).append(ast.unparse(call.args[0]))
    expected = {file: sorted(reads) for file, reads in EXTERNAL_READS.items()}
    assert {file: sorted(reads) for file, reads in found.items()} == expected, (
        "a new probe in the core: declare the attribute on its base class (seqzoo.interfaces) instead, "
        "or list the external object read here")


def test_no_plugin_and_no_nn_module_asks_the_registry_for_parts():
    offenders = []
    for path in [*python_files(PLUGINS), *python_files(CORE / "nn")]:
        if path.name.startswith("test_"):
            continue
        for call in calls(ast.parse(path.read_text())):
            if called_name(call) == "registry" and not call.args:
                offenders.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert offenders == [], "constructors receive parts or factories; models receive the builder (Parts)"


@pytest.mark.parametrize("path", python_files(CORE), ids=lambda p: str(p.relative_to(CORE)))
def test_no_core_file_is_over_500_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines: split it by concept"


def test_every_core_package_is_under_the_no_circle_contract():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    acyclic = next(c for c in contracts if c["type"] == "acyclic_siblings")
    packages = {"seqzoo" + ("." + ".".join(p.parent.relative_to(CORE).parts) if p.parent != CORE else "")
                for p in CORE.rglob("__init__.py")}
    assert packages - set(acyclic["ancestors"]) == set()


def test_every_package_is_shipped_by_a_non_editable_install():
    """``pip install seqzoo`` installs the packages pyproject lists, no more: a package missing from
    the list works in an editable checkout and is absent from the wheel."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {folder: package for package, folder in setuptools["package-dir"].items()}
    found = {roots[init.relative_to(ROOT).parts[0]] + "".join("." + part for part in
                                                              init.parent.relative_to(ROOT).parts[1:])
             for folder in roots for init in (ROOT / folder).rglob("__init__.py") if "__pycache__" not in init.parts}
    assert found - set(setuptools["packages"]) == set()


SIBLING = re.compile(r"^from \.(?!_)(\w+) import", re.M)


@pytest.mark.parametrize("kind", sorted(p.name for p in PLUGINS.iterdir() if (p / "__init__.py").exists()))
def test_no_plugin_imports_a_sibling_variant(kind):
    imports = {path.name: SIBLING.findall(path.read_text()) for path in python_files(PLUGINS / kind)
               if not path.name.startswith("test_")}
    assert {name: found for name, found in imports.items() if found} == {}, \
        "a variant's module imports another variant's: move what they share into an _underscore module"
