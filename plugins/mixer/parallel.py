"""Several token mixers side by side on one input (Falcon-H1's layer: attention and Mamba-2 in
parallel on the same normed input, Zuo et al., 2025):

    out = Σ_i  m_out,i · mixer_i(m_in,i · x)

with a multiplier on each branch's input and output (Falcon-H1's μP ``attention_in_multiplier``,
``attention_out_multiplier`` and ``ssm_out_multiplier``; 1 by default). Each branch keeps its own
decoding state (an attention branch its KV slice, a recurrent one its fixed-size state).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from seqzoo.errors import ConfigError
from seqzoo.interfaces import Mixer, MixerContext, MixerState
from seqzoo.registry import builtin
from seqzoo.schema import Spec


class BranchStates(MixerState):
    """One decoding state per branch, reordered together."""

    def __init__(self, states: list[MixerState]) -> None:
        self.states = states

    def reorder(self, rows: Tensor) -> None:
        for state in self.states:
            state.reorder(rows)


@builtin("several mixers in parallel on one input, outputs summed (Falcon-H1's attention + Mamba-2)")
class ParallelMixers(Mixer):
    """mixers: the branches, each a mixer spec (required; at least two). in_multipliers,
    out_multipliers: a multiplier per branch on its input and on its output (null: 1 each).

    The layer attends through its branch that attends (its window and position scheme are that
    branch's); it is causal by construction when any branch is, and reads a document mask only when
    every branch does."""

    example_params = {"mixers": [{"kind": "attention", "heads": 2}, {"kind": "recurrent", "cell": "gru"}]}
    #: Recipes are validated before any branch is built: a layer that may hold a recurrence is
    #: refused in bidirectional stacks (an instance knows its branches and says exactly).
    causal_only = True

    def __init__(self, dim: int, mixers: list[Spec["mixer"]], in_multipliers: list[float] | None = None,
                 out_multipliers: list[float] | None = None) -> None:
        super().__init__(dim)
        if len(mixers) < 2:
            raise ConfigError(f"parallel: mixers has {len(mixers)} branch(es); give two or more (one mixer alone "
                              f"is that mixer)")
        self.mixers = nn.ModuleList(make(dim) for make in mixers)
        count = len(self.mixers)
        for name, values in (("in_multipliers", in_multipliers), ("out_multipliers", out_multipliers)):
            if values is not None and len(values) != count:
                raise ConfigError(f"parallel: {name} has {len(values)} entries for {count} mixers")
        self.in_multipliers = list(in_multipliers or [1.0] * count)
        self.out_multipliers = list(out_multipliers or [1.0] * count)
        parts = list(self.mixers)
        self.causal_only = any(m.causal_only for m in parts)
        self.reads_mask = all(m.reads_mask for m in parts)
        self.compiles_statically = all(m.compiles_statically for m in parts)
        windows = {m.window for m in parts if m.window is not None}
        if len(windows) > 1:
            raise ConfigError(f"parallel: branches attend through different windows {sorted(windows)}; one layer "
                              f"has one mask")
        self.window = windows.pop() if windows else None

    @classmethod
    def branches(cls, spec: dict) -> list[dict]:
        return list(spec["mixers"])

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> BranchStates:
        return BranchStates([m.new_state(batch, max_len, device=device, dtype=dtype) for m in self.mixers])

    def forward(self, x: Tensor, context: MixerContext, state: BranchStates | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C): the branches' outputs, each scaled, summed."""
        out = None
        for index, (mixer, m_in, m_out) in enumerate(zip(self.mixers, self.in_multipliers,
                                                          self.out_multipliers)):
            y = mixer(x if m_in == 1.0 else x * m_in, context, None if state is None else state.states[index])
            y = y if m_out == 1.0 else y * m_out
            out = y if out is None else out + y
        return out

