"""Shared fixtures: every test starts from the same seed, on the CPU, in float32."""
from __future__ import annotations

import importlib
import os
import random
import tempfile

import pytest
import torch

import seqzoo

registry_module = importlib.import_module("seqzoo.registry")  # the attribute seqzoo.registry is the function


def pytest_configure(config):
    """Machine measurements (the MFU peak) are cached in a folder of the test session's own, so
    the suite neither reads nor writes the user's cache (subprocesses inherit the variable)."""
    os.environ["SEQZOO_CACHE_DIR"] = tempfile.mkdtemp(prefix="seqzoo-test-cache-")


@pytest.fixture(autouse=True)
def seed() -> int:
    random.seed(0)
    torch.manual_seed(0)
    return 0


@pytest.fixture
def tiny_gpt():
    """The shipped tiny decoder recipe, built on the CPU in float32, in eval mode."""
    return seqzoo.build("tiny-gpt", device="cpu").eval()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fresh(monkeypatch):
    """``fresh()`` builds a registry from the current environment (without the SEQZOO_* plugin
    switches) and makes it the process-wide one until the test ends."""
    for var in ("SEQZOO_PLUGINS", "SEQZOO_DISABLE_PLUGINS", "SEQZOO_STRICT_PLUGINS"):
        monkeypatch.delenv(var, raising=False)

    def build() -> registry_module.Registry:
        monkeypatch.setattr(registry_module, "_registry", None)
        return registry_module.registry()

    return build


def write_grammar_corpus(folder, documents: int = 40, seed: int = 0):
    """Sentences from a small grammar, one document per file: learnable, and the same every time."""
    rng = random.Random(seed)
    words = ["the", "cat", "dog", "sat", "on", "a", "mat", "ran", "to", "park", "and", "slept"]
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(documents):
        text = "\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) + "." for _ in range(8))
        (folder / f"doc{i:03d}.txt").write_text(text + "\n")
    return folder


@pytest.fixture(scope="session")
def grammar_shards(tmp_path_factory) -> str:
    """A prepared folder (bytes tokenizer, 10% held out) of ``write_grammar_corpus``'s 40 documents."""
    from seqzoo.data.prepare import TokenizerInfo, prepare

    root = tmp_path_factory.mktemp("grammar")
    prepare([str(write_grammar_corpus(root / "src"))], root / "data", TokenizerInfo(
        seqzoo.registry().create("tokenizer", "bytes"), {"kind": "bytes"}), val=0.1, workers=0)
    return str(root / "data")
