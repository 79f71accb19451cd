"""No position information: attention is permutation-equivariant (a bag of tokens)."""
from __future__ import annotations

import seqzoo
from seqzoo.interfaces import PositionScheme


class NoPosition(PositionScheme):
    """Every hook is the identity. Causal decoders can still infer order from the mask (NoPE)."""


@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("position", "none", NoPosition, aliases=("nope",),
                             summary="no position information (identity hooks)")]
