"""What Mamba and Mamba-2 share (not a mixer of its own): the short causal depthwise convolution
before the scan, and the decoding state that carries its last K − 1 inputs and the scan's state."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from seqzoo.interfaces import MixerState


class MambaState(MixerState):
    """conv (B, E, K − 1): the last conv inputs; ssm (B, E, N): the scan's state, float32."""

    def __init__(self, conv: Tensor, ssm: Tensor) -> None:
        self.conv, self.ssm = conv, ssm

    def reorder(self, rows: Tensor) -> None:
        self.conv, self.ssm = self.conv.index_select(0, rows), self.ssm.index_select(0, rows)


def causal_conv(conv1d: nn.Conv1d, u: Tensor, state: MambaState | None) -> Tensor:
    """A causal depthwise conv over u (B, T, E), preceded by the state's last K − 1 inputs (zeros
    at the start), which it then replaces."""
    u = u.transpose(1, 2)  # (B, E, T)
    keep = conv1d.kernel_size[0] - 1
    before = state.conv.to(u.dtype) if state is not None else u.new_zeros(u.shape[0], u.shape[1], keep)
    window = torch.cat([before, u], dim=-1)  # (B, E, K − 1 + T)
    if state is not None:
        state.conv = window[..., window.shape[-1] - keep:]
    return conv1d(window).transpose(1, 2)
