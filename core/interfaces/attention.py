"""Attention scores, position schemes and RoPE scalings: how a query weighs each key.

Shape legend: B batch, T query length, S key length, H heads, K kv heads, D head dim, C model dim.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..functional import expand_kv, masked_softmax_attend
from .part import Part


class ScoreFunction(Part):
    """An attention score: how strongly each query attends to each key.

    Constructor: ``(query_dim, key_dim, heads, **params)`` where ``query_dim``/``key_dim`` are the
    per-head dims of q and k and ``heads`` is H. A new score writes ``scores``; the default
    ``attend`` turns scores into a masked softmax over keys in float32 and applies it to v. Fused
    variants override ``attend``. A score whose weights are not a softmax of its scores (sigmoid
    attention) sets ``normalization`` to another name, and the kit skips the softmax check.
    """

    normalization: str = "softmax"

    def __init__(self, query_dim: int, key_dim: int, heads: int) -> None:
        super().__init__()
        self.query_dim = query_dim
        self.key_dim = key_dim
        self.heads = heads

    def flex(self) -> FlexScore | None:
        """Optional: this score as FlexAttention computes it, q·k·scale then ``modify``, so long,
        masked or biased attention runs blockwise instead of materialising (B, H, T, S) logits
        (``seqzoo.nn.flex``). None (the default): the score is not a scaled dot product, and its
        own ``attend`` always runs."""
        return None

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """Logits for every query–key pair: q (B, H, T, D), k (B, H, S, D) -> (B, H, T, S)."""
        raise NotImplementedError(f"{type(self).__name__} must implement scores(q, k)")

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        causal: bool = False,
        dropout: float = 0.0,
    ) -> Tensor:
        """Attention output (B, H, T, Dv).

        q (B, H, T, D); k (B, K, S, D) and v (B, K, S, Dv) with K dividing H (grouped heads);
        ``mask`` a boolean (B|1, H|1, T, S) tensor, True where a query may attend; ``bias`` an
        additive (B|1, H|1, T, S) tensor; ``causal`` a top-left causal mask (used only when ``mask``
        is None). Rows whose keys are all masked give zeros, never NaN.
        """
        return masked_softmax_attend(
            self.scores(q, expand_kv(k, q.shape[1])), expand_kv(v, q.shape[1]),
            mask=mask, bias=bias, causal=causal, dropout=dropout, training=self.training,
        )


@dataclass(frozen=True)
class FlexScore:
    """A score in FlexAttention's terms: logits q·k·``scale``, then ``modify(score, b, h, q_idx,
    kv_idx) -> score`` on each one (None: nothing more)."""

    scale: float
    modify: Callable | None = None


class PositionScheme(Part):
    """How a stack knows where tokens are. One instance per stack, shared by all its layers.

    Constructor: ``(dim, head_dim, heads, max_seq_len, **params)``. Three hooks, each an identity by
    default; a scheme overrides the ones it needs. Positions are explicit integer tensors of shape
    (B|1, T), so a KV cache only has to offset them (per-row positions serve left padding).
    """

    #: The largest number of positions the scheme can represent (learned tables), or None.
    max_positions: int | None = None
    #: Whether the hooks' work has the same shapes for every decode step of a static KV cache
    #: (no Python number read from the positions), so ``generate(compile=True)`` traces it once.
    compiles_statically: bool = True

    def __init__(self, dim: int, head_dim: int, heads: int, max_seq_len: int) -> None:
        super().__init__()
        self.dim = dim
        self.head_dim = head_dim
        self.heads = heads
        self.max_seq_len = max_seq_len
        #: Set by the stack that owns the scheme: True in decoders (keys never follow the query),
        #: False in encoders. Relative schemes with direction-dependent buckets (T5) read it.
        self.causal = True

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """Absolute schemes add to token embeddings: x (B, T, C), positions (B|1, T) -> (B, T, C)."""
        return x

    def prepare(self, q_pos: Tensor, k_pos: Tensor):
        """Optional: work every layer of one forward shares (RoPE's cos/sin tables), done once per
        forward by the stack. A scheme that overrides it receives the result back as the keyword
        ``prepared=`` of ``rotate`` and ``bias``; the default returns None and passes nothing."""
        return None

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor,
               prepared: object = None) -> tuple[Tensor, Tensor]:
        """Rotary schemes: q (B, H, T, D) at q_pos (B|1, T), k (B, K, T', D) at k_pos (B|1, T')."""
        return q, k

    def bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor, prepared: object = None) -> Tensor | None:
        """Additive logit bias (B|1, H, T, S) for q (B, H, T, D) at q_pos (B|1, T) against keys at
        k_pos (B|1, S), or None."""
        return None

    def score_mod(self, q_pos: Tensor, k_pos: Tensor, prepared: object = None) -> Callable | None:
        """Optional, for a scheme with a ``bias``: the same bias as FlexAttention's score
        modification, ``mod(score, b, h, q_idx, kv_idx) -> score + bias[b, h, q_idx, kv_idx]`` for
        queries at q_pos (B|1, T) and keys at k_pos (B|1, S), computed per element, never as a
        table. None (the default): a biased scheme then keeps the materialised path."""
        return None

    def rotary(self) -> Rotary | None:
        """For a scheme that rotates pairs of dims by angles p·ω_k: what ``seqzoo positions`` draws
        it from (its ``angles`` and its unscaled base); None for every other scheme."""
        return None


@dataclass(frozen=True)
class Rotary:
    """What a rotary scheme tells the position plots: ``angles(positions) -> (cos, sin)``
    (1, 1, T, P) with its scaling applied; the ``base`` and ``rotary_dim`` of the unscaled
    ω_k = base^(−2k/d_r); the context it was trained on and the factor its scaling stretches it by."""

    angles: object  # Callable[[Tensor], tuple[Tensor, Tensor]]
    base: float
    rotary_dim: int
    context: int
    factor: float = 1.0


class PositionBias(PositionScheme):
    """A scheme whose logit bias depends on positions only (ALiBi, T5 buckets): ``prepare(q_pos,
    k_pos) -> (B|1, H, T, S)``, built at most once per forward and shared by every layer; ``bias``
    hands that table back in the query's dtype. The stack defers the table (``DeferredTable``): a
    forward whose attention runs through FlexAttention's ``score_mod`` never builds it.

    Most such biases are a function of the distance r = k_pos − q_pos alone: a scheme that says so
    in ``by_distance`` gets ``prepare`` for free, and attention that works in blocks at long
    context looks each block up in that (H, R) table instead of building (T × S) ones."""

    def by_distance(self, distances: Tensor) -> Tensor | None:
        """distances (R,) int64 -> the bias at each, (H, R) float32, learned parameters in its
        graph; None (the default) where the bias is not a function of the distance alone."""
        return None

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """q_pos (B|1, T), k_pos (B|1, S) -> (B|1, H, T, S), looked up in ``by_distance``."""
        q_pos, k_pos = torch.atleast_2d(q_pos), torch.atleast_2d(k_pos)
        relative = k_pos[:, None, :] - q_pos[:, :, None]  # (B|1, T, S)
        # every entry's own distance, not a table over the range: no Python number is read off the
        # positions, so a compiled decode step keeps one graph
        table = self.by_distance(relative.flatten())
        if table is None:
            raise NotImplementedError(f"{type(self).__name__} must implement by_distance(distances) "
                                      f"or prepare(q_pos, k_pos)")
        return table.view(-1, *relative.shape).transpose(0, 1)

    def bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor, prepared: object = None) -> Tensor:
        """q (B, H, T, D) -> (B|1, H, T, S) in q's dtype (``prepared``: ``prepare``'s table, or
        the ``DeferredTable`` that builds it once)."""
        if isinstance(prepared, DeferredTable):
            prepared = prepared.table()
        table = prepared if prepared is not None else self.prepare(q_pos, k_pos)
        return table.to(q.dtype)


def distance_table(position: PositionBias, q_pos: Tensor, k_pos: Tensor) -> tuple[int, Tensor | None]:
    """Every distance k_pos − q_pos can take, from the least: (that least r₀, the scheme's (H, R)
    ``by_distance`` table over r₀ … r₀ + R − 1, or None where it has none) for q_pos (B|1, T),
    k_pos (B|1, S)."""
    first, last = int(k_pos.min() - q_pos.max()), int(k_pos.max() - q_pos.min())
    return first, position.by_distance(torch.arange(first, last + 1, device=q_pos.device))


class DeferredTable:
    """``prepare(q_pos, k_pos)`` built at the first ``table()`` and kept: the layers of one forward
    share it, and a forward that never asks never pays its (B|1, H, T, S) memory."""

    def __init__(self, prepare: Callable[[Tensor, Tensor], Tensor], q_pos: Tensor, k_pos: Tensor) -> None:
        self._prepare, self._positions, self._table = prepare, (q_pos, k_pos), None

    def table(self) -> Tensor:
        if self._table is None:
            self._table = self._prepare(*self._positions)
        return self._table


class RopeScaling(Part):
    """A RoPE context-extension rule (kind ``rope_scaling``, the ``scaling:`` of ``rope``).

    Constructor: ``(**params)`` only. It changes the rotation frequencies ω_k and may return an
    amplitude ``attention_factor`` that multiplies both cos and sin (so logits scale by its square).
    """

    #: A sequence length at which the rule switches frequencies, making keys cached before it
    #: stale (LongRoPE's L): ``generate`` re-encodes the whole sequence once, at the step that
    #: first takes it past this length, as transformers' Phi-3 does. None: cached keys stay valid.
    stale_after: int | None = None
    #: How many times the trained context the rule stretches RoPE over (1: it does not), and that
    #: context when the rule names one (null: the model's max_seq_len).
    factor: float = 1.0
    original_max_seq_len: int | None = None

    def frequencies(self, inv_freq: Tensor, *, rotary_dim: int, base: float, max_seq_len: int,
                    positions: Tensor) -> tuple[Tensor, float]:
        """inv_freq (d_r/2,) float64, the unscaled ω_k = base^(−2k/d_r) -> (scaled ω' in the same
        dtype, factor).

        ``max_seq_len`` is the model's; ``positions`` (B|1, T) the positions being rotated (the
        dynamic rule reads the current length from them).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement frequencies(...)")
