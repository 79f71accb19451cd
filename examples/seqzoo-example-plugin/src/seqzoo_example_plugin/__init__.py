"""An example third-party seqzoo plugin.

Installing this distribution is all it takes: its entry point (group ``seqzoo``) names this module,
and the registry calls the hook below once per process. Components:

- score ``sigmoid``: σ(q·k/√D + b) @ v, no softmax (Ramapuram et al., 2024);
- position ``kerple``: per-head learned log-distance bias −r1·ln(1 + r2·|i − j|) (Chi et al., 2022);
- cell ``mingru``: the minimal GRU, whose gate ignores the state (Feng et al., 2024);
- mixer ``causal_conv``: a causal depthwise convolution over the last k tokens, the short
  convolution of H3, Hyena and Mamba, as a layer's token mixer.
"""
from __future__ import annotations

import seqzoo

from .causal_conv import CausalConv
from .kerple import KerpleLog
from .mingru import MinGRU
from .sigmoid import SigmoidAttention

__version__ = "0.1.0"


@seqzoo.hookimpl
def seqzoo_components() -> list[seqzoo.Component]:
    return [
        seqzoo.Component("score", "sigmoid", SigmoidAttention, aliases=("sigmoid_attention",),
                         summary="σ(q·k/√D + b) @ v, no softmax over keys (Ramapuram 2024)"),
        seqzoo.Component("position", "kerple", KerpleLog, aliases=("kerple_log",),
                         summary="learned per-head bias −r1·ln(1 + r2·|i−j|) (KERPLE-log, Chi 2022)"),
        seqzoo.Component("cell", "mingru", MinGRU,
                         summary="minimal GRU: z = σ(W_z x), h' = (1 − z)·h + z·W_h x (Feng 2024)"),
        seqzoo.Component("mixer", "causal_conv", CausalConv, aliases=("depthwise_conv",),
                         summary="causal depthwise conv y_t = Σ_i w_i·x_{t−i} per channel (H3/Hyena/Mamba)"),
    ]
