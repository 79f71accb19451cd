"""What the checks of every kind share: small shapes, the dtypes tried, and the checks that apply to
any module (a state_dict round trip, dtypes, gradients) or to a whole decoder (cached decoding,
left padding, beam search, static decoding, causality), which ``seqzoo.testing`` exports."""
from __future__ import annotations

from collections.abc import Callable

import torch
from safetensors.torch import load, save
from torch import Tensor, nn

from ..interfaces import Part
from ..io.build import build
from ..nn.generation import CausalSession, generate

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


def stacked_rows_add_up(module: nn.Module) -> None:
    """Every part's ``stacked_rows`` names a 2-D parameter of its own whose rows its blocks add up to."""
    for path, part in module.named_modules():
        if not isinstance(part, Part):
            continue
        for name, sizes in part.stacked_rows.items():
            try:
                weight = part.get_parameter(name)
            except AttributeError:
                weight = None
            if weight is None or weight.dim() != 2:
                raise AssertionError(f"{path or type(part).__name__}: stacked_rows names {name}, which is not a "
                                     f"matrix of its own")
            if sum(sizes) != weight.shape[0] or min(sizes) < 1:
                raise AssertionError(f"{path or type(part).__name__}: stacked_rows gives {name} blocks of "
                                     f"{list(sizes)} rows, and it has {weight.shape[0]}")


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


def kv_cache_equivalence(model: nn.Module, length: int = 12, *, prefill: int = 3, tolerance: float = 1e-5) -> None:
    """Logits of cached decoding (the first ``prefill`` tokens in one call, then one token at a
    time, ``length`` in all) equal the full forward's within ``tolerance``; greedy output with and
    without the cache is identical. A long ``prefill`` takes a recurrent mixer's chunked form
    through several chunks before its decode step goes on from the state it left."""
    ids = torch.randint(0, 256, (B, length))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(B, length)
        steps = [model(ids[:, :prefill], cache=cache)] + [model(ids[:, t:t + 1], cache=cache)
                                                           for t in range(prefill, length)]
    worst = (torch.cat(steps, dim=1) - full).abs().max().item()
    if not worst <= tolerance:  # NaN fails too
        raise AssertionError(f"cached decoding differs from the full forward by {worst:.2e} (> {tolerance:.0e})")
    if not torch.equal(generate(model, ids[:, :4], 8), generate(model, ids[:, :4], 8, use_cache=False)):
        raise AssertionError("cached and uncached greedy generation differ")


def left_padding_equivalence(model: nn.Module, length: int = 6, pad: int = 2, new_tokens: int = 6) -> None:
    """A row left-padded by ``pad`` of ``length`` tokens gives the last logits the same row gives
    alone; greedy generation of ``new_tokens`` with the padding mask is the same cached and
    uncached, and the padded row's continuation is the row's continuation alone."""
    ids = torch.randint(0, 256, (B, length))
    mask = torch.ones(B, length, dtype=torch.long)
    mask[1, :pad] = 0
    with torch.no_grad():
        padded = model(ids, attention_mask=mask)[1, -1]
        alone = model(ids[1:, pad:])[0, -1]
    worst = (padded - alone).abs().max().item()
    if not worst <= 1e-5:
        raise AssertionError(f"left padding changed a real token's logits by {worst:.2e}")
    batched = generate(model, ids, new_tokens, attention_mask=mask, eos_id=None)
    if not torch.equal(batched, generate(model, ids, new_tokens, attention_mask=mask, eos_id=None, use_cache=False)):
        raise AssertionError("with left padding, cached and uncached greedy generation differ")
    if not torch.equal(batched[1, pad:], generate(model, ids[1:, pad:], new_tokens, eos_id=None)[0]):
        raise AssertionError("a left-padded row generates other tokens than the same row alone")


def beam_search_equivalence(model: nn.Module, prompt: int = 6, new_tokens: int = 10, beam_size: int = 3) -> None:
    """Beam search over one prompt gives the same tokens with the cache as without it: the beams
    swap places every step, so the cache's states must follow their rows (``MixerState.reorder``)."""
    ids = torch.randint(3, 256, (1, prompt))
    cached = generate(model, ids, new_tokens, beam_size=beam_size, eos_id=None)
    if not torch.equal(cached, generate(model, ids, new_tokens, beam_size=beam_size, eos_id=None, use_cache=False)):
        raise AssertionError("beam search with the cache differs from beam search without it")


def greedy_logits(model: nn.Module, ids: Tensor, steps: int, mask: Tensor | None = None,
                  **options: object) -> tuple[Tensor, CausalSession]:
    """Greedy decoding of ``steps`` tokens step by step through a ``CausalSession`` (``options``:
    ``static``, ``compile``) -> (the logits of every step (B, steps, V), the session)."""
    session = CausalSession(model, ids, steps, True, mask, **options)
    token, logits = None, []
    for _ in range(steps):
        logits.append(session.next(token))
        token = logits[-1].argmax(-1)
    return torch.stack(logits, 1), session


def static_cache_equivalence(model: nn.Module, steps: int = 12) -> None:
    """The fixed-shape steps ``generate(compile=True)`` traces (a static cache) give the logits of
    the growing cache within 1e-5, over 3 rows of 6 tokens, the first left-padded by 3."""
    ids, mask = torch.randint(1, 256, (3, 6)), torch.ones(3, 6, dtype=torch.long)
    mask[0, :3] = 0
    with torch.inference_mode():
        growing, _ = greedy_logits(model, ids, steps, mask)
        static, _ = greedy_logits(model, ids, steps, mask, static=True)
    torch.testing.assert_close(static, growing, atol=1e-5, rtol=1e-5)


def causal_model(model: nn.Module) -> None:
    """Changing later tokens never changes earlier logits."""
    ids = torch.randint(0, 256, (B, 10))
    changed = ids.clone()
    changed[:, 6:] = (ids[:, 6:] + 7) % 256
    with torch.no_grad():
        if not torch.equal(model(ids)[:, :6], model(changed)[:, :6]):
            raise AssertionError("a later token changed an earlier token's logits")
