"""The causal depthwise conv of ``_conv_state.causal_conv`` on flash-linear-attention's Triton kernel
when the input is on CUDA and ``fla`` is installed (not a mixer of its own; the short-conv mixer
and the RG-LRU's temporal conv take it). Elsewhere, and with ``SEQZOO_SCAN=torch``, it is
``causal_conv`` itself.

fla's ``causal_conv1d`` keeps a history of K inputs (N, E, K), of which its forward reads the last
K − 1; seqzoo's state keeps those K − 1 (B, E, K − 1). The state goes in with a zero column in
front and comes back without its first column.
"""
from __future__ import annotations

import functools
import os

import torch.nn.functional as F
from torch import Tensor, nn

from ._conv_state import RecurrentState, causal_conv


@functools.cache
def _fla_conv():
    """fla's ``causal_conv1d`` (x (B, T, E), weight (E, K), bias, initial_state (B, E, K),
    output_final_state) -> (y, final state), or None."""
    try:
        from fla.modules.convolution import causal_conv1d
    except ImportError:
        return None
    return causal_conv1d


def short_conv(conv1d: nn.Conv1d, u: Tensor, state: RecurrentState | None, slot: str = "conv") -> Tensor:
    """``causal_conv(conv1d, u, state, slot)``: u (B, T, E) with padded positions zeroed -> (B, T, E),
    the state's last K − 1 inputs read first and replaced; on fla's kernel where it applies."""
    kernel = _fla_conv() if u.is_cuda and os.environ.get("SEQZOO_SCAN") != "torch" else None
    if kernel is None:
        return causal_conv(conv1d, u, state, slot)
    before = None if state is None else F.pad(getattr(state, slot).to(u.dtype), (1, 0))  # (B, E, K)
    y, final = kernel(x=u, weight=conv1d.weight.squeeze(1).to(u.dtype),
                      bias=None if conv1d.bias is None else conv1d.bias.to(u.dtype),
                      initial_state=before, output_final_state=state is not None)
    if state is not None:
        setattr(state, slot, final[..., 1:].to(getattr(state, slot).dtype))
    return y
