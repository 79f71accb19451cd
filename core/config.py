"""The schemas of a recipe's ``runtime:`` and ``train:`` sections, as frozen dataclasses.

They sit here, beside nothing but the schema types, because two layers read them: the recipe parser
validates the sections against them (``seqzoo.recipe``) and the trainer runs with them
(``seqzoo.train.training``). Neither has to import the other for it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch

from .schema import (
    Check,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Probability,
    Spec,
    UnitInterval,
)


def device_problem(name: str) -> str | None:
    """What is wrong with a device name (one torch does not know, such as ``tpu``), or None; whether
    the device is there is asked only when a model is built on it."""
    if name == "auto":
        return None
    try:
        torch.device(name)
    except RuntimeError:
        return f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or meta"
    return None


#: A device name, refused when the recipe is read if torch does not know it.
Device = Annotated[str, Check(device_problem)]


@dataclass(frozen=True)
class RuntimeConfig:
    """Where and how a built model runs.

    device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:N`` or ``meta``.
    dtype: parameter dtype. compile: wrap the model in ``torch.compile``. threads: CPU threads for
    torch's kernels (null = torch's default, one per core; ``seqzoo train --threads`` overrides).
    """

    device: Device = "auto"
    dtype: Literal["float32", "float16", "bfloat16", "float64"] = "float32"
    compile: bool = False
    threads: PositiveInt | None = None


@dataclass(frozen=True)
class LoraConfig:
    """The ``train.lora:`` section: low-rank adapters (Hu et al., 2021) through peft.

    rank: r (8). alpha: the update is scaled by alpha / r (16). dropout: on the adapters' input
    (0). targets: the module names (or name endings) peft wraps (qkv_proj, out_proj; add gate, up,
    down for the MLP). adapter: also write the trained adapter alone to this safetensors file
    (null). The checkpoint holds the merged weights, so it loads, generates and exports as any.
    """

    rank: PositiveInt = 8
    alpha: PositiveFloat = 16.0
    dropout: Probability = 0.0
    targets: tuple[str, ...] = ("qkv_proj", "out_proj")
    adapter: str | None = None


@dataclass(frozen=True)
class TrainConfig:
    """The ``train:`` section of a recipe.

    task: a ``task`` component (copy). steps: optimizer steps (1000). batch_size: examples per step
    and process (32). lr: peak learning rate (3e-4). optimizer: an ``optimizer`` component, by name
    or with options (adamw; also muon, adafactor, sgd). warmup: linear warm-up steps (100).
    schedule: a ``schedule`` component (cosine; also linear, constant, wsd, inverse_sqrt).
    min_lr_ratio: where the decay ends, as a fraction of lr (0.1). weight_decay: decay of weight
    matrices (0.01; vectors — norms and biases — are not decayed, nor what a module lists in
    ``no_weight_decay``, such as Mamba's A_log). beta1, beta2: the betas of Adam's moment estimates
    (adamw, and muon's AdamW part) (0.9, 0.95). label_smoothing: ε, the training target's share
    spread evenly over the vocabulary (0; the Transformer's 0.1). z_loss: λ, a coefficient on
    log²Z, the squared log-partition of each labelled position's logits (0; PaLM's 1e-4). Both
    shape the training objective only; held-out loss is plain cross-entropy. grad_clip: clip
    the global gradient norm to this (1.0; null = off). eval_every: evaluate every N steps (0 =
    at the end only). eval_examples: held-out examples per evaluation (256). log_every: a history
    entry every N steps (10). save_every: write the checkpoint every N steps (0 = at the end).
    tokens: a token budget instead of ``steps`` (null): the run takes the steps that read this many
    tokens (token tasks only). accumulate: micro-batches per optimizer step (1; gradient
    accumulation, each of ``batch_size`` rows). keep: how many of the last saves to keep as
    ``NAME.stepN.safetensors`` beside the checkpoint (1 = just the checkpoint). peak_flops: the
    device's peak FLOP/s for MFU (null = measured with large matrix products at start).
    seed: data, initialisation and dropout seed (0). precision: auto (bfloat16 autocast on CUDA, and
    on a CPU where a probe finds bfloat16 matrix products ≥ 1.5× faster, e.g. AMX or AVX-512 BF16;
    else float32) | float32 | bfloat16. parallel: ddp | fsdp under torchrun (ddp).
    init: a seqzoo checkpoint whose weights and tokenizer the run starts from (fine-tuning; the
    recipe's model must have the same tensors), or null for a fresh initialisation.
    freeze / trainable: glob patterns over parameter names (``decoder.blocks.0.*``, ``*norm*``):
    a parameter trains when it matches ``trainable`` (or it is empty) and not ``freeze``. lora: a
    ``LoraConfig`` (low-rank adapters; only they train, plus what ``trainable`` names).
    """

    task: Spec["task"] = "copy"
    steps: PositiveInt = 1000
    tokens: PositiveInt | None = None
    batch_size: PositiveInt = 32
    accumulate: PositiveInt = 1
    lr: PositiveFloat = 3e-4
    optimizer: Spec["optimizer"] = "adamw"
    warmup: NonNegativeInt = 100
    schedule: Spec["schedule"] = "cosine"
    min_lr_ratio: UnitInterval = 0.1
    weight_decay: NonNegativeFloat = 0.01
    beta1: UnitInterval = 0.9
    beta2: UnitInterval = 0.95
    label_smoothing: Probability = 0.0
    z_loss: NonNegativeFloat = 0.0
    grad_clip: PositiveFloat | None = 1.0
    eval_every: NonNegativeInt = 0
    eval_examples: PositiveInt = 256
    log_every: PositiveInt = 10
    save_every: NonNegativeInt = 0
    keep: PositiveInt = 1
    seed: NonNegativeInt = 0
    precision: Literal["auto", "float32", "bfloat16"] = "auto"
    parallel: Literal["ddp", "fsdp"] = "ddp"
    init: str | None = None
    freeze: tuple[str, ...] = ()
    trainable: tuple[str, ...] = ()
    lora: LoraConfig | None = None
    peak_flops: PositiveFloat | None = None
