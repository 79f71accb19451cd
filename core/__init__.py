"""seqzoo: a plugin-based zoo of sequence-model components for PyTorch.

    import seqzoo
    model = seqzoo.build("tiny-gpt")                 # a recipe path, shipped name or dict
    seqzoo.save(model, "tiny.safetensors")
    model = seqzoo.load("tiny.safetensors")
    ids = seqzoo.generate(model, prompt_ids, max_new_tokens=32)
    seqzoo.registry().list("score")

Plugins are imported when the registry is first used, not by ``import seqzoo``: built-ins, then
installed third-party plugins (entry-point group ``seqzoo``), then the local ones the user names
(``SEQZOO_PLUGINS``, ``seqzoo --plugin``, ``seqzoo.load_plugin("my_plugin.py")``).

The package is layered, each layer importing only those below it (``lint-imports`` checks it):
``cli`` (commands) > ``lab`` (plots, experiments, compare) > ``testing`` (the conformance kit) |
``train`` (training) >
``data`` (token shards) > ``io`` (build, checkpoints, Hugging Face) > ``recipe`` > ``builder``
(recipe specs to modules) > ``nn`` (attention, mixers, blocks, the decode cache, generation) >
``registry`` > the contracts
(``interfaces``, ``config``, ``hookspecs``, ``files``) > ``functional`` (the numeric kernels) >
``schema`` > ``errors``.

The names below load on first use (PEP 562): ``import seqzoo`` is cheap, so ``seqzoo --help``
starts without importing torch, and a plugin that only needs ``seqzoo.hookimpl`` loads nothing
else.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "CheckpointError": "errors", "ConfigError": "errors", "InputError": "errors", "RecipeError": "errors",
    "RegistryError": "errors", "SeqzooError": "errors", "TrainingError": "errors",
    "hookimpl": "hookspecs",
    "build": "io.build", "load": "io.checkpoint", "save": "io.checkpoint",
    "from_gguf": "io.gguf", "to_gguf": "io.gguf", "from_hf": "io.hf", "to_hf": "io.hf",
    "fill_mask": "nn.fill_mask", "generate": "nn.generation",
    "Component": "registry", "Plugin": "registry", "Registry": "registry", "load_plugin": "registry",
    "registry": "registry", "tokenizer": "registry",
    "evaluate": "train.perplexity", "edit": "train.surgery",
}
__all__ = [
    "CheckpointError", "Component", "ConfigError", "InputError", "Plugin", "RecipeError", "Registry",
    "RegistryError", "SeqzooError", "TrainingError", "build", "edit", "evaluate", "fill_mask", "from_gguf",
    "from_hf", "generate", "hookimpl", "load", "load_plugin", "registry", "save", "to_gguf", "to_hf", "tokenizer",
]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'seqzoo' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


class _Package(types.ModuleType):
    """``seqzoo.registry`` is the function: importing the module ``seqzoo.registry`` (which Python
    would set as the package's attribute of the same name) must not replace it."""

    def __setattr__(self, name: str, value) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return  # the submodule stays in sys.modules; the attribute stays the exported name
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:  # what type checkers and editors see
    from .errors import CheckpointError, ConfigError, InputError, RecipeError, RegistryError, SeqzooError, TrainingError
    from .hookspecs import hookimpl
    from .io.build import build
    from .io.checkpoint import load, save
    from .io.gguf import from_gguf, to_gguf
    from .io.hf import from_hf, to_hf
    from .nn.fill_mask import fill_mask
    from .nn.generation import generate
    from .registry import Component, Plugin, Registry, load_plugin, registry, tokenizer
    from .train.perplexity import evaluate
    from .train.surgery import edit
