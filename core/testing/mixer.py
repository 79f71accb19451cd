"""Checks of kind ``mixer``: shapes, causality, step-by-step decoding, left padding, reordered
rows, dtypes, gradients."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..nn.attention import self_attention_inputs
from ..nn.cache import KVCache
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


def checks(name: str, params: dict) -> dict[str, Callable[[], None]]:
    """Token mixers: (B, T, C) -> (B, T, C), causal, and decoding piece by piece through their
    state (left-padded rows included, rows reordered midway) equal to the full forward."""
    make = lambda: registry().create("mixer", spec(name, params), C)  # noqa: E731
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
        check_dtypes(make, lambda m, dt: full(m, x.to(dt)))

    def gradients() -> None:
        mixer = make().double()
        gradcheck(lambda inputs: full(mixer, inputs), x[:1, :3])

    def state_dict() -> None:
        state_dict_round_trip(make, lambda m: full(m, x))

    return {"shapes": shapes, "causality": causality, "decode_steps": decode_steps, "left_padding": left_padding,
            "state_reorder": state_reorder, "dtypes": dtypes, "gradients": gradients, "state_dict": state_dict}
