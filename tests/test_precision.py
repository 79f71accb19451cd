"""``train.precision: auto`` on the CPU picks bfloat16 autocast where a probe of matrix products finds
it faster, float32 where not (seqzoo.train.precision; docs/training.md), and every bfloat16 path —
attention (SDPA and the blocked/flex one), Mamba's scans, MoE, the fused loss, the hybrid era's
recurrent mixers — trains to finite losses and gradients close to float32's, with its weights, its
recurrent states and its loss in float32."""
from __future__ import annotations

import json

import pytest
import torch

import seqzoo
from seqzoo.config import TrainConfig
from seqzoo.train import precision as precision_module
from seqzoo.train.precision import FASTER, autocast_for, resolve
from seqzoo.train.training import train

CPU = torch.device("cpu")


@pytest.fixture
def rates(tmp_path, monkeypatch):
    """The probe with its measurements mocked: set ``rates["bfloat16"]`` / ``["float32"]`` (FLOP/s);
    ``rates.calls`` counts the measurements made."""
    monkeypatch.setenv("SEQZOO_CACHE_DIR", str(tmp_path))

    class Rates(dict):
        calls = 0

    mocked = Rates(float32=1e11, bfloat16=1e11)

    def measure(dtype, width, budget=0.3):
        mocked.calls += 1
        return mocked[str(dtype).removeprefix("torch.")]
    monkeypatch.setattr(precision_module, "_rate", measure)
    return mocked


@pytest.mark.parametrize("bf16, chosen", [(7e11, "bfloat16"), (FASTER * 1e11, "bfloat16"), (1.4e11, "float32"),
                                          (5e8, "float32")])
def test_auto_on_the_cpu_picks_what_the_probe_finds_faster(rates, bf16, chosen):
    rates["bfloat16"] = bf16
    picked = resolve("auto", CPU)
    assert picked.dtype_name == chosen and picked.autocast == (chosen == "bfloat16")
    assert picked.rates == {"float32": 1e11, "bfloat16": bf16}
    assert picked.record()["probe_flops"] == picked.rates and "GFLOP/s" in picked.reason


def test_the_probe_is_measured_once_per_machine_width_and_thread_count(rates, tmp_path):
    resolve("auto", CPU, 256)
    resolve("auto", CPU, 256)
    assert rates.calls == 2  # float32 and bfloat16, once: the second run reads the kept rates
    kept = json.loads((tmp_path / "machine.json").read_text())
    assert all(f"threads={torch.get_num_threads()}" in key and "512x256" in key for key in kept) and len(kept) == 2
    resolve("auto", CPU, 64)  # another width is another measurement
    assert rates.calls == 4


def test_a_process_with_capped_instructions_measures_for_itself(rates, monkeypatch):
    """ONEDNN_MAX_CPU_ISA / MKL_ENABLE_INSTRUCTIONS change the rates on the same processor (a capped
    run is how a CPU without bfloat16 instructions is imitated): it neither reads nor overwrites
    the uncapped rates."""
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        monkeypatch.delenv(name, raising=False)
    rates["bfloat16"] = 7e11
    assert resolve("auto", CPU, 128).dtype_name == "bfloat16"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    rates["bfloat16"] = 2e9
    assert resolve("auto", CPU, 128).dtype_name == "float32" and rates.calls == 4
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert resolve("auto", CPU, 128).dtype_name == "bfloat16" and rates.calls == 4  # both kept apart


def test_the_probe_measures_the_models_own_width():
    from seqzoo.train.precision import model_width

    assert model_width(seqzoo.build("tiny-gpt", device="cpu")) == 64
    assert model_width(seqzoo.build("tiny-llama", ["model.dim=96"], device="cpu")) == 96
    assert model_width(torch.nn.Sequential(torch.nn.Linear(12, 40), torch.nn.Linear(40, 3))) == 40


@pytest.mark.parametrize("asked", ["float32", "bfloat16"])
def test_an_explicit_precision_is_taken_as_asked_without_a_probe(rates, asked):
    picked = resolve(asked, CPU)
    assert picked.dtype_name == asked and rates.calls == 0 and "probe_flops" not in picked.record()


def test_auto_on_cuda_is_bfloat16_without_a_probe(rates):
    assert resolve("auto", torch.device("cuda")).autocast and rates.calls == 0


def linear_output_dtypes(model) -> list[torch.dtype]:
    seen = []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    return seen


@pytest.mark.parametrize("bf16, chosen", [(7e11, torch.bfloat16), (5e8, torch.float32)])
def test_a_run_computes_in_the_chosen_precision_and_records_it(rates, bf16, chosen, capsys):
    rates["bfloat16"] = bf16
    model = seqzoo.build("tiny-llama", ["model.layers=1"], device="cpu")
    seen = linear_output_dtypes(model)
    config = TrainConfig(task={"kind": "copy", "min_len": 2, "max_len": 6}, steps=2, batch_size=4, log_every=1,
                         eval_examples=4)
    result = train(model, config, seqzoo.tokenizer(model))
    assert result.precision["precision"] == str(chosen).removeprefix("torch.")
    assert result.precision["probe_flops"]["bfloat16"] == bf16
    assert chosen in seen  # the projections ran in it
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay float32
    assert "seqzoo: computing in" in capsys.readouterr().err


def test_train_json_records_the_precision(rates, tmp_path):
    from seqzoo.cli import main

    metrics = tmp_path / "train.json"
    assert main(["train", "tiny-gpt", "--quiet", "--threads", "1", "--metrics", str(metrics), "--set", "train.steps=2",
                 "--set", "train.precision=bfloat16"]) == 0
    assert json.loads(metrics.read_text())["precision"]["precision"] == "bfloat16"


# -- the bfloat16 paths, against float32 ---------------------------------------------------------------
#: recipe -> overrides keeping it small; each exercises a path that autocast changes.
PATHS = {
    "tiny-llama": [],                                    # SDPA, RoPE, SwiGLU, the fused loss
    "tiny-gemma2": [],                                   # capped logits: the blocked (flex-like) attention
    "tiny-moe": [],                                      # routed experts
    "tiny-mamba": [],                                    # Mamba's selective scan
    "tiny-mamba2": [],                                   # Mamba-2's chunked scan
    "tiny-gdn": [], "tiny-kda": [], "tiny-gla": [], "tiny-rwkv7": [], "tiny-rwkv4": [], "tiny-xlstm": [],
    "tiny-lfm2": [], "tiny-griffin": [],                 # the hybrid era's mixers
}


def loss_and_grads(model, ids, autocast: bool):
    model.zero_grad(set_to_none=True)
    with autocast_for(resolve("bfloat16" if autocast else "float32", CPU), CPU):
        loss = model(ids[:, :-1], targets=ids[:, 1:])
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("recipe", list(PATHS))
def test_bfloat16_autocast_trains_close_to_float32(recipe):
    torch.manual_seed(0)
    model = seqzoo.build(recipe, PATHS[recipe], device="cpu").train()
    for module in model.modules():  # dropout off: the two passes see the same network
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    ids = torch.randint(3, 250, (2, 70))  # longer than the chunked scans' chunks, not a multiple of them
    reference, exact = loss_and_grads(model, ids, autocast=False)
    loss, grads = loss_and_grads(model, ids, autocast=True)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert abs(loss - reference) <= 2e-2 * reference, (float(loss), float(reference))
    assert grads.keys() == exact.keys()
    flat = torch.cat([g.flatten() for g in grads.values()])
    flat_exact = torch.cat([g.flatten() for g in exact.values()])
    assert torch.isfinite(flat).all() and all(g.dtype == torch.float32 for g in grads.values())
    cosine = torch.nn.functional.cosine_similarity(flat, flat_exact, dim=0)
    assert cosine >= 0.99, f"{recipe}: the gradient's direction moved (cosine {float(cosine):.4f})"
    norm_ratio = flat.norm() / flat_exact.norm()
    assert 0.95 <= norm_ratio <= 1.05, f"{recipe}: the gradient's size moved ({float(norm_ratio):.3f}x)"


RECURRENT = ["tiny-mamba", "tiny-mamba2", "tiny-gdn", "tiny-kda", "tiny-gla", "tiny-rwkv7", "tiny-rwkv4",
             "tiny-xlstm", "tiny-griffin"]


@pytest.mark.parametrize("recipe", RECURRENT)
def test_recurrent_states_stay_float32_under_autocast(recipe):
    """A prompt of several chunks read under autocast leaves every layer's recurrent state in float32
    (conv windows and token shifts hold inputs, which may be bfloat16), and the next token's logits
    close to float32's."""
    torch.manual_seed(0)
    model = seqzoo.build(recipe, device="cpu").eval()
    ids = torch.randint(3, 250, (2, 70))
    with torch.no_grad():
        exact_cache = model.new_cache(2, 80)
        exact = model(ids, cache=exact_cache)[:, -1]
        cache = model.new_cache(2, 80)
        with autocast_for(resolve("bfloat16", CPU), CPU):
            logits = model(ids, cache=cache)[:, -1]
    states = {f"{layer}.{name}": value for layer, state in enumerate(cache.states)
              for name, value in vars(state).items() if isinstance(value, torch.Tensor) and value.is_floating_point()
              and name not in ("conv", "shift", "keys", "values")}
    assert states, f"{recipe}: no recurrent state found"
    assert all(v.dtype == torch.float32 for v in states.values()), {k: v.dtype for k, v in states.items()}
    assert (logits.float() - exact).abs().max() <= 0.05 * exact.abs().max()


RANKS = """
import json, os, sys, torch, seqzoo
from seqzoo.config import TrainConfig
from seqzoo.train.machine import measurement_key
from seqzoo.train.training import train
rank = int(os.environ["RANK"])
folder = os.path.join(sys.argv[1], f"rank{rank}")  # each rank its own cache: their probes disagree
os.makedirs(folder, exist_ok=True)
os.environ["SEQZOO_CACHE_DIR"] = folder
cpu = torch.device("cpu")
rates = {"float32": 1e11, "bfloat16": 7e11 if rank == 0 else 5e8}
with open(os.path.join(folder, "machine.json"), "w") as f:
    json.dump({measurement_key("probe FLOP/s 512x64", cpu, getattr(torch, name)): rate
               for name, rate in rates.items()}, f)
torch.manual_seed(0)
model = seqzoo.build("tiny-gpt", ["model.layers=1"], device="cpu")
config = TrainConfig(task={"kind": "copy", "min_len": 2, "max_len": 6}, steps=1, batch_size=4, eval_examples=4)
result = train(model, config, seqzoo.tokenizer(model), quiet=True)
with open(os.path.join(folder, "choice.txt"), "w") as f:  # not stdout: two ranks' prints can interleave
    f.write(f"rank {rank}: {result.precision['precision']} ({result.precision['reason']})")
"""


@pytest.mark.skipif(__import__("shutil").which("torchrun") is None, reason="needs torchrun")
def test_ranks_whose_probes_disagree_all_compute_in_rank_0s_choice(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(script),
                          str(tmp_path)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [(tmp_path / f"rank{rank}" / "choice.txt").read_text() for rank in (0, 1)]
    assert lines[0].startswith("rank 0: bfloat16 (auto: bfloat16 products 7x"), lines
    assert lines[1] == "rank 1: bfloat16 (auto: rank 0's probe)", lines
