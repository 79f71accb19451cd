"""What training needs to run on several processes and to stop and resume: the torchrun environment
(``Distributed``), DDP or FSDP2 wrapping, gradient synchronisation across micro-batches, the
parameters weight decay spares, and the optimizer and model state gathered for a checkpoint."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..config import TrainConfig
from ..interfaces import Part
from ..io.checkpoint import upgrade_name


@dataclass
class Distributed:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> "Distributed":
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls()
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(local)
        return cls(dist.get_rank(), world, local)

    def from_first(self, flag: bool, device: torch.device) -> bool:
        """Rank 0's ``flag`` on every rank: a choice each rank made for itself (the precision probe,
        timed on each rank's cores) made one, so every rank computes alike."""
        if self.world == 1:
            return flag
        import torch.distributed as dist

        t = torch.tensor([int(flag)], device=device)
        dist.broadcast(t, 0)
        return bool(t.item())

    def average(self, value: float, device: torch.device) -> float:
        if self.world == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], device=device, dtype=torch.float64)
        dist.all_reduce(t)
        return t.item() / self.world


def wrap(model: nn.Module, config: TrainConfig, dist_info: Distributed, device: torch.device) -> nn.Module:
    if dist_info.world == 1:
        return model
    if config.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for module in model.shard_units():  # shard layer by layer, then the rest
            fully_shard(module)
        return fully_shard(model)
    return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def undecayed(model: nn.Module) -> set[int]:
    """ids of the parameters a part names in its ``no_weight_decay`` (Mamba's A_log and D, which
    the reference implementation keeps out of weight decay: decay would pull every state's decay
    rate A = −exp(A_log) towards −1)."""
    return {id(module.get_parameter(name)) for module in model.modules() if isinstance(module, Part)
            for name in module.no_weight_decay}


def train_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict]:
    """Optimizer tensors (by parameter name) and JSON-able optimizer settings, on the CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    _, optim = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    tensors = {}
    if not optim:  # a rank other than 0: the full state was gathered to rank 0 only
        return tensors, {}
    for name, state in optim["state"].items():
        for key, value in state.items():
            tensors[f"optim.{name}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    groups = [{k: v for k, v in group.items() if k != "params"} | {"params": list(group["params"])}
              for group in optim["param_groups"]]
    return tensors, {"param_groups": groups}


def load_train_state(model: nn.Module, optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor],
                     settings: dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    state: dict[str, dict[str, Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            name, field = key[len("optim."):].rsplit(".", 1)
            state.setdefault(upgrade_name(name), {})[field] = value  # a run saved before the slot was renamed
    # The settings came through JSON: a tuple (AdamW's betas, Adafactor's eps, Muon's coefficients)
    # is a tuple again where the fresh optimizer's group holds one.
    groups = [{k: tuple(v) if isinstance(v, list) and isinstance(live.get(k), tuple) else v for k, v in g.items()}
              for g, live in zip(settings["param_groups"], optimizer.param_groups)]
    for group in groups:
        group["params"] = [upgrade_name(name) if isinstance(name, str) else name for name in group["params"]]
    set_state_dict(model, optimizer, model_state_dict={}, optim_state_dict={"state": state, "param_groups": groups},
                   options=StateDictOptions(full_state_dict=True, strict=False))


def model_state(model: nn.Module) -> dict[str, Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))



@contextlib.contextmanager
def gradient_sync(model: nn.Module, sync: bool):
    """DDP's ``no_sync`` / FSDP2's ``set_requires_gradient_sync`` for the micro-batches before the
    last of a step; nothing for a model that is not distributed."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        with contextlib.nullcontext() if sync else model.no_sync():
            yield
        return
    if callable(getattr(model, "set_requires_gradient_sync", None)):  # FSDP2's fully_shard, external
        model.set_requires_gradient_sync(sync)
    yield


