"""What the recurrent mixers share (not a mixer of its own): the decoding state, a set of named
per-row tensors that beam search and batched generation reorder together, and the short causal
depthwise convolution most of them run before their recurrence (Mamba, Mamba-2, gated DeltaNet,
KDA, LFM2's gated conv, Griffin's temporal conv), whose last K − 1 inputs live in that state.

On CUDA with flash-linear-attention installed (and ``SEQZOO_SCAN`` not ``torch``) the conv runs
on fla's Triton ``causal_conv1d``. fla keeps a history of K inputs (B, E, K), of which its forward
reads the last K − 1; the state here keeps those K − 1 (B, E, K − 1) on either path, so a mixer's
decoding reads the same state whichever path wrote it: it goes in with a zero column in front and
comes back without its first column.
"""
from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.errors import ConfigError
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


@functools.cache
def _fla_conv():
    """fla's ``causal_conv1d`` (x (B, T, E), weight (E, K), bias, initial_state (B, E, K),
    output_final_state) -> (y, final state), or None."""
    try:
        from fla.modules.convolution import causal_conv1d
    except ImportError:
        return None
    return causal_conv1d


def causal_conv(conv1d: nn.Conv1d, u: Tensor, state: RecurrentState | None, slot: str = "conv") -> Tensor:
    """A causal depthwise conv over u (B, T, E) -> (B, T, E), preceded by the state's last K − 1
    inputs (its tensor ``slot``, (B, E, K − 1); zeros at the start), which it then replaces.
    Padded positions must be zero in ``u`` (the caller masks them): a zero input is what an empty
    history holds. fla's kernel on CUDA where it applies (the module docstring)."""
    kernel = _fla_conv() if u.is_cuda and os.environ.get("SEQZOO_SCAN") != "torch" else None
    if kernel is not None:
        before = None if state is None else F.pad(getattr(state, slot).to(u.dtype), (1, 0))  # (B, E, K)
        y, final = kernel(x=u, weight=conv1d.weight.squeeze(1).to(u.dtype),
                          bias=None if conv1d.bias is None else conv1d.bias.to(u.dtype),
                          initial_state=before, output_final_state=state is not None)
        if state is not None:
            setattr(state, slot, final[..., 1:].to(getattr(state, slot).dtype))
        return y
    u = u.transpose(1, 2)  # (B, E, T)
    keep = conv1d.kernel_size[0] - 1
    before = getattr(state, slot).to(u.dtype) if state is not None else u.new_zeros(u.shape[0], u.shape[1], keep)
    window = torch.cat([before, u], dim=-1)  # (B, E, K − 1 + T)
    if state is not None:
        setattr(state, slot, window[..., window.shape[-1] - keep:])
    if u.shape[-1] == 1:  # a decode step: the K products per channel, 5× cheaper than a conv1d call
        out = (window * conv1d.weight[:, 0].to(u.dtype)).sum(-1, keepdim=True)  # (B, E, 1)
        return (out if conv1d.bias is None else out + conv1d.bias.to(u.dtype)[:, None]).transpose(1, 2)
    return conv1d(window).transpose(1, 2)


def check_dt_range(kind: str, dt_min: float, dt_max: float) -> None:
    """Refuse an initial step range given backwards: the log-uniform draw would take it silently
    (as the range between the two), so a swapped pair is almost always a typo worth naming."""
    if dt_min > dt_max:
        raise ConfigError(f"{kind}: dt_min={dt_min} is above dt_max={dt_max}; swap them (the initial Δ is "
                          f"drawn from [dt_min, dt_max])")
