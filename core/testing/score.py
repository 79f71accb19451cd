"""Checks of kind ``score``: shapes, the softmax over keys, masks, grouped heads, gradients, dtypes."""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..functional import expand_kv, masked_softmax_attend
from ..registry import registry
from ._shared import (
    B,
    D,
    H,
    K,
    Skip,
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
    make = lambda: registry().create("score", spec(name, params), D, D, H)  # noqa: E731
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
        check_dtypes(make, lambda s, dt: s.attend(q.to(dt), k.to(dt), v.to(dt), mask=mask))

    def gradients() -> None:
        score = make().double()
        gradcheck(lambda a, b, c: score.attend(a, b, c, causal=True), q[:1, :, :3], k[:1, :, :3], v[:1, :, :3])

    def state_dict() -> None:
        state_dict_round_trip(make, lambda s: s.attend(q, k, v, mask=mask))

    def kv_cache() -> None:
        model = decoder(attention={"heads": H, "kv_heads": K, "score": spec(name, params)})
        causal_model(model)
        kv_cache_equivalence(model)
        left_padding_equivalence(model)

    return {"shapes": shapes, "attend_matches_scores": attend_matches_scores,
            "causal_attend": causal_attend, "masked_rows_are_zero": masked_rows_are_zero,
            "dtypes": dtypes, "gradients": gradients, "state_dict": state_dict,
            "causality_kv_cache_padding": kv_cache}
