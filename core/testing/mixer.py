"""Checks of kind ``mixer``: shapes, causality, step-by-step decoding, left padding, reordered
rows, dtypes, gradients; and ``matches_reference``, which checks a recurrent mixer against its
plain recurrence in ``seqzoo.reference``."""
from __future__ import annotations

import copy
from collections.abc import Callable
from types import FunctionType

import torch
from torch import Tensor, nn

from ..interfaces import Mixer, MixerContext
from ..nn.attention import self_attention_inputs
from ..nn.cache import DecodeCache
from ..registry import registry
from ._shared import (
    B,
    C,
    D,
    H,
    check_dtypes,
    gradcheck,
    spec,
    state_dict_round_trip,
)


def _context(q_pos: Tensor, **inputs: object) -> MixerContext:
    """A causal self-attention context for the tokens at ``q_pos``, with no position scheme."""
    position = registry().create("position", "none", C, D, H, 64)
    return self_attention_inputs(position, q_pos, causal=True, **inputs)


def _full(mixer: nn.Module, inputs: Tensor, padding: Tensor | None = None) -> Tensor:
    """The whole sequence in one forward, without a state."""
    return mixer(inputs, _context(torch.arange(inputs.shape[1])[None], key_padding=padding))


def _pieces(mixer: nn.Module, inputs: Tensor, padding: Tensor | None = None,
            reorder_at: int | None = None) -> tuple[Tensor, Tensor]:
    """The first 3 tokens, then one at a time, through a decode state -> (outputs, row order)."""
    cache = DecodeCache([mixer.new_state(inputs.shape[0], inputs.shape[1], dtype=inputs.dtype)],
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
        outs.append(mixer(inputs[rows, start:end], _context(q_pos, cache=cache, key_padding=seen), cache.states[0]))
        cache.advance(q_pos)
    return torch.cat(outs, dim=1), rows


def checks(name: str, params: dict) -> dict[str, Callable[[], None]]:
    """Token mixers: (B, T, C) -> (B, T, C), causal, and decoding piece by piece through their
    state (left-padded rows included, rows reordered midway) equal to the full forward."""
    make = lambda: registry().create("mixer", spec(name, params), C)  # noqa: E731
    length = 9
    x = torch.randn(B, length, C)

    def shapes() -> None:
        with torch.no_grad():
            out = _full(make().eval(), x)
        if out.shape != x.shape:
            raise AssertionError(f"output shape {tuple(out.shape)} differs from the input's {tuple(x.shape)}")

    def causality() -> None:
        mixer = make().eval()
        changed = x.clone()
        changed[:, 6:] = torch.randn(B, length - 6, C)
        with torch.no_grad():
            worst = (_full(mixer, x)[:, :6] - _full(mixer, changed)[:, :6]).abs().max().item()
        if worst > 0:
            raise AssertionError(f"a later token changed an earlier output by {worst:.2e}")

    def decode_steps() -> None:
        mixer = make().eval()
        with torch.no_grad():
            worst = (_pieces(mixer, x)[0] - _full(mixer, x)).abs().max().item()
        if worst > 1e-5:
            raise AssertionError(f"decoding through the state differs from the full forward by {worst:.2e}")

    def left_padding() -> None:
        mixer = make().eval()
        padding = torch.ones(B, length, dtype=torch.long)
        padding[1, :2] = 0
        with torch.no_grad():
            alone = _full(mixer, x[1:, 2:])[0]
            padded = _full(mixer, x, padding)[1, 2:]
            stepped = _pieces(mixer, x, padding)[0][1, 2:]
        worst = max((padded - alone).abs().max().item(), (stepped - alone).abs().max().item())
        if worst > 1e-5:
            raise AssertionError(f"left padding changed a real token's output by {worst:.2e}")

    def state_reorder() -> None:
        mixer = make().eval()
        with torch.no_grad():
            out, rows = _pieces(mixer, x, reorder_at=5)
            worst = (out - _full(mixer, x[rows])).abs().max().item()
        if worst > 1e-5:
            raise AssertionError(f"after reordering the state's rows, decoding differs by {worst:.2e}")

    def dtypes() -> None:
        check_dtypes(make, lambda m, dt: _full(m, x.to(dt)))

    def gradients() -> None:
        mixer = make().double()
        gradcheck(lambda inputs: _full(mixer, inputs), x[:1, :3])

    def state_dict() -> None:
        state_dict_round_trip(make, lambda m: _full(m, x))

    return {"shapes": shapes, "causality": causality, "decode_steps": decode_steps, "left_padding": left_padding,
            "state_reorder": state_reorder, "dtypes": dtypes, "gradients": gradients, "state_dict": state_dict}


Reference = Callable[..., tuple[Tensor, object]]  # a recurrence of seqzoo.reference: (outputs, final state)


def matches_reference(mixer: Mixer, reference: Reference, adapter: Callable[[Mixer, Tensor, Reference], Tensor],
                      *, batch: int = 2, length: int = 11, tolerance: float = 1e-9, seed: int = 0) -> None:
    """Check a token mixer against a recurrence of ``seqzoo.reference``: in float64, on random input
    x (B, T, C), its whole-sequence forward and its decoding through ``new_state`` (3 tokens, then
    one at a time) both equal ``adapter(mixer, x, reference)`` -> (B, T, C), which computes the
    mixer's own projections, calls ``reference`` on them in place of the mixer's kernel, and
    applies the rest of the layer (gate, output projection) to its outputs::

        mixer = seqzoo.registry().create("mixer", {"kind": "linear_attention", "heads": 2}, 16)
        matches_reference(mixer, reference.linear_attention, lambda m, x, run: ...)

    The caller's mixer is left as it is: a float64 copy is checked, its parameters each moved by
    N(0, 0.1²) first, so one left at its initial ones or zeros (a norm's weight, a skip's D) still
    shows when the adapter leaves it out. ``tolerance`` bounds max |mixer − reference| over the
    largest |reference|. Raises AssertionError saying which path differs and by how much, or that
    the adapter never called ``reference`` (a check that compared nothing).
    """
    generator = torch.Generator().manual_seed(seed)
    mixer = copy.deepcopy(mixer).double().eval()
    calls = []

    def recorded(*args: object, **kwargs: object) -> tuple[Tensor, object]:
        calls.append(1)
        return reference(*args, **kwargs)

    label = reference.__name__ if isinstance(reference, FunctionType) else repr(reference)
    name = f"{type(mixer).__name__} against {label}"
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.1)
        x = torch.randn(batch, length, mixer.dim, generator=generator, dtype=torch.float64)
        expected = adapter(mixer, x, recorded)
        if not calls:
            raise AssertionError(f"{name}: the adapter never called the reference it was given, so nothing "
                                 f"was compared; run the mixer's inputs through it")
        scale = expected.abs().max().item() or 1.0
        paths = {"the whole-sequence forward": _full(mixer, x), "decoding through the state": _pieces(mixer, x)[0]}
        for path, out in paths.items():
            if out.shape != expected.shape:
                raise AssertionError(f"{name}: {path} gave {tuple(out.shape)}, the adapter {tuple(expected.shape)}")
            worst = (out - expected).abs().max().item() / scale
            if not worst <= tolerance:  # NaN fails too
                raise AssertionError(f"{name}: {path} differs by {worst:.1e} of the reference's largest value "
                                     f"({tolerance:.0e} allowed)")
