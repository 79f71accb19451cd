"""Low-rank adapters (LoRA; Hu et al., 2021) through peft, and which parameters a run trains.

peft's ``inject_adapter_in_model`` wraps seqzoo's projections as they are: they are
``nn.Linear`` subclasses, so peft's LoRA ``Linear`` takes them as its base layer and adds
W x + (α / r)·B A x with A (r, C_in), B (C_out, r), B = 0 at the start. Nothing in seqzoo needed
changing for it, which is why this uses peft rather than a LoRA of its own. A checkpoint always
holds the merged weights (W + (α / r)·B A under the layer's own name), so it loads, generates
and exports to Hugging Face like any other; ``save_adapter`` keeps the adapter alone as well.
"""
from __future__ import annotations

import fnmatch
import json
from pathlib import Path

from torch import Tensor, nn

from ..config import LoraConfig, TrainConfig
from ..errors import InputError


def _peft():
    try:
        import peft
        from peft.tuners.lora import LoraLayer
    except ImportError:
        raise InputError("train.lora needs peft: pip install 'seqzoo[lora]' (or pip install peft)") from None
    return peft, LoraLayer


def add_lora(model: nn.Module, spec: LoraConfig) -> int:
    """Wrap the modules ``spec.targets`` names with adapters; returns how many were wrapped."""
    peft, layer_type = _peft()
    config = peft.LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                             target_modules=list(spec.targets))
    try:
        peft.inject_adapter_in_model(config, model)
    except ValueError as error:  # no module matched
        raise InputError(f"train.lora.targets {list(spec.targets)}: {error}") from None
    return sum(isinstance(m, layer_type) for m in model.modules())


def has_lora(model: nn.Module) -> bool:
    try:
        _, layer_type = _peft()
    except InputError:
        return False
    return any(isinstance(m, layer_type) for m in model.modules())


def choose_trainable(model: nn.Module, config: TrainConfig) -> tuple[int, int]:
    """Set requires_grad by ``train.trainable`` / ``train.freeze`` (and LoRA: the adapters, plus
    what ``trainable`` names); returns (trainable parameters, all parameters)."""
    lora = config.lora is not None
    for name, p in model.named_parameters():
        named = any(fnmatch.fnmatchcase(name, pattern) for pattern in config.trainable)
        if lora:
            wanted = "lora_" in name or named
        else:
            wanted = named or not config.trainable
        p.requires_grad_(wanted and not any(fnmatch.fnmatchcase(name, pattern) for pattern in config.freeze))
    counts = [(p.numel(), p.requires_grad) for p in model.parameters()]
    trainable = sum(n for n, grad in counts if grad)
    if not trainable:
        raise InputError(f"train.freeze {list(config.freeze)} / trainable {list(config.trainable)} leave no "
                         f"parameter to train")
    return trainable, sum(n for n, _ in counts)


def merged_state(model: nn.Module, state: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
    """The model's state dict under its own names with every adapter merged in (W + (α / r)·B A);
    the model is not changed. ``state``: the state dict to read (default: the model's)."""
    _, layer_type = _peft()
    state = dict(model.state_dict() if state is None else state)
    for prefix, module in model.named_modules():
        if not isinstance(module, layer_type):
            continue
        base = f"{prefix}.base_layer."
        delta = sum(module.get_delta_weight(name) for name in module.active_adapters)
        weight = state.pop(base + "weight")
        state[f"{prefix}.weight"] = weight + delta.to(weight.dtype)
        if base + "bias" in state:
            state[f"{prefix}.bias"] = state.pop(base + "bias")
        for key in [k for k in state if k.startswith(f"{prefix}.lora_")]:
            del state[key]
    return state


def merge_lora(model: nn.Module) -> nn.Module:
    """Merge every adapter into its layer and put the plain layer back in its place (in place)."""
    _, layer_type = _peft()
    for prefix, module in list(model.named_modules()):
        if isinstance(module, layer_type):
            module.merge()
            parent_name, _, child = prefix.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, module.get_base_layer())
    return model


def save_adapter(model: nn.Module, path: str | Path, spec: LoraConfig) -> Path:
    """The adapter tensors alone (peft's names), with the LoRA settings in the metadata."""
    from safetensors.torch import save_file

    peft, _ = _peft()
    tensors = {k: v.detach().cpu().contiguous() for k, v in peft.get_peft_model_state_dict(model).items()}
    meta = {"seqzoo.lora": json.dumps({"rank": spec.rank, "alpha": spec.alpha, "targets": list(spec.targets)})}
    path = Path(path)
    save_file(tensors, str(path), metadata=meta)
    return path
