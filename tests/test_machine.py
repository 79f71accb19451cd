"""Machine measurements are made once and kept: every run's MFU has the same denominator."""
from __future__ import annotations

import json

import torch

from seqzoo.train import machine
from seqzoo.train.metrics import peak_flops


def test_the_peak_is_measured_once_per_machine_and_thread_count(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQZOO_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr("seqzoo.train.metrics._measure_peak", lambda device, dtype: calls.append(1) or 1.5e11)
    cpu = torch.device("cpu")
    assert peak_flops(cpu, torch.float32) == peak_flops(cpu, torch.float32) == 1.5e11
    assert len(calls) == 1  # the second process (or call) reads the kept figure
    kept = json.loads((tmp_path / machine.CACHE_FILE).read_text())
    (key,) = kept
    assert key.startswith("peak FLOP/s | ") and f"threads={torch.get_num_threads()}" in key and "float32" in key
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(max(1, threads - 1) if threads > 1 else 2)
        peak_flops(cpu, torch.float32)  # another thread count is another measurement
    finally:
        torch.set_num_threads(threads)
    assert len(calls) == 2


def test_an_unwritable_cache_only_means_measuring_again(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SEQZOO_CACHE_DIR", str(blocker / "sub"))  # a folder that cannot be made
    assert machine.cached("x", lambda: 3.0) == 3.0
