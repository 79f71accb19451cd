"""What the checks of every kind share: small shapes, the dtypes tried, and the checks that apply to
any module (a state_dict round trip, dtypes, gradients) or to a whole decoder (cached decoding,
left padding, causality)."""
from __future__ import annotations

from collections.abc import Callable

import torch
from safetensors.torch import load, save
from torch import Tensor, nn

from ..io.build import build
from ..nn.generation import generate

B, H, K, T, D, C = 2, 4, 2, 5, 8, 32  # small shapes: batch, heads, kv heads, length, head dim, width
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class Skip(Exception):
    """Raised by a check that does not apply (e.g. a dtype the CPU cannot run)."""


def spec(name: str, params: dict) -> dict:
    return {"kind": name, **params}


def state_dict_round_trip(make: Callable[[], nn.Module], run: Callable[[nn.Module], Tensor]) -> None:
    """Weights copied through safetensors bytes into a fresh instance reproduce the output."""
    first, second = make(), make()
    for p in first.parameters():
        with torch.no_grad():
            p.add_(torch.randn_like(p) * 0.1)  # so a copy that silently failed would show
    state = {k: v.contiguous() for k, v in first.state_dict().items()}
    second.load_state_dict(load(save(state)) if state else {}, strict=True)
    torch.manual_seed(0)
    a = run(first.eval())
    torch.manual_seed(0)
    b = run(second.eval())
    if not torch.equal(a, b):
        raise AssertionError("a fresh instance loaded with the saved state_dict gives different outputs")


def check_dtypes(make: Callable[[], nn.Module], run: Callable[[nn.Module, torch.dtype], Tensor]) -> None:
    for dtype in DTYPES:
        module = make().to(dtype).eval()
        try:
            with torch.no_grad():
                out = run(module, dtype)
        except RuntimeError as error:  # a kernel the CPU lacks for this dtype
            if "not implemented" in str(error) and dtype != torch.float32:
                continue
            raise
        if out.dtype != dtype:
            raise AssertionError(f"{dtype} input gave a {out.dtype} output")
        if not torch.isfinite(out).all():
            raise AssertionError(f"non-finite output in {dtype}")


def gradcheck(fn: Callable[..., Tensor], *inputs: Tensor) -> None:
    inputs = tuple(x.detach().double().requires_grad_(x.is_floating_point()) for x in inputs)
    torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3)


def decoder(**model: object) -> nn.Module:
    """A two-layer float32 decoder LM on the CPU (GQA, RoPE unless overridden) for model-level checks."""
    recipe = {"kind": "decoder_lm", "vocab_size": 259, "dim": C, "layers": 2, "max_seq_len": 64,
              "attention": {"heads": H, "kv_heads": K}, "position": "rope", **model}
    return build({"model": recipe}, device="cpu", dtype="float32").eval()


def kv_cache_equivalence(model: nn.Module, length: int = 12) -> None:
    """Logits of token-by-token cached decoding equal the full forward; greedy output is identical."""
    ids = torch.randint(0, 256, (B, length))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(B, length)
        steps = [model(ids[:, :3], cache=cache)] + [model(ids[:, t:t + 1], cache=cache)
                                                     for t in range(3, length)]
    worst = (torch.cat(steps, dim=1) - full).abs().max().item()
    if worst > 1e-5:
        raise AssertionError(f"cached decoding differs from the full forward by {worst:.2e} (> 1e-5)")
    if not torch.equal(generate(model, ids[:, :4], 8), generate(model, ids[:, :4], 8, use_cache=False)):
        raise AssertionError("cached and uncached greedy generation differ")


def left_padding_equivalence(model: nn.Module) -> None:
    """A left-padded row gives what the same row gives alone, and cached generation with the
    padding mask equals uncached generation."""
    ids = torch.randint(0, 256, (B, 6))
    mask = torch.ones(B, 6, dtype=torch.long)
    mask[1, :2] = 0
    with torch.no_grad():
        padded = model(ids, attention_mask=mask)[1, -1]
        alone = model(ids[1:, 2:])[0, -1]
    worst = (padded - alone).abs().max().item()
    if worst > 1e-5:
        raise AssertionError(f"left padding changed a real token's logits by {worst:.2e}")
    if not torch.equal(generate(model, ids, 6, attention_mask=mask),
                       generate(model, ids, 6, attention_mask=mask, use_cache=False)):
        raise AssertionError("with left padding, cached and uncached greedy generation differ")


def causal_model(model: nn.Module) -> None:
    """Changing later tokens never changes earlier logits."""
    ids = torch.randint(0, 256, (B, 10))
    changed = ids.clone()
    changed[:, 6:] = (ids[:, 6:] + 7) % 256
    with torch.no_grad():
        if not torch.equal(model(ids)[:, :6], model(changed)[:, :6]):
            raise AssertionError("a later token changed an earlier token's logits")
