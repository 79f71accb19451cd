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
``cli`` (commands) > ``lab`` (plots, experiments) > ``train`` (training, the conformance kit) >
``data`` (token shards) > ``io`` (build, checkpoints, Hugging Face) > ``recipe`` > ``nn``
(attention, mixers, blocks, the decode cache, generation) > ``registry`` > the contracts
(``interfaces``, ``config``, ``hookspecs``, ``files``) > ``functional`` (the numeric kernels) >
``schema`` > ``errors``.
"""
from __future__ import annotations

from .errors import CheckpointError, ConfigError, InputError, RecipeError, RegistryError, SeqzooError
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

__version__ = "0.1.0"

__all__ = [
    "CheckpointError", "Component", "ConfigError", "InputError", "Plugin", "RecipeError", "Registry",
    "RegistryError", "SeqzooError", "build", "generate", "hookimpl", "load", "load_plugin", "registry",
    "save", "tokenizer",
    "from_hf", "to_hf", "from_gguf", "to_gguf", "fill_mask", "evaluate", "edit",
]
