"""Reduced-precision weights for decoding: ``to_dtype(model, "bfloat16")`` casts every weight,
``quantize(model, "int8")`` keeps int8 weights with one float scale per output row in every linear
layer (torchao's weight-only int8: ``pip install torchao``), the LM head included.

Token-by-token decoding at batch 1 is bound by reading the weights: half the bytes (bfloat16) or a
quarter (int8) is the whole gain there. A tied LM head gets a copy of its own first: the embedding
table stays as it is (a lookup reads one row), the head's product reads the quantized copy (a
later ``tie_weights()`` would share the float table again: slower, not wrong).
Activations, the KV cache's type and the loss are untouched by ``quantize``; under ``to_dtype`` the
model computes in that type, its recurrent states in float32 (the mixers keep them so).
"""
from __future__ import annotations

import torch
from torch import nn

from ..errors import InputError

QUANTIZATIONS = ("int8",)


def quantize(model: nn.Module, kind: str) -> nn.Module:
    """``model`` with the weights of its linear layers quantized to ``kind`` (int8), in place."""
    if kind not in QUANTIZATIONS:
        raise InputError(f"--quantize {kind}: not a quantization seqzoo knows; use one of {', '.join(QUANTIZATIONS)}")
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        raise InputError("--quantize int8 needs torchao: pip install torchao (or pip install 'seqzoo[quantize]')") \
            from None
    untie_heads(model)
    quantize_(model, Int8WeightOnlyConfig())
    return model


def untie_heads(model: nn.Module) -> None:
    """Give every linear layer that shares its weight with another module (a tied LM head) a copy of
    its own, so quantizing it leaves the embedding table as it was."""
    owners: dict[int, int] = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            owners[id(parameter)] = owners.get(id(parameter), 0) + 1
    for module in model.modules():
        if isinstance(module, nn.Linear) and owners[id(module.weight)] > 1:
            module.weight = nn.Parameter(module.weight.detach().clone(), requires_grad=False)


def to_dtype(model: nn.Module, dtype: str) -> nn.Module:
    """``model`` with its floating-point weights cast to ``dtype`` (float32 | bfloat16 | float16)."""
    target = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
    if target is None:
        raise InputError(f"--dtype {dtype}: use float32, bfloat16 or float16")
    return model.to(target)
