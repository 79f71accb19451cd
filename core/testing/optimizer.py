"""Checks of kind ``optimizer``: the torch optimizer an ``UpdateRule`` builds over a small model's
sorted parameters (an embedding, a hidden matrix, a bias and a norm scale) covers each once, learns,
leaves the weights alone at a zero rate (torch's distributed checkpointing takes such a step before
it loads a state), and continues bit for bit from its state as a checkpoint keeps it."""
from __future__ import annotations

import copy
import json
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..interfaces import TrainedParameters
from ..registry import registry
from ._shared import spec

V, W, N = 11, 8, 16  # vocabulary, width, examples of the toy problem


class _Toy(nn.Module):
    """Embedding -> norm scale -> hidden matrix with a bias -> the embedding as the head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, W)
        self.hidden = nn.Linear(W, W)
        self.scale = nn.Parameter(torch.ones(W))

    def sorted(self) -> TrainedParameters:
        return TrainedParameters(decayed=(self.embed.weight, self.hidden.weight),
                                 undecayed=(self.hidden.bias, self.scale), hidden=(self.hidden.weight,),
                                 names={id(p): n for n, p in self.named_parameters()})

    def loss(self, ids: Tensor, targets: Tensor) -> Tensor:
        x = torch.tanh(self.hidden(self.embed(ids) * self.scale))
        return nn.functional.cross_entropy(x @ self.embed.weight.t(), targets)


def _toy() -> tuple[_Toy, Tensor, Tensor]:
    generator = torch.Generator().manual_seed(0)
    toy = _Toy()
    ids = torch.randint(0, V, (N,), generator=generator)
    return toy, ids, (ids * 3 + 1) % V


def checkpoint_round_trip(state: dict, like: torch.optim.Optimizer) -> dict:
    """``state`` as a training checkpoint keeps and gives it back: tensors copied, param-group
    settings through JSON (tuples come back as lists, and are tuples again where the fresh
    optimizer's groups hold tuples)."""
    groups = json.loads(json.dumps(state["param_groups"], default=str))
    groups = [{k: tuple(v) if isinstance(v, list) and isinstance(live.get(k), tuple) else v for k, v in g.items()}
              for g, live in zip(groups, like.param_groups)]
    tensors = {p: {k: v.clone() if isinstance(v, Tensor) else v for k, v in s.items()}
               for p, s in state["state"].items()}
    return {"state": tensors, "param_groups": groups}


def checks(name: str, params: dict) -> dict[str, Callable[[], None]]:
    rule = lambda: registry().create("optimizer", spec(name, params))  # noqa: E731
    settings = {"lr": 1e-2, "weight_decay": 0.01, "betas": (0.9, 0.95)}

    def build(toy: _Toy) -> torch.optim.Optimizer:
        return rule().build(toy.sorted(), **settings)

    def steps(toy: _Toy, optimizer: torch.optim.Optimizer, ids: Tensor, targets: Tensor, count: int) -> None:
        for _ in range(count):
            optimizer.zero_grad(set_to_none=True)
            toy.loss(ids, targets).backward()
            optimizer.step()

    def covers_every_parameter() -> None:
        toy, _, _ = _toy()
        held = [id(p) for group in build(toy).param_groups for p in group["params"]]
        expected = sorted(id(p) for p in toy.parameters())
        if sorted(held) != expected:
            raise AssertionError(f"the param groups hold {len(held)} tensors ({len(set(held))} distinct) of the "
                                 f"model's {len(expected)}: each trained tensor belongs in exactly one group")
        if any(not group["lr"] > 0 for group in build(toy).param_groups):
            raise AssertionError("every group's lr as built is its peak, which the schedule scales: it must be > 0")

    def learns() -> None:
        toy, ids, targets = _toy()
        before = toy.loss(ids, targets).item()
        steps(toy, build(toy), ids, targets, 30)
        after = toy.loss(ids, targets).item()
        if not after < 0.9 * before:
            raise AssertionError(f"30 steps at lr 1e-2 took the toy loss from {before:.4f} to {after:.4f}")

    def zero_lr_changes_nothing() -> None:
        toy, ids, targets = _toy()
        optimizer = build(toy)
        steps(toy, optimizer, ids, targets, 2)  # with state, as a run has
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        before = [p.detach().clone() for p in toy.parameters()]
        steps(toy, optimizer, ids, targets, 1)
        if any(not torch.equal(a, p) for a, p in zip(before, toy.parameters())):
            raise AssertionError("a step at lr 0 changed the weights; torch's distributed checkpointing takes "
                                 "such a step to create the state it then loads, so resumed runs would drift")

    def resumes_exactly() -> None:
        toy, ids, targets = _toy()
        optimizer = build(toy)
        steps(toy, optimizer, ids, targets, 3)
        again = copy.deepcopy(toy)
        fresh = build(again)
        fresh.load_state_dict(checkpoint_round_trip(optimizer.state_dict(), fresh))
        steps(toy, optimizer, ids, targets, 3)
        steps(again, fresh, ids, targets, 3)
        for (name, a), b in zip(toy.named_parameters(), again.parameters()):
            if not torch.equal(a, b):
                raise AssertionError(f"{name}: the optimizer loaded from its saved state steps differently "
                                     f"from the one that kept going (max difference {(a - b).abs().max():.2e})")

    return {"covers_every_parameter": covers_every_parameter, "learns": learns,
            "zero_lr_changes_nothing": zero_lr_changes_nothing, "resumes_exactly": resumes_exactly}
