"""The run's optimizer and schedule, from the ``train:`` section's ``optimizer`` and ``schedule``
components: which parameters decay and which are hidden matrices (from what the model and its parts
declare), the optimizer built over them, each param group's peak rate, and the rate at each step."""
from __future__ import annotations

import torch
from torch import nn

from ..config import TrainConfig
from ..errors import TrainingError
from ..interfaces import Model, Part, Schedule, TrainedParameters, UpdateRule
from ..registry import registry
from .distributed import undecayed


def trained_parameters(model: nn.Module) -> TrainedParameters:
    """The parameters of ``model`` that train, sorted as ``TrainedParameters`` says: decayed when
    of 2+ dimensions and not in a part's ``no_weight_decay``; hidden when decayed, 2-D, inside one
    of the model's layers (``shard_units``) and not an embedding table. After FSDP2's wrapping
    (which shards the model in place) the tensors are the shards."""
    exempt = undecayed(model)
    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    decayed = [p for _, p in trained if p.dim() >= 2 and id(p) not in exempt]
    candidates = {id(p) for p in decayed if p.dim() == 2}
    inside = set()
    for layer in model.shard_units() if isinstance(model, Model) else []:
        for module in layer.modules():
            if not isinstance(module, nn.Embedding):  # a table read by index, not a matrix product
                inside.update(id(p) for p in module.parameters(recurse=False) if id(p) in candidates)
    hidden = tuple(p for p in decayed if id(p) in inside)
    return TrainedParameters(decayed=tuple(decayed),
                             undecayed=tuple(p for _, p in trained if p.dim() < 2 or id(p) in exempt),
                             hidden=hidden, names={id(p): name for name, p in trained},
                             stacked=stacked_rows(model, {id(p) for p in hidden}))


def stacked_rows(model: nn.Module, hidden: set[int]) -> dict[int, tuple[int, ...]]:
    """The row blocks of the ``hidden`` matrices (ids) that parts declare in ``stacked_rows``, by
    id; a declaration whose blocks do not add up to its weight's rows is a TrainingError."""
    found = {}
    for path, module in model.named_modules():
        if not isinstance(module, Part):
            continue
        for name, sizes in module.stacked_rows.items():
            try:
                weight = module.get_parameter(name)
            except AttributeError:  # wrapped or quantized since (a LoRA layer, int8 buffers): not trained whole
                continue
            if id(weight) not in hidden:
                continue
            if sum(sizes) != weight.shape[0] or min(sizes) < 1:
                raise TrainingError(f"{type(module).__name__} ({path}) declares {name} as blocks of {list(sizes)} "
                                    f"rows, and it has {weight.shape[0]}: its stacked_rows must add up to them")
            found[id(weight)] = tuple(sizes)
    return found


def spec_name(spec: str | dict) -> str:
    """The component a spec names (``adamw`` from ``adamw`` or ``{kind: adamw, ...}``)."""
    return spec if isinstance(spec, str) else spec["kind"]


def update_rule(config: TrainConfig, world: int = 1) -> UpdateRule:
    """The ``train.optimizer`` component; one whose update needs whole matrices (``shards`` false,
    Muon) is refused under FSDP2 before anything is wrapped."""
    rule = registry().create("optimizer", config.optimizer)
    if world > 1 and config.parallel == "fsdp" and not rule.shards:
        name = spec_name(config.optimizer)
        raise TrainingError(f"train.optimizer={name} cannot train under FSDP2 (train.parallel=fsdp): its update "
                            f"needs each matrix whole, and FSDP2 gives each rank a slice of it; set "
                            f"train.parallel=ddp, or choose an optimizer that works on slices (adamw, sgd)")
    return rule


def check_same_optimizer(path: str, saved: dict, config: TrainConfig) -> None:
    """A run resumes with the optimizer it started with (its state fits no other); ``saved``: the
    checkpoint's ``train:`` settings (a run saved before optimizers were components used adamw)."""
    before, now = spec_name(saved.get("optimizer", "adamw")), spec_name(config.optimizer)
    if registry().get("optimizer", before).name != registry().get("optimizer", now).name:
        raise TrainingError(f"--resume {path}: the run trained with train.optimizer={before}, and its state does "
                            f"not fit {now}; resume with train.optimizer={before}, or start a new run from its "
                            f"weights with --init {path}")


def optimizer_for(model: nn.Module, config: TrainConfig, rule: UpdateRule | None = None) -> torch.optim.Optimizer:
    """The torch optimizer of a run of ``model`` (wrapped for FSDP2 in place, or not wrapped: DDP
    shares the model's tensors): ``rule`` (default: ``train.optimizer``) over its trained parameters."""
    rule = rule or update_rule(config)
    return rule.build(trained_parameters(model), lr=config.lr, weight_decay=config.weight_decay,
                      betas=(config.beta1, config.beta2))


def peak_rates(optimizer: torch.optim.Optimizer) -> list[float]:
    """Each param group's rate as the optimizer was built: its peak, which the schedule scales."""
    return [group["lr"] for group in optimizer.param_groups]


def schedule_for(config: TrainConfig) -> Schedule:
    """The ``train.schedule`` component."""
    return registry().create("schedule", config.schedule)


def lr_factor(step: int, config: TrainConfig, schedule: Schedule | None = None) -> float:
    """The learning rate at ``step`` (0-based) as a fraction of the peak (``config.lr``)."""
    schedule = schedule or schedule_for(config)
    return schedule.factor(step, config.steps, config.warmup, config.min_lr_ratio)


def set_learning_rate(optimizer: torch.optim.Optimizer, peaks: list[float], factor: float) -> None:
    """The schedule, applied: every group's rate is its peak times ``factor`` (the one place the
    rates change)."""
    for group, peak in zip(optimizer.param_groups, peaks):
        group["lr"] = peak * factor


def loss_terms(config: TrainConfig) -> dict[str, float]:
    """The objective's extra terms a model's loss takes as keywords (``label_smoothing``,
    ``z_loss``), only those that are not 0: a run without them calls the loss as it always did."""
    terms = {"label_smoothing": config.label_smoothing, "z_loss": config.z_loss}
    return {name: value for name, value in terms.items() if value}
