"""Several torch optimizers over disjoint parameters, seen as one ``torch.optim.Optimizer`` (Muon
on the hidden matrices beside AdamW on the rest): one ``param_groups`` list, one ``state``, one
``state_dict`` and one ``step`` — what the trainer, its schedule and torch's distributed
checkpointing expect of an optimizer."""
from __future__ import annotations

import torch


class Joined(torch.optim.Optimizer):
    """``optimizers`` stepped in order as one. Their group dicts are this optimizer's groups (the
    schedule's ``lr`` written here is theirs) and one state mapping serves them all, so
    ``state_dict`` and ``load_state_dict`` see every part's moments and momentum buffers."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.optimizers = list(optimizers)
        self.sizes = [len(optimizer.param_groups) for optimizer in self.optimizers]
        # add_param_group keeps each dict it is given, so the parts' dicts become these groups.
        super().__init__([group for optimizer in self.optimizers for group in optimizer.param_groups], {})
        self._share()

    def _share(self) -> None:
        start = 0
        for optimizer, size in zip(self.optimizers, self.sizes):
            optimizer.param_groups = self.param_groups[start:start + size]
            optimizer.state = self.state
            start += size

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for optimizer in self.optimizers:
            optimizer.step()
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._share()  # loading made new group dicts and a new state mapping: hand them to the parts
