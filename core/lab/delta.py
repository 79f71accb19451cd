"""The second study of the recall question: does the delta rule buy recall back?

The first study (``recall``, ``copying``) asks whether a finite state loses random access. The
field's other answer to that loss, besides adding attention, changed how the state is written:
the delta rule overwrites the value stored under a key instead of adding to it (Gated DeltaNet, the
linear layer of Qwen3-Next, Qwen3.5 and OLMo-Hybrid). This study trains ``gated_deltanet`` on the
same tasks with the same machinery and compares it, at equal state floats per layer, with the first
study's Mamba runs and against its attention runs, which are read from their files, not trained
again. docs/experiments.md states the design and the criteria below before any run.

- Tasks: MQAR at two layers (C = 128) and copying at four (C = 64), the first study's shapes,
  budgets, optimizer and rate sweep (``recall.FULL``, ``copying.FULL``).
- Models: Gated DeltaNet with heads of D_k = D_v = 32 and of 64, C / 32 heads, no position scheme;
  H · D_k · D_v state floats per layer: 4,096 and 16,384 at C = 128, 2,048 and 8,192 at C = 64 —
  exactly Mamba's 2C · N at d_state 16 and 64 (and Mamba-2's, heads of 16, expand 2).
- The criteria, ``verdict``: see its docstring.
"""
from __future__ import annotations

from .sweep import CLOSE, GAP, Contender

#: The key widths of the two state sizes: heads of 32 match d_state 16, heads of 64 d_state 64.
HEAD_DIMS = {32: 16, 64: 64}


def contenders(dim: int) -> list[Contender]:
    """Gated DeltaNet at each of ``HEAD_DIMS``' head widths, C / 32 heads (the smaller state first);
    a contender's ``state`` is its head width D_k."""
    heads = dim // 32
    return [Contender(f"gated deltanet D_k={width}", "gated_deltanet", width,
                      (f"model.mixer={{kind: gated_deltanet, heads: {heads}, head_dim: {width}}}",
                       "model.position=none"))
            for width in HEAD_DIMS]


def state_floats(contender: Contender, dim: int) -> int:
    """A Gated DeltaNet layer's recurrent state in floats: H heads of D_k × D_v (D_v = D_k here).
    (The short convolution's window of K − 1 inputs is on top, as it is for Mamba.)"""
    return (dim // 32) * contender.state ** 2


def verdict(means: dict[str, list[float]], xs: list[int], *, pairs: list[tuple[str, str, int]], reference: str,
            largest: int | None = None) -> tuple[str, list[str]]:
    """The pre-registered criteria for one task -> (verdict, the reasons, one line each).

    ``means[name]``: a model's mean score over seeds at each x (N, or string length; ascending);
    ``pairs``: (gated deltanet, its equal-state Mamba curve, the largest x its state allows), the
    smaller state first; the Mamba curve is the better of Mamba and Mamba-2 at that state, at each x;
    ``largest``: the x the gap is read at (default the last; copying reads it at the longest
    trained length).
    - buys recall back: at the smaller state, gated delta ends at least GAP above Mamba at
      ``largest``; and at every state it is no more than CLOSE below ``reference`` at every x up to
      the x its state allows;
    - does not: at every state, gated delta is within CLOSE of Mamba at every x;
    - inconclusive: anything else.
    """
    largest = xs[-1] if largest is None else largest
    at = xs.index(largest)
    ref = means[reference]
    small, small_mamba, _ = pairs[0]
    gap = means[small][at] - means[small_mamba][at]
    reasons = [f"{small} {gap:+.3f} against {small_mamba} at x = {largest} ({'≥' if gap >= GAP else '<'} {GAP})"]
    close_to_reference = True
    for delta, _, allowed in pairs:
        shortfall = max(r - d for x, r, d in zip(xs, ref, means[delta]) if x <= allowed)
        close_to_reference &= shortfall <= CLOSE
        reasons.append(f"{delta}: at most {shortfall:.3f} below {reference} up to x = {allowed} "
                       f"({'≤' if shortfall <= CLOSE else '>'} {CLOSE})")
    same = True
    for delta, mamba, _ in pairs:
        apart = max(abs(d - m) for d, m in zip(means[delta], means[mamba]))
        same &= apart <= CLOSE
        reasons.append(f"{delta}: at most {apart:.3f} from {mamba} at any x")
    if gap >= GAP and close_to_reference:
        return "buys recall back", reasons
    return ("does not" if same else "inconclusive"), reasons


def overall(verdicts: list[str]) -> str:
    """Across the two tasks, as the first study reads its depths: invalid if either task's table
    is; buys recall back only if both do; does not if either does not; inconclusive otherwise."""
    if "invalid" in verdicts:
        return "invalid"
    if all(v == "buys recall back" for v in verdicts):
        return "buys recall back"
    return "does not" if "does not" in verdicts else "inconclusive"


def better_of(*curves: list[float]) -> list[float]:
    """The best score at each x over several models' curves (Mamba's and Mamba-2's at one state)."""
    return [max(values) for values in zip(*curves)]
