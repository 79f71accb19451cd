"""Recipe -> model."""
from __future__ import annotations

import contextlib
import os

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..builder import Parts
from ..config import device_problem
from ..errors import ConfigError, SeqzooError
from ..interfaces import LanguageModel
from ..recipe import Resolved, resolve
from ..registry import registry
from ..schema import call_with, dotted

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}


def pick_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; a CUDA device that is not there is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    problem = device_problem(name)
    if problem:
        raise SeqzooError(problem)
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        why = (f"torch {torch.__version__} is a CPU-only build" if torch.version.cuda is None
               else "no CUDA GPU is visible")
        raise SeqzooError(f"device {name!r}: CUDA is not available on this machine ({why}); use cpu, or "
                          f"auto, which takes CUDA only when it is there")
    return device


def build(recipe: str | os.PathLike | dict, overrides: list[str] | None = None,
          device: str | torch.device | None = None, dtype: str | torch.dtype | None = None) -> nn.Module:
    """Build the model a recipe describes.

    ``recipe`` is a path, a shipped recipe's name (``"gpt2"``) or a dict; ``overrides`` are
    ``"key.path=value"`` strings. ``device``/``dtype`` override the recipe's ``runtime`` section;
    ``device="meta"`` builds the structure without allocating parameters. The resolved recipe is
    kept as ``model.recipe``.
    """
    return instantiate(resolve(recipe, overrides), device, dtype)


def instantiate(resolved: Resolved, device: str | torch.device | None = None,
                dtype: str | torch.dtype | None = None, *, initialise: bool = True) -> nn.Module:
    """The model of a validated recipe. ``initialise=False`` skips the random initialisation of
    the parameters (their values are about to be loaded from a checkpoint); everything else a
    constructor computes, buffers included, is computed as usual."""
    data = resolved.data
    runtime = data["runtime"]
    target = device if isinstance(device, torch.device) else pick_device(device or runtime["device"])
    if isinstance(dtype, torch.dtype):
        torch_dtype = dtype
    else:
        name = dtype or runtime["dtype"]
        if name not in DTYPES:
            raise SeqzooError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}")
        torch_dtype = DTYPES[name]
    params = dict(data["model"])
    components = registry()
    component = components.get("model", params.pop("kind"))
    parts = Parts(components)
    try:
        if target.type != "meta":
            with torch.device("meta"), SkipInit():  # the structure alone, to refuse what cannot fit
                check_fits(call_with(component.cls, params, parts), torch_dtype, target)
        # On the target device and in the target dtype from the start (mamba_ssm's factory_kwargs):
        # a bfloat16 model never exists in float32, so building one costs its own size, not 3×.
        skip = SkipInit() if target.type == "meta" or not initialise else contextlib.nullcontext()
        with target, parameters_in(torch_dtype, keep_values=initialise), skip:
            model = call_with(component.cls, params, parts)
    except ConfigError as error:
        raise resolved.error(resolved.path_of(error.spec, ("model",)), str(error)) from None
    model.to(dtype=torch_dtype)  # the buffers (built in float32, as the code that fills them expects)
    if isinstance(model, LanguageModel):  # .to() keeps ties, but a plugin may rebuild its head
        model.tie_weights()
    model.recipe = data
    model.components = provenance(resolved)
    return model


class SkipInit(TorchFunctionMode):
    """Random and constant initialisation of a parameter does nothing: a meta tensor has no values,
    and a parameter about to be loaded from a checkpoint needs none. Skipping the fills of meta
    tensors also skips torch's Python meta kernels for ``normal_`` and ``uniform_``, whose first
    call imports torch._dynamo (over a second): a structure-only build (``seqzoo show``, the size
    check before every build) costs milliseconds. Only parameters are skipped (and meta tensors):
    a buffer's values come from its constructor alone."""

    FILLS = frozenset({"normal_", "uniform_", "trunc_normal_", "zeros_", "ones_", "constant_", "zero_", "fill_",
                       "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "orthogonal_"})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensor = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes it by keyword
        if (isinstance(tensor, torch.Tensor) and (tensor.is_meta or isinstance(tensor, nn.Parameter))
                and getattr(func, "__name__", "") in self.FILLS):
            return tensor
        return func(*args, **kwargs)


@contextlib.contextmanager
def parameters_in(dtype: torch.dtype, keep_values: bool = True):
    """While building, every floating-point parameter is made in ``dtype`` as it is registered,
    before its module initialises it: a constructor's ``torch.empty`` in float32 is never filled
    (its pages are never touched), only its ``dtype`` copy is. ``keep_values=False`` (the values
    are about to be loaded) makes the copy empty: nothing is converted at all. Buffers keep the
    dtype their constructor gives them (``.to(dtype)`` casts them once the model is built), so
    tables such as RoPE's frequencies are computed in float32 as before."""
    def cast(module: nn.Module, name: str, parameter: nn.Parameter | None) -> nn.Parameter | None:
        if parameter is None or not parameter.is_floating_point() or parameter.dtype == dtype:
            return None
        data = parameter.detach()
        data = data.to(dtype) if keep_values else torch.empty_like(data, dtype=dtype)
        return nn.Parameter(data, requires_grad=parameter.requires_grad)

    handle = nn.modules.module.register_module_parameter_registration_hook(cast)
    try:
        yield
    finally:
        handle.remove()


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on ``device`` (None when it cannot be told)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(skeleton: nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    """Refuse, before allocating, a model whose parameters alone exceed the free memory."""
    size = sum(p.numel() for p in skeleton.parameters()) * torch.empty((), dtype=dtype).element_size()
    free = available_memory(device)
    if free is not None and size > free:
        gib = 1 << 30
        raise SeqzooError(f"the model's parameters need {size / gib:.1f} GiB in {str(dtype)[6:]} but only "
                          f"{free / gib:.1f} GiB is free on {device}; build it with device='meta' to "
                          f"inspect it, or pick a smaller recipe")


def provenance(resolved: Resolved) -> dict[str, dict[str, str]]:
    """Which plugin, distribution and version provided each component the recipe names."""
    reg = registry()
    out = {}
    for path, kind, name in resolved.components:
        component = reg.get(kind, name)
        out[dotted(path)] = {"kind": kind, "name": name, "plugin": component.plugin,
                             "distribution": component.distribution, "version": component.version}
    return out
