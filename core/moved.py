"""Where the modules of seqzoo's first layout went, so ``import seqzoo.attention`` (and every other
old path a plugin may import) keeps working: the old name is the new module itself, not a copy, so
patching or subclassing through either name reaches the same objects.

    seqzoo.attention, blocks, cache, linear, losses, init, recurrent, layers, generation -> seqzoo.nn.*
    seqzoo.checkpoint, hf, build                                                      -> seqzoo.io.*
    seqzoo.training, testing                                                          -> seqzoo.train.*
    seqzoo.cli (the module), cli_train, cli_plots, catalog, describe                  -> seqzoo.cli.*
    seqzoo.plots, experiments                                                         -> seqzoo.lab.*
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

#: old name under seqzoo -> the module that holds it now
MOVED = {
    "attention": "nn.attention", "blocks": "nn.blocks", "cache": "nn.cache", "linear": "nn.linear",
    "losses": "nn.losses", "init": "nn.init", "recurrent": "nn.recurrent", "layers": "nn.layers",
    "generation": "nn.generation",
    "checkpoint": "io.checkpoint", "hf": "io.hf", "build": "io.build",
    "training": "train.training", "testing": "train.testing",
    "cli_train": "cli.train", "cli_plots": "cli.plots", "catalog": "cli.catalog", "describe": "cli.describe",
    "plots": "lab.plots", "experiments": "lab.experiments",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``seqzoo.<old>`` to the module at its new place (imported on first use)."""

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.partition(".")
        if package != "seqzoo" or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(f"seqzoo.{MOVED[spec.name.partition('.')[2]]}")
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module ran when it was imported at its new place; importlib has just stamped the
        alias's spec on it, so give it back its own (its real name and file)."""
        module.__spec__ = self.own_spec


def install() -> None:
    """Serve the old paths. Modules the package imported already are aliased at once: importing
    ``seqzoo.build`` through the finder would rebind the attribute ``seqzoo.build`` — the build
    function — to the module."""
    for old, new in MOVED.items():
        if f"seqzoo.{new}" in sys.modules:
            sys.modules.setdefault(f"seqzoo.{old}", sys.modules[f"seqzoo.{new}"])
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
