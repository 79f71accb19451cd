"""What the recurrent mixers share (not a mixer of its own): the decoding state, a set of named
per-row tensors that beam search and batched generation reorder together, and the short causal
depthwise convolution most of them run before their recurrence (Mamba, Mamba-2, gated DeltaNet,
KDA, LFM2's gated conv, Griffin's temporal conv), whose last K − 1 inputs live in that state."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from seqzoo.interfaces import MixerState


class RecurrentState(MixerState):
    """A recurrent mixer's decoding state: named tensors, each with the batch rows first (the conv
    inputs ``conv`` (B, E, K − 1), a recurrence's ``ssm`` or ``S``, ...). ``reorder`` reorders them
    all; a new mixer only names its tensors."""

    def __init__(self, **tensors: Tensor) -> None:
        self.__dict__.update(tensors)

    def reorder(self, rows: Tensor) -> None:
        for name, tensor in vars(self).items():
            setattr(self, name, tensor.index_select(0, rows))


class MambaState(RecurrentState):
    """conv (B, E, K − 1): the last conv inputs; ssm: the scan's state (Mamba (B, E, N), Mamba-2
    (B, H, P, N)), float32."""

    def __init__(self, conv: Tensor, ssm: Tensor) -> None:
        super().__init__(conv=conv, ssm=ssm)


def conv_inputs(batch: int, channels: int, kernel: int, *, device: torch.device | None = None,
                dtype: torch.dtype | None = None) -> Tensor:
    """The empty history of a causal conv of width ``kernel``: zeros (B, channels, K − 1)."""
    return torch.zeros(batch, channels, kernel - 1, device=device, dtype=dtype)


def causal_conv(conv1d: nn.Conv1d, u: Tensor, state: RecurrentState | None, slot: str = "conv") -> Tensor:
    """A causal depthwise conv over u (B, T, E), preceded by the state's last K − 1 inputs (its
    tensor ``slot``; zeros at the start), which it then replaces. Padded positions must be zero in
    ``u`` (the caller masks them): a zero input is what an empty history holds."""
    u = u.transpose(1, 2)  # (B, E, T)
    keep = conv1d.kernel_size[0] - 1
    before = getattr(state, slot).to(u.dtype) if state is not None else u.new_zeros(u.shape[0], u.shape[1], keep)
    window = torch.cat([before, u], dim=-1)  # (B, E, K − 1 + T)
    if state is not None:
        setattr(state, slot, window[..., window.shape[-1] - keep:])
    return conv1d(window).transpose(1, 2)
