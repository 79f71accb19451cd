"""Transfer rules: how ``seqzoo edit`` moves a trained model's weights into a changed recipe."""
from __future__ import annotations

from torch import Tensor, nn


class TransferRule:
    """Carries a trained model's weights across one kind of recipe change (kind ``transfer``;
    ``seqzoo edit``). Constructor: no arguments.

    ``claims(old, new, changed)`` gets the old and new resolved model sections and the dotted
    keys that differ (``attention.kv_heads``, ``layer_types.local.position``) and returns the ones
    it handles. ``transfer(old, new, old_state, new_state)`` then writes the tensors of the new
    state dict it makes (in place) and returns {tensor name: how it was made}; every other tensor
    of the new model is copied bit for bit from the old one by the edit. ``exact``: the edited
    model computes what the old one did (the edit checks that its logits are identical);
    otherwise ``error(old_state, new_state)`` may report a reconstruction error, {what: value}.
    """

    exact: bool = False

    def claims(self, old: dict, new: dict, changed: list[str]) -> list[str]:
        raise NotImplementedError(f"{type(self).__name__} must implement claims(old, new, changed)")

    def transfer(self, old: dict, new: dict, old_state: dict[str, Tensor],
                 new_state: dict[str, Tensor]) -> dict[str, str]:
        return {}

    def error(self, old_state: dict[str, Tensor], new_state: dict[str, Tensor]) -> dict[str, float]:
        return {}

    def measure(self, old: nn.Module, new: nn.Module, probe: Tensor) -> dict[str, float]:
        """What the rule compares between the built models on ``probe`` ids (1, T) when their
        logits cannot be (a decoder turned encoder has none): {what: value}."""
        return {}
