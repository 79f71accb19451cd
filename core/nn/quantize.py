"""Reduced-precision weights for decoding: ``to_dtype(model, "bfloat16")`` casts every weight,
``quantize(model, "int8")`` keeps int8 weights with one float scale per output row in every linear
layer (torchao's weight-only int8: ``pip install torchao``), the LM head included, and
``quantize(model, "int8-dynamic")`` also rounds each layer's input to int8 per token on the fly and
multiplies in integers (``Int8DynamicLinear``).

Why a module of seqzoo's own for the dynamic kind, beside torchao's: on SmolLM2-135M (AMD EPYC, 2
threads, compiled) torchao's ``Int8DynamicActivationInt8WeightConfig`` decoded at 29 ms a token —
slower than float32's 24–27 — because dynamo guards its 151 tensor-subclass weights every step (6
ms) and its graph copies between them; the same integer products from plain int8 buffers take 13.3
ms a token (docs/performance.md, "Decoding against llama.cpp"). Weight-only int8 over float32
activations dequantises each weight before a float32 product, so it reads a quarter of the bytes
and still computes on four (over bfloat16 activations, ``--dtype bfloat16 --quantize int8``, torch's
``_weight_int8pack_mm`` reads the int8 weight directly); the integer product (oneDNN's VNNI kernels
behind ``torch._int_mm``) is what makes the quarter pay most.

Token-by-token decoding at batch 1 is bound by reading the weights: half the bytes (bfloat16) or a
quarter (int8) is the whole gain there. A tied LM head gets a copy of its own first: the embedding
table stays as it is (a lookup reads one row), the head's product reads the quantized copy (a
later ``tie_weights()`` would share the float table again: slower, not wrong).
The activations between layers, the KV cache's type and the loss are untouched by ``quantize``
(``int8-dynamic`` rounds only each linear layer's own input, inside it); under ``to_dtype`` the
model computes in that type, its recurrent states in float32 (the mixers keep them so).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import InputError

QUANTIZATIONS = ("int8", "int8-dynamic")


def quantize(model: nn.Module, kind: str) -> nn.Module:
    """``model`` with the weights of its linear layers quantized to ``kind``, in place: ``int8``
    (weight-only, torchao) or ``int8-dynamic`` (int8 weights and per-token int8 inputs, integer
    products; the CPU only)."""
    if kind not in QUANTIZATIONS:
        raise InputError(f"--quantize {kind}: not a quantization seqzoo knows; use one of {', '.join(QUANTIZATIONS)}")
    if kind == "int8-dynamic":
        return _quantize_dynamic(model)
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


class Int8DynamicLinear(nn.Module):
    """A linear layer with int8 weights, one float32 scale per output row, that rounds its input to
    int8 per row (token) as it comes and multiplies in integers:

        s_x = max|x| / 127,  x_q = round(x / s_x);   s_W = max_row|W| / 127,  W_q = round(W / s_W)
        y = (x_q W_qᵀ) · s_x · s_Wᵀ + b          x (..., C_in) -> y (..., C_out), in x's dtype

    The product is ``torch._int_mm`` (int8 × int8 -> int32; oneDNN's VNNI kernels on the CPU), so a
    token reads one byte per weight and converts nothing but its own row. Symmetric rounding to
    ±127 keeps every product of two codes inside int32 for C_in up to 133,000. The buffers are plain
    tensors, so a compiled decode step guards them as cheaply as float weights."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight_int8", (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("weight_scale", scale)
        self.bias = linear.bias

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float()
        scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny) / 127
        codes = (rows / scale).round().to(torch.int8)
        y = torch._int_mm(codes, self.weight_int8.t()) * scale * self.weight_scale
        y = y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return y if self.bias is None else y + self.bias

    @property
    def weight(self) -> Tensor:
        """The dequantized matrix W_q · s_W (C_out, C_in), float32, for code that reads a layer's
        weight rather than calling it (MLA's absorbed decoding, a mixer's state dtype)."""
        return self.weight_int8.float() * self.weight_scale[:, None]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _quantize_dynamic(model: nn.Module) -> nn.Module:
    """Every ``nn.Linear`` of ``model`` replaced by an ``Int8DynamicLinear``, in place."""
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise InputError(f"--quantize int8-dynamic runs on the CPU, and this model is on {device} "
                         "(torch._int_mm's CUDA kernel needs more than 16 rows); use --quantize int8 there")
    untie_heads(model)
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, nn.Linear):
                setattr(module, name, Int8DynamicLinear(child))
    return model
