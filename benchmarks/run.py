"""seqzoo side by side with the models people would otherwise use — same weights, same inputs,
same machine, one run, reported as ratios of medians of interleaved repeats.

    python benchmarks/run.py            # the full table (several minutes on 2 CPU cores)
    python benchmarks/run.py --quick    # tiny shapes, a smoke test (what the test suite runs)

Needs transformers (the test extra); x-transformers (the bench extra) is compared when installed.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_gpt import ReferenceGPT  # noqa: E402

import seqzoo  # noqa: E402
from seqzoo.lab.measure import decode_ms_per_token, match_parameters, parameters, peak_memory_mb  # noqa: E402


@dataclass
class Shapes:
    vocab: int = 8192
    dim: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    seq: int = 128
    batch: int = 8
    prompt: int = 16
    new_tokens: int = 64
    repeats: int = 7


QUICK = Shapes(vocab=512, dim=64, layers=2, heads=4, kv_heads=2, seq=32, batch=2, prompt=4, new_tokens=8, repeats=2)


@dataclass
class Table:
    rows: list[dict] = field(default_factory=list)

    def add(self, what: str, ours: float, theirs: dict[str, float], unit: str = "ms",
            targets: dict[str, float] | None = None) -> None:
        row = {"what": what, "seqzoo": ours, "unit": unit, "vs": {}}
        for name, value in theirs.items():
            ratio = value / ours if ours else float("nan")
            target = (targets or {}).get(name)
            row["vs"][name] = {"value": value, "ratio": ratio, "target": target,
                               "met": None if target is None else ratio >= target}
        self.rows.append(row)
        cells = []
        for name, cell in row["vs"].items():
            mark = "" if cell["met"] is None else (" ok" if cell["met"] else " MISSED")
            goal = f" (target >= {cell['target']:.2f}x)" if cell["target"] else ""
            cells.append(f"{name} {cell['value']:.2f} {unit} = {cell['ratio']:.2f}x{goal}{mark}")
        print(f"{what:<42} seqzoo {ours:.2f} {unit} | " + " | ".join(cells), flush=True)


def cpu_model() -> str:
    """The CPU as it names itself (/proc/cpuinfo's model name), and its core count: ratios are
    recorded with the machine they were measured on."""
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
    except OSError:
        names = []
    return f"{names[0] if names else platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def interleaved(runs: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median milliseconds of each callable, run in turn ``repeats`` times after one warm-up."""
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            gc.collect()
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


# -- models ----------------------------------------------------------------------------------------
def hf_gpt2(s: Shapes):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=s.vocab, n_embd=s.dim, n_layer=s.layers, n_head=s.heads,
                        n_positions=max(s.seq, s.prompt + s.new_tokens), resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).eval()


def hf_llama(s: Shapes):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=s.vocab, hidden_size=s.dim, intermediate_size=4 * s.dim,
                         num_hidden_layers=s.layers, num_attention_heads=s.heads,
                         num_key_value_heads=s.kv_heads, max_position_embeddings=max(s.seq, 256),
                         bos_token_id=0, eos_token_id=0, tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


def imported(hf_model) -> torch.nn.Module:
    """seqzoo's model from the very same weights, through from_hf."""
    with tempfile.TemporaryDirectory() as folder:
        hf_model.save_pretrained(folder, safe_serialization=True)
        return seqzoo.from_hf(folder).eval()


def x_transformers_llama(s: Shapes):
    try:
        from x_transformers import Decoder, TransformerWrapper
    except ImportError:
        return None
    return TransformerWrapper(
        num_tokens=s.vocab, max_seq_len=s.seq, use_abs_pos_emb=False,
        attn_layers=Decoder(dim=s.dim, depth=s.layers, heads=s.heads, attn_kv_heads=s.kv_heads,
                            rotary_pos_emb=True, ff_glu=True, ff_swish=True, ff_no_bias=True,
                            use_rmsnorm=True, attn_flash=True)).eval()


def logits_of(model, ids):
    out = model(ids)
    return out.logits if hasattr(out, "logits") else out


def loss_of(model, ids) -> torch.Tensor:
    """Next-token loss the way each library computes it: seqzoo ``targets=`` (LM head fused with
    the loss), transformers ``labels=`` (it shifts inside), others logits + F.cross_entropy."""
    inputs, targets = ids[:, :-1], ids[:, 1:].contiguous()
    if type(model).__module__.startswith("seqzoo"):
        return model(inputs, targets=targets)
    if type(model).__module__.startswith("transformers"):
        # shift_labels: the targets as given, so every model sees the same 127 positions.
        return model(inputs, labels=inputs, shift_labels=targets).loss
    return F.cross_entropy(logits_of(model, inputs).flatten(0, 1), targets.flatten())


def train_step(model, *, own_loss: bool = True) -> Callable[[torch.Tensor], None]:
    """forward, loss, backward, AdamW — fused AdamW for every model (transformers' Trainer
    default, ``adamw_torch_fused``, and seqzoo's trainer's)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    model.train()

    def step(ids: torch.Tensor) -> None:
        if own_loss:
            loss = loss_of(model, ids)
        else:
            loss = F.cross_entropy(logits_of(model, ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


# -- training: every model in its own process ------------------------------------------------------
# Models timed in one process disturb each other through the allocator: the 32 MiB logits of one
# model's step are mmap'd and page-faulted differently depending on what the other left behind,
# which moved single-process medians by ±15%. So each training run gets a fresh process, and the
# processes take turns (round after round) so that drift of the machine hits every model alike;
# the figure is the median over all steps of all of a model's processes.
TRAINEES = ["gpt2/seqzoo", "gpt2/transformers", "gpt2/reference", "gpt2/seqzoo-logits",
            "llama/seqzoo", "llama/transformers", "llama/x-transformers"]


def make_trainee(name: str, s: Shapes) -> tuple[torch.nn.Module, bool] | None:
    """(model, trained through its library's own loss?) — seqzoo-logits is seqzoo's model trained
    through logits + F.cross_entropy, the reference's exact math. None if not installed."""
    family, who = name.split("/")
    torch.manual_seed(0)  # the same weights in every process
    if who == "reference":
        return ReferenceGPT(s.vocab, s.dim, s.layers, s.heads, max(s.seq, 256)), True
    if who == "x-transformers":
        model = x_transformers_llama(s)
        return None if model is None else (model, True)
    hf_model = (hf_gpt2 if family == "gpt2" else hf_llama)(s)
    if who == "transformers":
        return hf_model, True
    return imported(hf_model), who == "seqzoo"


def train_worker(name: str, s: Shapes, steps: int) -> list[float]:
    """Milliseconds of ``steps`` training steps of one model, after two warm-up steps."""
    made = make_trainee(name, s)
    if made is None:
        return []
    step = train_step(made[0], own_loss=made[1])
    ids = torch.randint(0, s.vocab, (s.batch, s.seq), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        step(ids)
    times = []
    for _ in range(steps):
        gc.collect()
        start = time.perf_counter()
        step(ids)
        times.append((time.perf_counter() - start) * 1000)
    return times


def isolated_medians(names: list[str], s: Shapes, quick: bool) -> dict[str, float]:
    # A process's own median varies by ±5% with where its memory lands (measured: 200–223 ms for
    # the same GPT-2 step in six processes), so many short processes beat a few long ones.
    rounds, steps = (1, 2) if quick else (s.repeats, 4)
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            command = [sys.executable, __file__, "--worker", name, "--steps", str(steps)]
            command += ["--quick"] if quick else []
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            times[name] += json.loads(out.stdout.strip().splitlines()[-1])
    return {name: statistics.median(values) for name, values in times.items() if values}


def train_flops(params: int, s: Shapes) -> float:
    """≈ 6·N per token for the matmuls, plus attention's 6·L·T·C per token (fwd + bwd)."""
    tokens = s.batch * (s.seq - 1)
    return 6 * params * tokens + 6 * s.layers * (s.seq - 1) * s.dim * tokens


def matmul_gflops(repeats: int) -> float:
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    ms = interleaved({"mm": lambda: a @ b}, repeats * 3)["mm"]
    return 2 * 1024 ** 3 / (ms / 1000) / 1e9


# -- the benchmarks ----------------------------------------------------------------------------------
def bench_training(table: Table, s: Shapes, quick: bool) -> None:
    times = isolated_medians(TRAINEES, s, quick)
    # The plugin seams alone: the same logits + F.cross_entropy as the hand-written reference.
    table.add("train step, GPT-2, same math as reference", times["gpt2/seqzoo-logits"],
              {"reference": times["gpt2/reference"]}, targets={"reference": 0.95})
    table.add("train step, GPT-2 shape", times["gpt2/seqzoo"],
              {"transformers": times["gpt2/transformers"], "reference": times["gpt2/reference"]},
              targets={"transformers": 1.15})
    params = sum(p.numel() for p in make_trainee("gpt2/seqzoo", s)[0].parameters())
    achieved = train_flops(params, s) / (times["gpt2/seqzoo"] / 1000) / 1e9
    peak = matmul_gflops(s.repeats)
    print(f"{'':<42} seqzoo GPT-2 step: {achieved:.1f} GFLOP/s = {achieved / peak:.0%} of a "
          f"1024² float32 matmul ({peak:.1f} GFLOP/s) in the same run")
    table.rows[-1]["gflops"] = {"seqzoo": achieved, "matmul": peak}
    others = {who: times[f"llama/{who}"] for who in ("transformers", "x-transformers") if f"llama/{who}" in times}
    table.add("train step, LLaMA shape (GQA 4/2)", times["llama/seqzoo"], others,
              targets={"transformers": 1.0, "x-transformers": 1.0})


def bench_generation(table: Table, s: Shapes, quick: bool) -> None:
    """seqzoo.generate with its compiled static-cache decode step (eager in --quick, which skips
    compiling) and eagerly, against transformers' generate with its default cache."""
    torch.manual_seed(0)
    for name, make in (("GPT-2", hf_gpt2), ("LLaMA", hf_llama)):
        hf_model = make(s)
        ours = imported(hf_model)
        # No end token on either side: both emit exactly new_tokens, and nothing is suppressed
        # (min_new_tokens would mask token 0 in transformers but not in seqzoo).
        hf_model.generation_config.eos_token_id = None
        for batch in (1, 8):
            ids = torch.randint(1, s.vocab, (batch, s.prompt))

            # Both closures run within this iteration, so reading the loop's variables is meant.
            def hf_run() -> Tensor:
                with torch.inference_mode():
                    return hf_model.generate(ids, max_new_tokens=s.new_tokens, do_sample=False,  # noqa: B023
                                             pad_token_id=0, attention_mask=torch.ones_like(ids))  # noqa: B023

            def our_run(compile: bool = not quick) -> Tensor:
                return seqzoo.generate(ours, ids, s.new_tokens, eos_id=None, compile=compile)  # noqa: B023

            start = time.perf_counter()
            first = our_run()  # compiles (once per model structure and batch size)
            compile_s = time.perf_counter() - start
            assert torch.equal(first, hf_run()) and torch.equal(first, our_run(False)), "outputs differ"
            times = interleaved({"seqzoo": our_run, "eager": lambda: our_run(False), "transformers": hf_run},
                                s.repeats)
            how = "eager: --quick" if quick else f"compiled step, {compile_s:.0f} s first call"
            table.add(f"greedy generate {name}, batch {batch} ({how})", times["seqzoo"],
                      {"transformers": times["transformers"], "seqzoo eager": times["eager"]},
                      targets={"transformers": 2.0})
            table.add(f"eager generate {name}, batch {batch}", times["eager"],
                      {"transformers": times["transformers"]})


def bench_additive(table: Table, s: Shapes, quick: bool) -> None:
    t = 128 if quick else 1024
    width = 32 if quick else 128
    score = seqzoo.registry().create("score", {"kind": "additive", "hidden": width}, 64, 64, 1).eval()
    q, k = torch.randn(1, 1, t, 64), torch.randn(1, 1, t, 64)

    def naive() -> torch.Tensor:
        qp = torch.einsum("bhtd,hda->bhta", q, score.query_weight) + score.bias[:, None]
        kp = torch.einsum("bhsd,hda->bhsa", k, score.key_weight)
        return torch.einsum("bhtsa,ha->bhts", torch.tanh(qp[:, :, :, None] + kp[:, :, None]), score.vector)

    with torch.no_grad():
        torch.testing.assert_close(score.scores(q, k), naive(), atol=1e-4, rtol=1e-4)
        ours, theirs = peak_memory_mb(lambda: score.scores(q, k)), peak_memory_mb(naive)
    table.add(f"additive score peak memory, T=S={t}, A={width}", ours, {"naive broadcast": theirs},
              unit="MiB", targets={"naive broadcast": 8.0})


def bench_import(table: Table, s: Shapes) -> None:
    def timed(code: str) -> Callable[[], None]:
        return lambda: subprocess.run([sys.executable, "-c", code], check=True)

    times = interleaved({"seqzoo": timed("import seqzoo"), "torch": timed("import torch")},
                        max(s.repeats, 3))
    # Here "faster" means lower; the ratio torch/seqzoo must stay >= 1/1.2.
    table.add("import time", times["seqzoo"], {"import torch": times["torch"]},
              targets={"import torch": 1 / 1.2})


def bench_compile(table: Table, s: Shapes) -> None:
    """fullgraph compile of the forward (scaled_dot + rope with a scaling) and of the KV-cached
    decode step; compiled vs eager forward time."""
    import torch._dynamo

    model = seqzoo.build("tiny-llama", [f"model.vocab_size={s.vocab}", f"model.dim={s.dim}",
                                        f"model.layers={s.layers}", f"model.attention.heads={s.heads}",
                                        f"model.attention.kv_heads={s.kv_heads}"], device="cpu").eval()
    ids = torch.randint(0, s.vocab, (s.batch, s.seq))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        start = time.perf_counter()
        compiled(ids)
        compile_s = time.perf_counter() - start
        times = interleaved({"seqzoo": lambda: compiled(ids), "eager": lambda: model(ids)}, s.repeats)
    table.add(f"forward compiled (fullgraph; {compile_s:.0f} s to compile)", times["seqzoo"],
              {"eager": times["eager"]})


# -- state-space mixers (issue #16) ---------------------------------------------------------------
@dataclass
class MambaShapes:
    vocab: int = 8192
    dim: int = 256
    layers: int = 4
    seq: int = 512
    batch: int = 8
    state: int = 16
    repeats: int = 5
    contexts: tuple[int, int] = (128, 2048)
    prefill: int = 8192


#: The first recall experiment's model (C 64, 4 layers, 128 tokens, batch 64), where a Mamba step
#: once cost 6x attention's; the small-model shape the fused scan's target is measured at.
RECALL_SHAPE = MambaShapes(vocab=512, dim=64, layers=4, seq=128, batch=64)
MAMBA_QUICK = MambaShapes(vocab=320, dim=32, layers=2, seq=64, batch=2, state=4, repeats=2,
                          contexts=(16, 64), prefill=256)


def hf_mamba(m: MambaShapes, **kw):
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(vocab_size=m.vocab, hidden_size=m.dim, num_hidden_layers=m.layers, state_size=m.state,
                         expand=2, conv_kernel=4, bos_token_id=0, eos_token_id=0, pad_token_id=0, **kw)
    return MambaForCausalLM(config)


def attention_twin(m: MambaShapes, params: int) -> torch.nn.Module:
    """A LLaMA-shaped seqzoo model (RoPE, GQA 4/2, SwiGLU, the head tied as Mamba's is) with the
    Mamba model's parameter count within a few percent: the SwiGLU width is solved for it."""
    overrides = [f"model.vocab_size={m.vocab}", f"model.dim={m.dim}", f"model.layers={m.layers}",
                 "model.attention.heads=4", "model.attention.kv_heads=2", f"model.max_seq_len={max(m.prefill, m.seq)}",
                 "model.tie_embeddings=true", "model.position.scaling=null"]
    return seqzoo.build("tiny-llama", [*overrides, *match_parameters("tiny-llama", overrides, params)])


def mamba_steps(table: Table, m: MambaShapes, label: str, sequential_too: bool) -> tuple:
    """The training-step rows of one shape: seqzoo's Mamba against mambapy's scan on the same
    weights (and transformers' sequential loop, once: it is slow) and against the LLaMA-shaped
    attention model of the same size -> (seqzoo's Mamba, that attention model)."""
    torch.manual_seed(0)
    slow, fast = hf_mamba(m, use_mambapy=False), hf_mamba(m, use_mambapy=True)
    fast.load_state_dict(slow.state_dict())
    ours = imported(slow)
    attention = attention_twin(m, parameters(ours))
    counts = {"mamba": parameters(ours), "attention": parameters(attention)}
    ids = torch.randint(0, m.vocab, (m.batch, m.seq), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # the three Mamba paths compute the same function
        ref = fast(ids[:, :32]).logits
        assert (ours(ids[:, :32]) - ref).abs().max() < 1e-3 and (slow(ids[:, :32]).logits - ref).abs().max() < 1e-3
    steps = {name: train_step(model) for name, model in
             (("seqzoo", ours), ("mambapy", fast), ("attention", attention))}
    times = interleaved({name: (lambda step=step: step(ids)) for name, step in steps.items()}, m.repeats)
    theirs, targets = {"mambapy scan": times["mambapy"]}, {"mambapy scan": 1.5}
    if sequential_too:
        sequential = train_step(slow)
        start = time.perf_counter()
        sequential(ids)  # one step: transformers' default CPU path loops over the T time steps
        theirs["transformers (sequential)"] = (time.perf_counter() - start) * 1000
        targets["transformers (sequential)"] = 10.0
    table.add(f"Mamba train step T={m.seq} B={m.batch} C={m.dim} L={m.layers}{label}", times["seqzoo"],
              theirs, targets=targets)
    # "no more than X times its step time": attention / Mamba >= 1 / X (1.5 here, 2 at the recall shape)
    bound = 2.0 if label else 1.5
    table.add(f"  vs attention, {counts['attention']:,} vs {counts['mamba']:,} params", times["seqzoo"],
              {"LLaMA-shaped attention": times["attention"]}, targets={"LLaMA-shaped attention": 1 / bound})
    return ours, attention


def bench_mamba(table: Table, quick: bool, sequential: bool = True) -> None:
    """Mamba's training step against transformers' own paths on the same weights (its sequential
    loop, and mambapy's parallel scan), against a LLaMA-shaped attention model of the same size, at
    the benchmark's shape and the recall experiment's; decode time per token at two contexts;
    prefill peak memory against attention."""
    m = MAMBA_QUICK if quick else MambaShapes()
    ours, attention = mamba_steps(table, m, "", sequential_too=sequential)
    mamba_steps(table, MAMBA_QUICK if quick else RECALL_SHAPE, " (recall shape)", sequential_too=False)
    short, long = m.contexts
    for name, model in (("Mamba", ours.eval()), ("attention", attention.eval())):
        per_token = {c: statistics.median(decode_ms_per_token(model, c, m.vocab) for _ in range(3))
                     for c in m.contexts}
        target = {f"context {short}": 1 / 1.25} if name == "Mamba" else None  # long / short <= 1.25
        table.add(f"{name} decode ms/token, context {long} (vs {short})", per_token[long],
                  {f"context {short}": per_token[short]}, targets=target)
    prompt = torch.randint(0, m.vocab, (1, m.prefill))
    with torch.no_grad():
        memory = {name: peak_memory_mb(lambda model=model: model(prompt, logits_to_keep=1))
                  for name, model in (("mamba", ours), ("attention", attention))}
    table.add(f"prefill peak memory T={m.prefill}, Mamba vs attention", memory["mamba"],
              {"attention": memory["attention"]}, unit="MiB", targets={"attention": 1.0})


# -- mixtures of experts and latent attention (issue #17) ------------------------------------------
def hf_mixtral(s: Shapes, experts: int = 8, top_k: int = 2):
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=s.vocab, hidden_size=s.dim, intermediate_size=2 * s.dim,
                           num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                           max_position_embeddings=max(s.seq, 256), num_local_experts=experts,
                           num_experts_per_tok=top_k, bos_token_id=0, eos_token_id=0, tie_word_embeddings=False)
    return MixtralForCausalLM(config)


def bench_moe(table: Table, s: Shapes, quick: bool) -> None:
    """Mixtral-shaped MoE (8 experts, top-2) on the same weights: a training step, and greedy
    generation against transformers' generate (both eager: routing is data-dependent)."""
    torch.manual_seed(0)
    hf_model = hf_mixtral(s)
    ours = imported(hf_model)
    ids = torch.randint(0, s.vocab, (s.batch, s.seq), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (logits_of(ours, ids[:, :16]) - logits_of(hf_model.eval(), ids[:, :16])).abs().max() < 1e-3
    steps = {"seqzoo": train_step(ours), "transformers": train_step(hf_model)}
    times = interleaved({name: (lambda step=step: step(ids)) for name, step in steps.items()}, s.repeats)
    table.add(f"MoE train step (8 experts, top-2), T={s.seq} B={s.batch}", times["seqzoo"],
              {"transformers Mixtral": times["transformers"]}, targets={"transformers Mixtral": 1.5})
    ours.eval(), hf_model.eval()
    hf_model.generation_config.eos_token_id = None
    for batch in (1, 8):
        prompt = torch.randint(1, s.vocab, (batch, s.prompt))

        def hf_run(prompt=prompt) -> Tensor:
            with torch.inference_mode():
                return hf_model.generate(prompt, max_new_tokens=s.new_tokens, do_sample=False, pad_token_id=0,
                                         attention_mask=torch.ones_like(prompt))

        def our_run(prompt=prompt) -> Tensor:
            return seqzoo.generate(ours, prompt, s.new_tokens, eos_id=None)

        assert torch.equal(our_run(), hf_run()), "MoE greedy outputs differ"
        gen = interleaved({"seqzoo": our_run, "transformers": hf_run}, s.repeats)
        table.add(f"MoE greedy generate, batch {batch} (eager)", gen["seqzoo"],
                  {"transformers Mixtral": gen["transformers"]}, targets={"transformers Mixtral": 2.0})


# -- compiled decoding of the new mixers (issue #24) -------------------------------------------------
def hf_decoders(s: Shapes) -> dict[str, Callable[[], torch.nn.Module]]:
    """transformers' counterparts of the zoo's newer families at the benchmark's width and depth."""
    import transformers as tf

    ids = dict(vocab_size=s.vocab, bos_token_id=0, eos_token_id=0, pad_token_id=0, num_hidden_layers=s.layers)
    attention = dict(num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, max_position_embeddings=256)
    ssm = dict(hidden_size=s.dim, expand=2)
    return {
        "Mixtral MoE": lambda: hf_mixtral(s),
        "Mamba": lambda: tf.MambaForCausalLM(tf.MambaConfig(**ids, **ssm, state_size=16, conv_kernel=4)),
        "Mamba-2": lambda: tf.Mamba2ForCausalLM(tf.Mamba2Config(
            **ids, **ssm, num_heads=2 * s.dim // 64, head_dim=64, state_size=64, n_groups=1, chunk_size=64)),
        "hybrid (Bamba)": lambda: tf.BambaForCausalLM(tf.BambaConfig(
            **ids, **attention, hidden_size=s.dim, intermediate_size=2 * s.dim, attn_layer_indices=[s.layers // 2],
            mamba_n_heads=2 * s.dim // 64, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=64,
            mamba_chunk_size=64)),
        "MLA (DeepSeek-V3)": lambda: tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(
            **ids, hidden_size=s.dim, num_attention_heads=s.heads, num_key_value_heads=s.heads,
            max_position_embeddings=256, q_lora_rank=s.dim // 2, kv_lora_rank=s.dim // 4,
            qk_nope_head_dim=s.dim // s.heads * 3 // 4, qk_rope_head_dim=s.dim // s.heads // 4,
            v_head_dim=s.dim // s.heads,
            intermediate_size=2 * s.dim, first_k_dense_replace=s.layers, n_routed_experts=8,
            num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=s.dim)),
    }


def bench_decoding(table: Table, s: Shapes, quick: bool) -> None:
    """Greedy generate with seqzoo's compiled static-cache step (eager under --quick) against
    transformers' generate on the same weights: its default cache, and for the MoE also
    ``cache_implementation="static"``. The MoE at batch 1 and 8, the others at batch 1."""
    torch.manual_seed(0)
    for name, make in hf_decoders(s).items():
        hf_model = make().eval()
        ours = imported(hf_model)
        hf_model.generation_config.eos_token_id = None
        moe = name.startswith("Mixtral")
        for batch in (1, 8) if moe else (1,):
            prompt = torch.randint(1, s.vocab, (batch, s.prompt), generator=torch.Generator().manual_seed(batch))

            def hf_run(static: bool = False, prompt=prompt, hf_model=hf_model) -> Tensor:
                extra = {"cache_implementation": "static"} if static else {}
                with torch.inference_mode():
                    return hf_model.generate(prompt, max_new_tokens=s.new_tokens, do_sample=False, pad_token_id=0,
                                             attention_mask=torch.ones_like(prompt), **extra)

            def our_run(compile: bool = not quick, prompt=prompt, ours=ours) -> Tensor:
                return seqzoo.generate(ours, prompt, s.new_tokens, eos_id=None, compile=compile)

            start = time.perf_counter()
            first = our_run()
            compile_s = time.perf_counter() - start
            assert torch.equal(first, our_run(False)), f"{name}: compiled and eager outputs differ"
            runs = {"seqzoo": our_run, "transformers": hf_run}
            if moe:
                runs["transformers static"] = lambda: hf_run(True)
            times = interleaved(runs, s.repeats)
            how = "eager: --quick" if quick else f"compiled, {compile_s:.0f} s first call"
            theirs = {key: value for key, value in times.items() if key != "seqzoo"}
            targets = {"transformers": 2.0 if batch == 1 else 1.5} if moe else None
            table.add(f"{name} greedy generate, batch {batch} ({how})", times["seqzoo"], theirs, targets=targets)


# -- FlexAttention for biased and masked scores (issue #24) -----------------------------------------
def one_layer(s: Shapes, length: int, *overrides: str) -> torch.nn.Module:
    """One attention layer of 4 heads of 64 (C 256) in a 1-layer LM, with ``overrides``."""
    return seqzoo.build("tiny-llama", [f"model.vocab_size={s.vocab}", "model.dim=256", "model.layers=1",
                                       "model.attention.heads=4", "model.attention.kv_heads=4",
                                       f"model.max_seq_len={length}", "model.position.scaling=null", *overrides],
                        device="cpu").eval()


def bench_flex(table: Table, s: Shapes, quick: bool) -> None:
    """A Gemma-2-style layer (softcap 50 + window 1024) and an ALiBi layer at T = 8192, batch 1,
    through FlexAttention against the materialised path and against a plain causal SDPA layer:
    forward peak memory and time (no gradient: torch compiles flex on the CPU for inference
    only; on CUDA ``benchmarks/gpu.py`` times forward + backward)."""
    length = 512 if quick else 8192
    window = 64 if quick else 1024
    models = {"Gemma-2-style (softcap + window)": one_layer(s, length, "model.attention.softcap=50.0",
                                                           f"model.attention.window={window}"),
              "ALiBi": one_layer(s, length, "model.position=alibi")}
    plain = one_layer(s, length)
    ids = torch.randint(0, s.vocab, (1, length), generator=torch.Generator().manual_seed(0))

    def forward(model, flex_on: bool):
        def run() -> None:
            os.environ["SEQZOO_FLEX"] = "1" if flex_on else "0"
            with torch.no_grad():
                model(ids, logits_to_keep=1)
        return run

    baseline = peak_memory_mb(forward(plain, False))
    for name, model in models.items():
        forward(model, True)()  # compiles the kernel for this layer
        with torch.no_grad():
            os.environ["SEQZOO_FLEX"] = "1"
            got = model(ids, logits_to_keep=8)
            os.environ["SEQZOO_FLEX"] = "0"
            assert (got - model(ids, logits_to_keep=8)).abs().max() < 1e-3, f"{name}: flex and materialised differ"
        memory = {flex_on: peak_memory_mb(forward(model, flex_on)) for flex_on in (True, False)}
        table.add(f"{name} layer T={length} forward peak memory, flex", memory[True],
                  {"materialised": memory[False], "causal SDPA layer": baseline}, unit="MiB",
                  targets={"causal SDPA layer": 1 / 1.5})
        times = interleaved({"flex": forward(model, True), "materialised": forward(model, False),
                             "sdpa": forward(plain, False)}, max(2, s.repeats // 2))
        table.add(f"{name} layer T={length} forward, flex", times["flex"],
                  {"materialised": times["materialised"], "causal SDPA layer": times["sdpa"]},
                  targets={"materialised": 1.5})
        # training: no flex backward on the CPU, so the materialised path runs block by block
        steps = {"blockwise": train_pass(model, ids, blockwise=True),
                 "materialised": train_pass(model, ids, blockwise=False), "sdpa": train_pass(plain, ids)}
        for step in steps.values():  # the fused loss keeps one workspace per thread after its first call:
            step()                   # measure every path in that steady state, not whichever ran first
        memory = {key: peak_memory_mb(step) for key, step in steps.items()}
        table.add(f"{name} layer T={length} forward+backward peak memory, blockwise", memory["blockwise"],
                  {"materialised": memory["materialised"], "causal SDPA layer": memory["sdpa"]}, unit="MiB",
                  targets={"causal SDPA layer": 1 / 1.5})
        times = interleaved(steps, 2)
        table.add(f"{name} layer T={length} forward+backward, blockwise", times["blockwise"],
                  {"materialised": times["materialised"], "causal SDPA layer": times["sdpa"]},
                  targets={"materialised": 1.5})
    os.environ.pop("SEQZOO_FLEX", None)


def train_pass(model: torch.nn.Module, ids: Tensor, blockwise: bool = True) -> Callable[[], None]:
    """Forward + backward of the next-token loss, with the blockwise attention path on or off."""
    import seqzoo.nn.attention as attention

    def run() -> None:
        saved = attention.BLOCKWISE_FROM
        attention.BLOCKWISE_FROM = saved if blockwise else 10 ** 9
        try:
            model.zero_grad(set_to_none=True)
            model(ids[:, :-1], targets=ids[:, 1:]).backward()
        finally:
            attention.BLOCKWISE_FROM = saved
    return run


def bench_mla(table: Table, s: Shapes, quick: bool) -> None:
    """Latent attention's cache per token against MHA and GQA of the same width, and its decode
    step with the absorbed path against without (the same weights)."""
    base = ["model.vocab_size=" + str(s.vocab), f"model.dim={s.dim}", f"model.layers={s.layers}",
            "model.position.scaling=null", "model.max_seq_len=4096", f"model.attention.heads={s.heads}"]
    rank, rope = (s.dim // 4, s.dim // s.heads // 4)
    mla = [f"model.mixer={{kind: mla, heads: {s.heads}, kv_lora_rank: {rank}, qk_nope_head_dim: "
           f"{s.dim // s.heads - rope}, qk_rope_head_dim: {rope}, v_head_dim: {s.dim // s.heads}}}",
           "model.position.interleaved=true"]
    models = {"MHA": seqzoo.build("tiny-llama", base + ["model.attention.kv_heads=null"], device="cpu"),
              "GQA": seqzoo.build("tiny-llama", base + [f"model.attention.kv_heads={s.kv_heads}"], device="cpu"),
              "MLA": seqzoo.build("tiny-llama", base + mla, device="cpu")}
    per_token = {}
    for name, model in models.items():
        cache = model.new_cache(1, 8)
        per_token[name] = sum((st.k[0, :, 0].numel() + st.v[0, :, 0].numel()) * st.k.element_size()
                              for st in cache.states)
    table.add(f"MLA KV cache bytes per token ({s.layers} layers, float32)", per_token["MLA"],
              {"MHA": per_token["MHA"], "GQA": per_token["GQA"]}, unit="B")
    model = models["MLA"].eval()
    context = 64 if quick else 1024
    times = {}
    for absorb in (True, False):
        for block in model.decoder.blocks:
            block.mixer.absorb = absorb
        times[absorb] = statistics.median(decode_ms_per_token(model, context, s.vocab) for _ in range(3))
    for block in model.decoder.blocks:
        block.mixer.absorb = None
    table.add(f"MLA decode ms/token, context {context}, absorbed", times[True], {"not absorbed": times[False]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes, a smoke test")
    parser.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    parser.add_argument("--only", nargs="*",
                        choices=["training", "generation", "additive", "import", "compile", "mamba", "moe", "mla",
                                 "decoding", "flex"])
    parser.add_argument("--no-sequential", action="store_true",
                        help="skip transformers' sequential Mamba step (one step takes minutes on 2 cores)")
    parser.add_argument("--worker", choices=TRAINEES, help=argparse.SUPPRESS)  # one isolated training run
    parser.add_argument("--steps", type=int, default=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    shapes = QUICK if args.quick else Shapes()
    if args.worker:
        print(json.dumps(train_worker(args.worker, shapes, args.steps)))
        return 0
    everything = ["training", "generation", "additive", "import", "mamba", "moe", "mla", "decoding", "flex"]
    wanted = set(args.only or everything + ([] if args.quick else ["compile"]))
    print(f"{cpu_model()}; torch {torch.__version__}, {torch.get_num_threads()} threads, shapes {shapes}")
    table = Table()
    if "training" in wanted:
        bench_training(table, shapes, args.quick)
    if "generation" in wanted:
        bench_generation(table, shapes, args.quick)
    if "additive" in wanted:
        bench_additive(table, shapes, args.quick)
    if "import" in wanted:
        bench_import(table, shapes)
    if "compile" in wanted:
        bench_compile(table, shapes)
    if "mamba" in wanted:
        bench_mamba(table, args.quick, sequential=not args.no_sequential)
    if "moe" in wanted:
        bench_moe(table, shapes, args.quick)
    if "mla" in wanted:
        bench_mla(table, shapes, args.quick)
    if "decoding" in wanted:
        bench_decoding(table, shapes, args.quick)
    if "flex" in wanted:
        bench_flex(table, shapes, args.quick)
    missed = [r["what"] for r in table.rows for c in r["vs"].values() if c["met"] is False]
    print("all targets met" if not missed else f"missed: {'; '.join(missed)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "shapes": vars(shapes), "rows": table.rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
