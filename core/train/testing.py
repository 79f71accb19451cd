"""The conformance kit: the contract every component of a kind must honour, as named checks.

    from seqzoo.train.testing import check_component
    for result in check_component("score", "additive", hidden=16):
        print(result)

The project's own contract tests (``tests/contract``) and third-party plugin packages run the same
checks. A component may set ``example_params`` (a dict) to the recipe parameters the kit should
use when none are given (e.g. a required ``factor``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from safetensors.torch import load, save
from torch import Tensor, nn

from ..interfaces import expand_kv, masked_softmax_attend
from ..io.build import build
from ..nn.attention import self_attention_inputs
from ..nn.cache import KVCache
from ..nn.generation import generate
from ..registry import own_doc, registry

B, H, K, T, D, C = 2, 4, 2, 5, 8, 32  # small shapes: batch, heads, kv heads, length, head dim, width
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class CheckResult:
    """One named check of one component: passed, failed (with why) or skipped (with why); or a
    warning (``component_warnings``), which says what to improve but does not fail."""

    kind: str
    name: str
    check: str
    status: str  # "passed" | "failed" | "skipped" | "warned"
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status != "failed"

    def __str__(self) -> str:
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.status.upper():7} {self.kind}/{self.name} {self.check}{detail}"


class Skip(Exception):
    """Raised by a check that does not apply (e.g. a dtype the CPU cannot run)."""


def example_params(kind: str, name: str) -> dict:
    return dict(getattr(registry().get(kind, name).cls, "example_params", {}) or {})


def _spec(name: str, params: dict) -> dict:
    return {"kind": name, **params}


# -- shared checks -----------------------------------------------------------------------------------
def _state_dict_round_trip(make: Callable[[], nn.Module], run: Callable[[nn.Module], Tensor]) -> None:
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


def _dtypes(make: Callable[[], nn.Module], run: Callable[[nn.Module, torch.dtype], Tensor]) -> None:
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


def _gradcheck(fn: Callable[..., Tensor], *inputs: Tensor) -> None:
    inputs = tuple(x.detach().double().requires_grad_(x.is_floating_point()) for x in inputs)
    torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3)


def _decoder(**model: object) -> nn.Module:
    """A two-layer float32 decoder LM on the CPU (GQA, RoPE unless overridden) for model-level checks."""
    recipe = {"kind": "decoder_lm", "vocab_size": 259, "dim": C, "layers": 2, "max_seq_len": 64,
              "attention": {"heads": H, "kv_heads": K}, "position": "rope", **model}
    return build({"model": recipe}, device="cpu", dtype="float32").eval()


def _kv_cache_equivalence(model: nn.Module, length: int = 12) -> None:
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


def _left_padding(model: nn.Module) -> None:
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


def _causal_model(model: nn.Module) -> None:
    """Changing later tokens never changes earlier logits."""
    ids = torch.randint(0, 256, (B, 10))
    changed = ids.clone()
    changed[:, 6:] = (ids[:, 6:] + 7) % 256
    with torch.no_grad():
        if not torch.equal(model(ids)[:, :6], model(changed)[:, :6]):
            raise AssertionError("a later token changed an earlier token's logits")


# -- per-kind checks ---------------------------------------------------------------------------------
def _score_checks(name: str, params: dict) -> dict[str, Callable[[], None]]:
    make = lambda: registry().create("score", _spec(name, params), D, D, H)  # noqa: E731
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, K, T + 2, D), torch.randn(B, K, T + 2, D)
    mask = torch.rand(B, 1, T, T + 2) > 0.3

    def shapes() -> None:
        out = make().attend(q, k, v, mask=mask)
        if out.shape != (B, H, T, D):
            raise AssertionError(f"attend gave {tuple(out.shape)}, expected {(B, H, T, D)}")
        logits = make().scores(q, expand_kv(k, H))
        if logits.shape != (B, H, T, T + 2):
            raise AssertionError(f"scores gave {tuple(logits.shape)}, expected {(B, H, T, T + 2)}")

    def attend_matches_scores() -> None:
        score = make().eval()
        if score.normalization != "softmax":
            raise Skip(f"weights are a {score.normalization} of the scores, not a softmax")
        with torch.no_grad():
            fused = score.attend(q, k, v, mask=mask)
            plain = masked_softmax_attend(score.scores(q, expand_kv(k, H)), expand_kv(v, H), mask=mask)
        worst = (fused - plain).abs().max().item()
        if worst > 1e-5:
            raise AssertionError(f"attend differs from softmax(scores) @ v by {worst:.2e}")

    def causal_attend() -> None:
        score = make().eval()
        kk, vv = torch.randn(B, K, T, D), torch.randn(B, K, T, D)
        k2, v2 = kk.clone(), vv.clone()
        k2[:, :, -1] += 1.0
        v2[:, :, -1] += 1.0
        with torch.no_grad():
            a = score.attend(q, kk, vv, causal=True)
            b = score.attend(q, k2, v2, causal=True)
        if not torch.allclose(a[:, :, :-1], b[:, :, :-1], atol=1e-6):
            raise AssertionError("with causal=True a later key changed an earlier query's output")

    def masked_rows_are_zero() -> None:
        dead = mask.clone()
        dead[:, :, 1] = False
        out = make().attend(q, k, v, mask=dead)
        if out.isnan().any() or out[:, :, 1].abs().max() != 0:
            raise AssertionError("a query that sees no key must give zeros, not NaN or noise")

    def dtypes() -> None:
        _dtypes(make, lambda s, dt: s.attend(q.to(dt), k.to(dt), v.to(dt), mask=mask))

    def gradients() -> None:
        score = make().double()
        _gradcheck(lambda a, b, c: score.attend(a, b, c, causal=True), q[:1, :, :3], k[:1, :, :3], v[:1, :, :3])

    def state_dict() -> None:
        _state_dict_round_trip(make, lambda s: s.attend(q, k, v, mask=mask))

    def kv_cache() -> None:
        model = _decoder(attention={"heads": H, "kv_heads": K, "score": _spec(name, params)})
        _causal_model(model)
        _kv_cache_equivalence(model)
        _left_padding(model)

    return {"shapes": shapes, "attend_matches_scores": attend_matches_scores,
            "causal_attend": causal_attend, "masked_rows_are_zero": masked_rows_are_zero,
            "dtypes": dtypes, "gradients": gradients, "state_dict": state_dict,
            "causality_kv_cache_padding": kv_cache}


def _position_checks(name: str, params: dict) -> dict[str, Callable[[], None]]:
    make = lambda: registry().create("position", _spec(name, params), C, D, H, 64)  # noqa: E731
    x, q, k = torch.randn(B, T, C), torch.randn(B, H, T, D), torch.randn(B, K, T, D)
    pos = torch.arange(3, 3 + T)[None]

    def run(scheme: nn.Module, dtype: torch.dtype = torch.float32) -> Tensor:
        """All three hooks, folded into one tensor so every check sees each of them."""
        xe = scheme.embed(x.to(dtype), pos)
        qr, kr = scheme.rotate(q.to(dtype), k.to(dtype), pos, pos)
        bias = scheme.bias(qr, pos, pos)
        out = [xe.flatten(), qr.flatten(), kr.flatten()]
        if bias is not None:
            out.append(bias.flatten().to(dtype))
        return torch.cat(out)

    def shapes() -> None:
        scheme = make()
        if scheme.embed(x, pos).shape != x.shape:
            raise AssertionError("embed must keep (B, T, C)")
        qr, kr = scheme.rotate(q, k, pos, pos)
        if qr.shape != q.shape or kr.shape != k.shape:
            raise AssertionError("rotate must keep the q and k shapes")
        bias = scheme.bias(qr, pos, pos)
        if bias is not None and (bias.dim() != 4 or bias.shape[-2:] != (T, T) or bias.shape[1] not in (1, H)):
            raise AssertionError(f"bias has shape {tuple(bias.shape)}, expected (B|1, H|1, T, S)")

    def per_row_positions() -> None:
        scheme = make().eval()
        rows = torch.stack([torch.arange(T), torch.arange(2, 2 + T)])  # (B, T), a different offset per row
        with torch.no_grad():
            both = scheme.embed(x, rows), *scheme.rotate(q, k, rows, rows)
            one = scheme.embed(x[1:], rows[1:]), *scheme.rotate(q[1:], k[1:], rows[1:], rows[1:])
        for a, b in zip(both, one):
            if not torch.allclose(a[1:], b, atol=1e-6):
                raise AssertionError("(B, T) positions are not applied per row")

    def dtypes() -> None:
        _dtypes(make, run)

    def gradients() -> None:
        scheme = make().double()

        def fn(xx: Tensor, qq: Tensor, kk: Tensor) -> Tensor:
            qr, kr = scheme.rotate(qq, kk, pos[:, :3], pos[:, :3])
            bias = scheme.bias(qr, pos[:, :3], pos[:, :3])
            total = scheme.embed(xx, pos[:, :3]).sum() + qr.sum() * 0.5 + kr.pow(2).sum()
            return total + (bias.sum() if bias is not None else 0)

        _gradcheck(fn, x[:1, :3], q[:1, :, :3], k[:1, :, :3])

    def state_dict() -> None:
        _state_dict_round_trip(make, run)

    def kv_cache() -> None:
        model = _decoder(position=_spec(name, params))
        _causal_model(model)
        _kv_cache_equivalence(model)
        _left_padding(model)
        # post-norm, sliding window and MQA through the same scheme
        _kv_cache_equivalence(_decoder(position=_spec(name, params), placement="post",
                                       attention={"heads": H, "kv_heads": 1, "window": 4}))

    return {"shapes": shapes, "per_row_positions": per_row_positions, "dtypes": dtypes,
            "gradients": gradients, "state_dict": state_dict, "causality_kv_cache_padding": kv_cache}


def _rope_scaling_checks(name: str, params: dict) -> dict[str, Callable[[], None]]:
    make = lambda: registry().create("rope_scaling", _spec(name, params))  # noqa: E731

    def frequencies() -> None:
        inv_freq = 1.0 / 10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
        for length in (8, 64, 200):
            scaled, factor = make().frequencies(inv_freq, rotary_dim=D, base=10000.0, max_seq_len=64,
                                                positions=torch.arange(length)[None])
            if scaled.shape != inv_freq.shape or scaled.dtype != inv_freq.dtype:
                raise AssertionError(f"frequencies gave {tuple(scaled.shape)} {scaled.dtype}, "
                                     f"expected {tuple(inv_freq.shape)} {inv_freq.dtype}")
            if not (torch.isfinite(scaled).all() and (scaled > 0).all() and float(factor) > 0):
                raise AssertionError("frequencies and attention factor must be positive and finite")

    def kv_cache() -> None:
        # Within the model's max_seq_len (64) every rule is fixed, so the cache must agree.
        model = _decoder(position={"kind": "rope", "scaling": _spec(name, params)})
        _causal_model(model)
        _kv_cache_equivalence(model)

    return {"frequencies": frequencies, "causality_and_kv_cache": kv_cache}


def _module_checks(kind: str, name: str, params: dict) -> dict[str, Callable[[], None]]:
    """norm, ffn and activation: (..., C) -> (..., C) modules."""
    if kind == "activation":
        make = lambda: registry().create("activation", _spec(name, params))  # noqa: E731
    else:
        make = lambda: registry().create(kind, _spec(name, params), C)  # noqa: E731
    x = torch.randn(B, T, C)

    def shapes() -> None:
        if make()(x).shape != x.shape:
            raise AssertionError(f"output shape differs from the input's {tuple(x.shape)}")

    def dtypes() -> None:
        _dtypes(make, lambda m, dt: m(x.to(dt)))

    def gradients() -> None:
        module = make().double()
        _gradcheck(module, x[:1, :2])

    def state_dict() -> None:
        _state_dict_round_trip(make, lambda m: m(x))

    return {"shapes": shapes, "dtypes": dtypes, "gradients": gradients, "state_dict": state_dict}


def _router_checks(name: str, params: dict) -> dict[str, Callable[[], None]]:
    """Routers: k distinct experts per token in range, finite non-negative float32 weights, rows of
    ``probs`` that sum to 1, weights differentiable in x and the router's parameters."""
    experts, top_k = 6, 2
    make = lambda: registry().create("router", _spec(name, params), C, experts, top_k)  # noqa: E731
    x = torch.randn(B * T, C)

    def shapes() -> None:
        routing = make()(x)
        chosen = routing.experts
        if chosen.shape != (B * T, top_k) or routing.weights.shape != (B * T, top_k):
            raise AssertionError(f"experts {tuple(chosen.shape)} / weights {tuple(routing.weights.shape)}, "
                                 f"expected {(B * T, top_k)}")
        if chosen.dtype != torch.int64 or chosen.min() < 0 or chosen.max() >= experts:
            raise AssertionError("experts must be int64 indices in [0, E)")
        if (chosen.sort(-1).values.diff(dim=-1) == 0).any():
            raise AssertionError("a token chose the same expert twice")
        if routing.logits.shape != (B * T, experts) or routing.probs.shape != (B * T, experts):
            raise AssertionError("logits and probs must be (N, E)")
        if not torch.allclose(routing.probs.sum(-1), torch.ones(B * T)):
            raise AssertionError("probs rows must sum to 1")
        if not torch.isfinite(routing.weights).all() or (routing.weights < 0).any():
            raise AssertionError("weights must be finite and non-negative")

    def dtypes() -> None:
        for dtype in (torch.bfloat16, torch.float16):
            routing = make().to(dtype)(x.to(dtype))
            if routing.weights.dtype != torch.float32 or routing.logits.dtype != torch.float32:
                raise AssertionError(f"{dtype} input: weights and logits must be float32 (routing in float32)")

    def gradients() -> None:
        router = make().double()
        chosen = router(x.double()).experts
        # with the choice fixed (a small step of gradcheck does not flip a top-k of random logits),
        # the weights are a smooth function of x and of every parameter
        def weights(inputs: Tensor) -> Tensor:
            routing = router(inputs)
            if not torch.equal(routing.experts, chosen):
                raise Skip("the choice flipped under gradcheck's step")
            return routing.weights
        _gradcheck(weights, x)
        router(x.double()).weights.sum().backward()
        if any(p.grad is None for p in router.parameters()):
            raise AssertionError("a router parameter gets no gradient through the weights")

    def state_dict() -> None:
        _state_dict_round_trip(make, lambda m: m(x).weights)

    return {"shapes": shapes, "dtypes": dtypes, "gradients": gradients, "state_dict": state_dict}


def _cell_checks(name: str, params: dict) -> dict[str, Callable[[], None]]:
    """Recurrent cells: the whole-sequence ``forward`` equals a loop over ``step`` (outputs, final
    state and gradients), and padded rows equal the same rows alone."""
    inputs, hidden = 3, 6
    make = lambda: registry().create("cell", _spec(name, params), inputs, hidden)  # noqa: E731
    x = torch.randn(B, T, inputs)
    lengths = torch.tensor([T, T - 2])

    def parts(state) -> tuple[Tensor, ...]:
        return (state,) if isinstance(state, Tensor) else tuple(state)

    def fold(out: Tensor, state) -> Tensor:
        return torch.cat([out.flatten(), *(p.flatten() for p in parts(state))])

    def random_state(cell: nn.Module, batch: int):
        state = cell.initial_state(batch, x.device, x.dtype)
        noisy = tuple(torch.randn_like(p) * 0.5 for p in parts(state))
        return noisy[0] if isinstance(state, Tensor) else type(state)(noisy)

    def step_loop(cell: nn.Module, xs: Tensor, state) -> tuple[Tensor, object]:
        outputs = []
        for t in range(xs.shape[1]):
            h_t, state = cell.step(xs[:, t], state)
            outputs.append(h_t)
        return torch.stack(outputs, dim=1), state

    def worst(a: Tensor, b: Tensor) -> float:
        return ((a - b).abs().max() / (1.0 + b.abs().max())).item()

    def shapes() -> None:
        cell = make()
        out, state = cell(x)
        if out.shape != (B, T, hidden):
            raise AssertionError(f"forward gave outputs {tuple(out.shape)}, expected {(B, T, hidden)}")
        h_t, stepped = cell.step(x[:, 0], cell.initial_state(B, x.device, x.dtype))
        if h_t.shape != (B, hidden):
            raise AssertionError(f"step gave h_t {tuple(h_t.shape)}, expected {(B, hidden)}")
        for what, st in (("forward", state), ("step", stepped), ("initial_state", cell.initial_state(B))):
            shapes_ = [tuple(p.shape) for p in parts(st)]
            if any(s != (B, hidden) for s in shapes_):
                raise AssertionError(f"{what} gave a state of shapes {shapes_}, expected each {(B, hidden)}")

    def step_matches_sequence() -> None:
        cell = make().eval()
        start = random_state(cell, B)
        runs = []
        for run in (lambda xs, s: cell(xs, s), lambda xs, s: step_loop(cell, xs, s)):
            xs = x.clone().requires_grad_()
            s = tuple(p.clone().requires_grad_() for p in parts(start))
            out, final = run(xs, s[0] if isinstance(start, Tensor) else type(start)(s))
            folded = fold(out, final)
            leaves = [xs, *s, *cell.parameters()]
            weights = torch.linspace(-1.0, 1.0, folded.numel())  # an asymmetric loss
            grads = torch.autograd.grad((folded * weights).sum(), leaves, allow_unused=True)
            runs.append((folded.detach(), [g if g is not None else torch.zeros_like(p)
                                           for g, p in zip(grads, leaves)]))
        (fused, fused_grads), (looped, looped_grads) = runs
        if worst(fused, looped) > 1e-5:
            raise AssertionError(f"forward differs from the step loop by {worst(fused, looped):.2e} "
                                 f"(outputs and final state, float32)")
        names = ["x", *(f"state[{i}]" for i in range(len(parts(start)))),
                 *(n for n, _ in cell.named_parameters())]
        for what, a, b in zip(names, fused_grads, looped_grads):
            if worst(a, b) > 1e-4:
                raise AssertionError(f"the gradient for {what} through forward differs from the step "
                                     f"loop's by {worst(a, b):.2e}")

    def padded_lengths() -> None:
        cell = make().eval()
        junk = x.clone()
        junk[1, T - 2:] = 1e3  # padding that would show if it leaked into a real position
        with torch.no_grad():
            out, state = cell(junk, lengths=lengths)
            alone, alone_state = cell(x[1:, :T - 2])
            full, full_state = cell(x[:1])
        checks = [("the padded row's outputs", out[1, :T - 2], alone[0]),
                  ("the full row's outputs", out[0], full[0])]
        checks += [(f"the padded row's final state[{i}]", a[1], b[0])
                   for i, (a, b) in enumerate(zip(parts(state), parts(alone_state)))]
        checks += [(f"the full row's final state[{i}]", a[0], b[0])
                   for i, (a, b) in enumerate(zip(parts(state), parts(full_state)))]
        for what, a, b in checks:
            if worst(a, b) > 1e-5:
                raise AssertionError(f"with lengths, {what} differ from the row run alone "
                                     f"by {worst(a, b):.2e}")
        if out[1, T - 2:].abs().max() != 0:
            raise AssertionError("outputs at padded positions must be zeros")

    def dtypes() -> None:
        _dtypes(make, lambda c, dt: fold(*c(x.to(dt), lengths=lengths)))

    def gradients() -> None:
        cell = make().double()
        start = random_state(cell, B)
        short = torch.tensor([3, 2])

        def fn(xs: Tensor, *s: Tensor) -> Tensor:
            return fold(*cell(xs, s[0] if isinstance(start, Tensor) else type(start)(s), lengths=short))

        _gradcheck(fn, x[:, :3], *parts(start))

    def state_dict() -> None:
        _state_dict_round_trip(make, lambda c: fold(*c(x, lengths=lengths)))

    return {"shapes": shapes, "step_matches_sequence": step_matches_sequence,
            "lengths": padded_lengths, "dtypes": dtypes, "gradients": gradients,
            "state_dict": state_dict}


def _mixer_checks(name: str, params: dict) -> dict[str, Callable[[], None]]:
    """Token mixers: (B, T, C) -> (B, T, C), causal, and decoding piece by piece through their
    state (left-padded rows included, rows reordered midway) equal to the full forward."""
    make = lambda: registry().create("mixer", _spec(name, params), C)  # noqa: E731
    position = registry().create("position", "none", C, D, H, 64)
    length = 9
    x = torch.randn(B, length, C)

    def full(mixer: nn.Module, inputs: Tensor, padding: Tensor | None = None) -> Tensor:
        q_pos = torch.arange(inputs.shape[1])[None]
        return mixer(inputs, self_attention_inputs(position, q_pos, causal=True, key_padding=padding))

    def pieces(mixer: nn.Module, inputs: Tensor, padding: Tensor | None = None,
               reorder_at: int | None = None) -> tuple[Tensor, Tensor]:
        """The first 3 tokens, then one at a time, through a decode state -> (outputs, row order)."""
        cache = KVCache([mixer.new_state(inputs.shape[0], inputs.shape[1], dtype=inputs.dtype)],
                        inputs.shape[0], inputs.shape[1])
        rows = torch.arange(inputs.shape[0])
        outs = []
        for start, end in [(0, 3), *((t, t + 1) for t in range(3, inputs.shape[1]))]:
            if reorder_at == start:  # as beam search does: the state's rows change places
                perm = torch.arange(inputs.shape[0]).flip(0)
                cache.reorder(perm)
                rows, outs = rows[perm], [o[perm] for o in outs]
            seen = padding[rows, :end] if padding is not None else None
            q_pos = torch.arange(start, end)[None]
            context = self_attention_inputs(position, q_pos, causal=True, cache=cache, key_padding=seen)
            outs.append(mixer(inputs[rows, start:end], context, cache.states[0]))
            cache.advance(q_pos)
        return torch.cat(outs, dim=1), rows

    def shapes() -> None:
        with torch.no_grad():
            out = full(make().eval(), x)
        if out.shape != x.shape:
            raise AssertionError(f"output shape {tuple(out.shape)} differs from the input's {tuple(x.shape)}")

    def causality() -> None:
        mixer = make().eval()
        changed = x.clone()
        changed[:, 6:] = torch.randn(B, length - 6, C)
        with torch.no_grad():
            worst = (full(mixer, x)[:, :6] - full(mixer, changed)[:, :6]).abs().max().item()
        if worst > 0:
            raise AssertionError(f"a later token changed an earlier output by {worst:.2e}")

    def decode_steps() -> None:
        mixer = make().eval()
        with torch.no_grad():
            worst = (pieces(mixer, x)[0] - full(mixer, x)).abs().max().item()
        if worst > 1e-5:
            raise AssertionError(f"decoding through the state differs from the full forward by {worst:.2e}")

    def left_padding() -> None:
        mixer = make().eval()
        padding = torch.ones(B, length, dtype=torch.long)
        padding[1, :2] = 0
        with torch.no_grad():
            alone = full(mixer, x[1:, 2:])[0]
            padded = full(mixer, x, padding)[1, 2:]
            stepped = pieces(mixer, x, padding)[0][1, 2:]
        worst = max((padded - alone).abs().max().item(), (stepped - alone).abs().max().item())
        if worst > 1e-5:
            raise AssertionError(f"left padding changed a real token's output by {worst:.2e}")

    def state_reorder() -> None:
        mixer = make().eval()
        with torch.no_grad():
            out, rows = pieces(mixer, x, reorder_at=5)
            worst = (out - full(mixer, x[rows])).abs().max().item()
        if worst > 1e-5:
            raise AssertionError(f"after reordering the state's rows, decoding differs by {worst:.2e}")

    def dtypes() -> None:
        _dtypes(make, lambda m, dt: full(m, x.to(dt)))

    def gradients() -> None:
        mixer = make().double()
        _gradcheck(lambda inputs: full(mixer, inputs), x[:1, :3])

    def state_dict() -> None:
        _state_dict_round_trip(make, lambda m: full(m, x))

    return {"shapes": shapes, "causality": causality, "decode_steps": decode_steps, "left_padding": left_padding,
            "state_reorder": state_reorder, "dtypes": dtypes, "gradients": gradients, "state_dict": state_dict}


def checks_for(kind: str, name: str, params: dict | None = None) -> dict[str, Callable[[], None]]:
    """The named checks of one component (built with ``params`` or its ``example_params``)."""
    params = example_params(kind, name) if params is None else params
    if kind == "score":
        return _score_checks(name, params)
    if kind == "position":
        return _position_checks(name, params)
    if kind == "rope_scaling":
        return _rope_scaling_checks(name, params)
    if kind in ("norm", "ffn", "activation"):
        return _module_checks(kind, name, params)
    if kind == "cell":
        return _cell_checks(name, params)
    if kind == "mixer":
        return _mixer_checks(name, params)
    if kind == "router":
        return _router_checks(name, params)
    return {}


CHECKED_KINDS = ("score", "position", "rope_scaling", "norm", "ffn", "activation", "cell", "mixer", "router")


def check_component(kind: str, name: str, **params: object) -> list[CheckResult]:
    """Run every contract check for ``kind/name`` and report each by name."""
    component = registry().get(kind, name)
    results = []
    for check, fn in checks_for(kind, component.name, params or None).items():
        torch.manual_seed(0)
        try:
            fn()
        except Skip as why:
            results.append(CheckResult(kind, component.name, check, "skipped", str(why)))
        except Exception as error:  # a contract failure of any sort is reported, not raised
            text = str(error).strip().splitlines()
            detail = f"{type(error).__name__}: {text[0] if text else ''}"
            results.append(CheckResult(kind, component.name, check, "failed", detail))
        else:
            results.append(CheckResult(kind, component.name, check, "passed"))
    return results


def component_warnings(kind: str, name: str) -> list[CheckResult]:
    """What ``kind/name`` should improve without breaking its contract, as "warned" results.

    Kept out of ``check_component``, whose results are the contract itself (suites compare them
    check by check); ``seqzoo check`` prints both. Today: a class without a docstring of its own,
    which leaves ``seqzoo list`` without a summary (an inherited docstring describes the
    interface, not the component, so it does not count).
    """
    component = registry().get(kind, name)
    if own_doc(component.cls):
        return []
    unlisted = "" if component.summary else "; `seqzoo list` shows no summary for it"
    return [CheckResult(kind, component.name, "docstring", "warned",
                        f"{component.cls.__name__} has no docstring of its own{unlisted}; add one "
                        f"saying what it computes, its parameters and the paper")]


def component_cases(kind: str) -> list[tuple[str, str]]:
    """(name, check) pairs for every registered component of ``kind``."""
    return [(c.name, check) for c in registry().list(kind) for check in checks_for(kind, c.name)]


def parametrize_components(kind: str):
    """``@parametrize_components("score")`` on ``def test_x(name, check)`` runs every check of every
    registered score as its own test case; the test body can call ``run_check(kind, name, check)``."""
    import pytest

    cases = component_cases(kind)
    return pytest.mark.parametrize("name, check", cases, ids=[f"{n}-{c}" for n, c in cases])


def run_check(kind: str, name: str, check: str) -> None:
    """Run one named check; raise AssertionError with the reason if it fails."""
    torch.manual_seed(0)
    try:
        checks_for(kind, name)[check]()
    except Skip:
        import pytest

        pytest.skip(f"{kind}/{name} {check} does not apply")


