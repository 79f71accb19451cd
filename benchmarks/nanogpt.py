"""seqzoo's GPT-2 recipe against nanoGPT (Karpathy, 2022) trained side by side on the same token
shards: the same shape, the same starting weights, the same AdamW, learning rates, windows and
batches. Reports the held-out loss of both at every evaluation (they must agree within 1%) and
each run's median tokens/s (seqzoo must train at >= 1.1x nanoGPT's).

    seqzoo data prepare "$LIB" --glob '*.py' --exclude site-packages -o data/stdlib-bytes
    python benchmarks/nanogpt.py --data data/stdlib-bytes            # 1000 steps, about 15 min
    python benchmarks/nanogpt.py --data DIR --steps 20 --quick        # a smoke test

nanoGPT is not a package, so its model and training step are written out below as its
``model.py`` and ``train.py`` have them (module names included): LayerNorm with a bias, one
``c_attn`` projection, ``F.scaled_dot_product_attention(is_causal=True)``, an exact-GELU MLP, a
tied head over the full logits, ``configure_optimizers``' decay groups (AdamW fused on CUDA only,
as nanoGPT chooses), gradient clipping at 1.0. seqzoo trains through ``seqzoo.train.training.train``
exactly as ``seqzoo train`` does. Run it alone on the machine: the ratio is a ratio of medians of
two runs, one after the other.
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import seqzoo
from seqzoo.config import TrainConfig
from seqzoo.data.shards import read_manifest
from seqzoo.io.build import instantiate
from seqzoo.lab.compare_results import machine
from seqzoo.recipe import resolve
from seqzoo.schema import instantiate as instantiate_section
from seqzoo.train.training import lr_factor, train

RECIPE = Path(__file__).resolve().parents[1] / "examples" / "compare" / "gpt2.yaml"


# -- nanoGPT's model.py ----------------------------------------------------------------------------
class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's had none to switch off when nanoGPT was written)."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, bias: bool) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd: int, bias: bool) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, bias: bool) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias)
        self.attn = CausalSelfAttention(n_embd, n_head, bias)
        self.ln_2 = LayerNorm(n_embd, bias)
        self.mlp = MLP(n_embd, bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 bias: bool = True) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head, bias) for _ in range(n_layer)]), ln_f=LayerNorm(n_embd, bias)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    def configure_optimizers(self, weight_decay: float, learning_rate: float, betas, device_type: str):
        params = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2]
        nodecay = [p for p in params.values() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": nodecay, "weight_decay": 0.0}]
        use_fused = "fused" in inspect.signature(torch.optim.AdamW).parameters and device_type == "cuda"
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **({"fused": True} if use_fused else {}))


def copy_weights(seqzoo_model: nn.Module, nano: GPT) -> None:
    """nanoGPT starts from seqzoo's initial weights (the same layout: q|k|v rows in one projection)."""
    state = seqzoo_model.state_dict()
    mapped = {"transformer.wte.weight": state["embed.weight"], "lm_head.weight": state["embed.weight"],
              "transformer.wpe.weight": state["decoder.position.table.weight"],
              "transformer.ln_f.weight": state["decoder.final_norm.weight"],
              "transformer.ln_f.bias": state["decoder.final_norm.bias"]}
    names = {"ln_1": "mixer_norm", "attn.c_attn": "mixer.qkv_proj", "attn.c_proj": "mixer.out_proj",
             "ln_2": "ffn_norm", "mlp.c_fc": "ffn.up", "mlp.c_proj": "ffn.down"}
    for i in range(len(nano.transformer.h)):
        for ours, theirs in names.items():
            for kind in ("weight", "bias"):
                mapped[f"transformer.h.{i}.{ours}.{kind}"] = state[f"decoder.blocks.{i}.{theirs}.{kind}"]
    missing, unexpected = nano.load_state_dict(mapped, strict=True)
    assert not missing and not unexpected


# -- the runs --------------------------------------------------------------------------------------
def settings(args) -> list[str]:
    return [f"train.task.path={json.dumps(str(args.data))}", f"train.steps={args.steps}",
            f"train.batch_size={args.batch}", f"train.eval_every={args.eval_every}",
            f"train.log_every={args.log_every}", f"train.eval_examples={args.eval_rows}",
            *(["model.dim=64", "model.ffn.hidden=256", "model.layers=2"] if args.quick else [])]


def run_nanogpt(model: GPT, config: TrainConfig, task, log_every: int, eval_every: int) -> dict:
    """nanoGPT's train.py step for step: set the lr, forward, backward, clip, step, zero_grad; the
    rows of seqzoo's stream, in its order; held-out loss on the same windows."""
    optimizer = model.configure_optimizers(config.weight_decay, config.lr, (config.beta1, config.beta2), "cpu")
    history, window, tokens = [], time.perf_counter(), 0
    model.train()
    for step in range(config.steps):
        lr = config.lr * lr_factor(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = task.batch(step * config.batch_size, config.batch_size)
        _, loss = model(batch["ids"], batch["labels"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += batch["ids"].numel()
        done = step + 1
        evaluate = done % eval_every == 0 or done == config.steps
        if done % log_every == 0 or evaluate:  # as seqzoo's trainer logs
            entry = {"step": done, "loss": loss.item(), "tokens_per_s": tokens / (time.perf_counter() - window)}
            if evaluate:
                entry["eval"] = {"loss": held_out(model, task, config)}
            history.append(entry)
            window, tokens = time.perf_counter(), 0
    return {"history": history}


@torch.no_grad()
def held_out(model: GPT, task, config: TrainConfig) -> float:
    model.eval()
    total, count = 0.0, 0
    for _, batch in task.held_out(config.eval_examples, config.batch_size):
        _, loss = model(batch["ids"], batch["labels"])
        total, count = total + loss.item() * batch["ids"].numel(), count + batch["ids"].numel()
    model.train()
    return total / count


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a folder from `seqzoo data prepare`")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--eval-rows", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="a 64-wide, 2-layer model (a smoke test)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    resolved = resolve(str(RECIPE), settings(args))
    config = instantiate_section(resolved.data["train"], TrainConfig)
    shards = read_manifest(args.data)
    vocab = shards["tokenizer"]["vocab_size"]
    if shards["tokenizer"]["spec"]["kind"] != "bytes":
        tokenizer = json.dumps({**shards["tokenizer"]["spec"], "path": str(Path(args.data) / "tokenizer.json")})
        resolved = resolve(str(RECIPE), [*settings(args), f"tokenizer={tokenizer}", f"model.vocab_size={vocab}"])
    torch.manual_seed(0)
    ours = instantiate(resolved, device="cpu")
    m = resolved.data["model"]
    nano = GPT(m["vocab_size"], m["max_seq_len"], m["layers"], m["attention"]["heads"], m["dim"])
    copy_weights(ours, nano)
    task = seqzoo.registry().create("task", config.task)
    task.bind(seqzoo.tokenizer(ours), m["vocab_size"], config.seed)

    print(f"seqzoo: {sum(p.numel() for p in ours.parameters()):,} parameters; training {config.steps} steps",
          file=sys.stderr)
    seqzoo_run = train(ours, config, seqzoo.tokenizer(ours), quiet=True)
    print("nanoGPT: the same weights, rows and learning rates", file=sys.stderr)
    nano_run = run_nanogpt(nano, config, task, args.log_every, args.eval_every)

    def speed(history: list[dict]) -> float:
        return statistics.median(h["tokens_per_s"] for h in history[1:] or history)

    points = []
    theirs = {h["step"]: h["eval"]["loss"] for h in nano_run["history"] if "eval" in h}
    for h in seqzoo_run.history:
        if "eval" in h and h["step"] in theirs:
            ours_loss, their_loss = h["eval"]["loss"], theirs[h["step"]]
            points.append({"step": h["step"], "seqzoo": ours_loss, "nanogpt": their_loss,
                           "relative": (ours_loss - their_loss) / their_loss})
    result = {"machine": machine(), "threads": torch.get_num_threads(), "steps": config.steps,
              "batch": config.batch_size, "seq_len": task.seq_len, "vocab": m["vocab_size"], "points": points,
              "seqzoo_tokens_per_s": speed(seqzoo_run.history), "nanogpt_tokens_per_s": speed(nano_run["history"])}
    result["speed_ratio"] = result["seqzoo_tokens_per_s"] / result["nanogpt_tokens_per_s"]
    result["worst_relative"] = max(abs(p["relative"]) for p in points)
    for p in points:
        print(f"step {p['step']:>5}: held-out loss seqzoo {p['seqzoo']:.4f}  nanoGPT {p['nanogpt']:.4f}  "
              f"({100 * p['relative']:+.2f}%)")
    print(f"tokens/s (median): seqzoo {result['seqzoo_tokens_per_s']:,.0f}  nanoGPT "
          f"{result['nanogpt_tokens_per_s']:,.0f}  ratio {result['speed_ratio']:.2f}x  "
          f"[{result['machine']['cpu']}, {result['threads']} threads]")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
