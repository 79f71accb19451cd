"""Shared fixtures: every test starts from the same seed, on the CPU, in float32."""
from __future__ import annotations

import random

import pytest
import torch

import seqzoo


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
