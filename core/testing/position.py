"""Checks of kind ``position``: the hooks' shapes, what rotary and bias schemes promise, and a
decoder built with the scheme (causality, cached decoding)."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..registry import registry
from ._shared import (
    B,
    C,
    D,
    H,
    K,
    T,
    causal_model,
    check_dtypes,
    decoder,
    gradcheck,
    kv_cache_equivalence,
    left_padding_equivalence,
    spec,
    state_dict_round_trip,
)


def checks(name: str, params: dict) -> dict[str, Callable[[], None]]:
    make = lambda: registry().create("position", spec(name, params), C, D, H, 64)  # noqa: E731
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
        check_dtypes(make, run)

    def gradients() -> None:
        scheme = make().double()

        def fn(xx: Tensor, qq: Tensor, kk: Tensor) -> Tensor:
            qr, kr = scheme.rotate(qq, kk, pos[:, :3], pos[:, :3])
            bias = scheme.bias(qr, pos[:, :3], pos[:, :3])
            total = scheme.embed(xx, pos[:, :3]).sum() + qr.sum() * 0.5 + kr.pow(2).sum()
            return total + (bias.sum() if bias is not None else 0)

        gradcheck(fn, x[:1, :3], q[:1, :, :3], k[:1, :, :3])

    def state_dict() -> None:
        state_dict_round_trip(make, run)

    def kv_cache() -> None:
        model = decoder(position=spec(name, params))
        causal_model(model)
        kv_cache_equivalence(model)
        left_padding_equivalence(model)
        # post-norm, sliding window and MQA through the same scheme
        kv_cache_equivalence(decoder(position=spec(name, params), placement="post",
                                       attention={"heads": H, "kv_heads": 1, "window": 4}))

    return {"shapes": shapes, "per_row_positions": per_row_positions, "dtypes": dtypes,
            "gradients": gradients, "state_dict": state_dict, "causality_kv_cache_padding": kv_cache}
