"""No position information: attention is permutation-equivariant (a bag of tokens)."""
from __future__ import annotations

from seqzoo.interfaces import PositionScheme
from seqzoo.registry import builtin


@builtin("no position information (identity hooks)", aliases=("nope",))
class NoPosition(PositionScheme):
    """Every hook is the identity. Causal decoders can still infer order from the mask (NoPE)."""
