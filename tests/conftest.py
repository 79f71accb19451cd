"""Shared fixtures: every test starts from the same seed, on the CPU, in float32."""
from __future__ import annotations

import importlib
import random

import pytest
import torch

import seqzoo

registry_module = importlib.import_module("seqzoo.registry")  # the attribute seqzoo.registry is the function


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
