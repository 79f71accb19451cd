"""Checks of kind ``cell``: the sequence kernel equals the step loop (outputs, state, gradients),
padding, dtypes."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..registry import registry
from ._shared import (
    B,
    T,
    check_dtypes,
    gradcheck,
    spec,
    state_dict_round_trip,
)


def checks(name: str, params: dict) -> dict[str, Callable[[], None]]:
    """Recurrent cells: the whole-sequence ``forward`` equals a loop over ``step`` (outputs, final
    state and gradients), and padded rows equal the same rows alone."""
    inputs, hidden = 3, 6
    make = lambda: registry().create("cell", spec(name, params), inputs, hidden)  # noqa: E731
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
        check_dtypes(make, lambda c, dt: fold(*c(x.to(dt), lengths=lengths)))

    def gradients() -> None:
        cell = make().double()
        start = random_state(cell, B)
        short = torch.tensor([3, 2])

        def fn(xs: Tensor, *s: Tensor) -> Tensor:
            return fold(*cell(xs, s[0] if isinstance(start, Tensor) else type(start)(s), lengths=short))

        gradcheck(fn, x[:, :3], *parts(start))

    def state_dict() -> None:
        state_dict_round_trip(make, lambda c: fold(*c(x, lengths=lengths)))

    return {"shapes": shapes, "step_matches_sequence": step_matches_sequence,
            "lengths": padded_lengths, "dtypes": dtypes, "gradients": gradients,
            "state_dict": state_dict}
