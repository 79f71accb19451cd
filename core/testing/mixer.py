"""Checks of kind ``mixer``: shapes, causality, step-by-step decoding, left padding, reordered
rows, dtypes, gradients, and (for a ``causal_only`` mixer) a long sequence without autograd; and
the helpers a recurrent mixer's tests share: ``matches_reference`` (the mixer against its plain
recurrence in ``seqzoo.reference``), ``relative_difference``, ``gradients_match_reference`` (a
chunked form's float32 gradients against the recurrence's float64 ones), ``segments_equivalence``,
``bfloat16_equivalence`` and ``kernel_paths_agree`` (fla's CUDA kernels against the torch path)."""
from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Collection
from types import FunctionType

import torch
from torch import Tensor, nn

from ..interfaces import Mixer, MixerContext, MixerState
from ..nn.attention import self_attention_inputs
from ..nn.cache import DecodeCache
from ..registry import registry
from ._shared import (
    B,
    C,
    D,
    H,
    check_dtypes,
    gradcheck,
    spec,
    stacked_rows_add_up,
    state_dict_round_trip,
)

#: Tokens of the kit's long sequence: past the 1024-token segments seqzoo's recurrent mixers run
#: without autograd (``plugins/mixer/_segments.py``), so its last segment is a short one. It has no
#: padding: a padded attention branch (a parallel layer's) that long takes FlexAttention's path,
#: whose first call compiles for seconds; padding across segments is the tests' to check, with
#: ``SEGMENT`` shortened (``segments_equivalence``).
LONG = 1100


def _context(q_pos: Tensor, **inputs: object) -> MixerContext:
    """A causal self-attention context for the tokens at ``q_pos``, with no position scheme."""
    position = registry().create("position", "none", C, D, H, 64)
    return self_attention_inputs(position, q_pos, causal=True, **inputs)


def _full(mixer: nn.Module, inputs: Tensor, padding: Tensor | None = None) -> Tensor:
    """The whole sequence in one forward, without a state."""
    return mixer(inputs, _context(torch.arange(inputs.shape[1])[None], key_padding=padding))


def _pieces(mixer: nn.Module, inputs: Tensor, padding: Tensor | None = None,
            reorder_at: int | None = None) -> tuple[Tensor, Tensor]:
    """The first 3 tokens, then one at a time, through a decode state -> (outputs, row order)."""
    cache = DecodeCache([mixer.new_state(inputs.shape[0], inputs.shape[1], dtype=inputs.dtype)],
                        inputs.shape[0], inputs.shape[1])
    rows = torch.arange(inputs.shape[0])
    outs = []
    for start, end in [(0, 3), *((t, t + 1) for t in range(3, inputs.shape[1]))]:
        if reorder_at == start:  # as beam search does: the state's rows change places
            perm = torch.arange(inputs.shape[0]).flip(0)
            cache.reorder(perm)
            rows, outs = rows[perm], [o[perm] for o in outs]
        seen = padding[rows, :end] if padding is not None else None
        q_pos = torch.arange(start, end)[None]
        outs.append(mixer(inputs[rows, start:end], _context(q_pos, cache=cache, key_padding=seen), cache.states[0]))
        cache.advance(q_pos)
    return torch.cat(outs, dim=1), rows


def checks(name: str, params: dict) -> dict[str, Callable[[], None]]:
    """Token mixers: (B, T, C) -> (B, T, C), causal, and decoding piece by piece through their
    state (left-padded rows included, rows reordered midway) equal to the full forward; a
    ``causal_only`` mixer's ``LONG`` tokens without autograd (in segments, for seqzoo's) equal to
    the same with autograd (``segments_equivalence``); declared ``stacked_rows`` that add up."""
    make = lambda: registry().create("mixer", spec(name, params), C)  # noqa: E731
    length = 9
    x = torch.randn(B, length, C)

    def shapes() -> None:
        with torch.no_grad():
            out = _full(make().eval(), x)
        if out.shape != x.shape:
            raise AssertionError(f"output shape {tuple(out.shape)} differs from the input's {tuple(x.shape)}")

    def causality() -> None:
        mixer = make().eval()
        changed = x.clone()
        changed[:, 6:] = torch.randn(B, length - 6, C)
        with torch.no_grad():
            worst = (_full(mixer, x)[:, :6] - _full(mixer, changed)[:, :6]).abs().max().item()
        if worst > 0:
            raise AssertionError(f"a later token changed an earlier output by {worst:.2e}")

    def decode_steps() -> None:
        mixer = make().eval()
        with torch.no_grad():
            worst = (_pieces(mixer, x)[0] - _full(mixer, x)).abs().max().item()
        if worst > 1e-5:
            raise AssertionError(f"decoding through the state differs from the full forward by {worst:.2e}")

    def left_padding() -> None:
        mixer = make().eval()
        padding = torch.ones(B, length, dtype=torch.long)
        padding[1, :2] = 0
        with torch.no_grad():
            alone = _full(mixer, x[1:, 2:])[0]
            padded = _full(mixer, x, padding)[1, 2:]
            stepped = _pieces(mixer, x, padding)[0][1, 2:]
        worst = max((padded - alone).abs().max().item(), (stepped - alone).abs().max().item())
        if worst > 1e-5:
            raise AssertionError(f"left padding changed a real token's output by {worst:.2e}")

    def state_reorder() -> None:
        mixer = make().eval()
        with torch.no_grad():
            out, rows = _pieces(mixer, x, reorder_at=5)
            worst = (out - _full(mixer, x[rows])).abs().max().item()
        if worst > 1e-5:
            raise AssertionError(f"after reordering the state's rows, decoding differs by {worst:.2e}")

    def dtypes() -> None:
        check_dtypes(make, lambda m, dt: _full(m, x.to(dt)))

    def gradients() -> None:
        mixer = make().double()
        gradcheck(lambda inputs: _full(mixer, inputs), x[:1, :3])

    def state_dict() -> None:
        state_dict_round_trip(make, lambda m: _full(m, x))

    def long_without_autograd() -> None:
        segments_equivalence(make().eval(), length=LONG, pad=0)

    def stacked_rows() -> None:
        stacked_rows_add_up(make())

    named = {"shapes": shapes, "causality": causality, "decode_steps": decode_steps, "left_padding": left_padding,
             "state_reorder": state_reorder, "dtypes": dtypes, "gradients": gradients, "state_dict": state_dict,
             "stacked_rows": stacked_rows}
    if registry().get("mixer", name).cls.causal_only:  # a recurrence: its long inputs may run in segments
        named["long_without_autograd"] = long_without_autograd
    return named


def state_tensors(state: MixerState, prefix: str = "") -> dict[str, Tensor]:
    """A decoding state's tensors by name, those of the states inside it included (a parallel
    layer's branches: ``states.0.S``); other attributes are left out."""
    found = {}
    for name, value in vars(state).items():
        items = enumerate(value) if isinstance(value, list | tuple) else [(None, value)]
        for index, item in items:
            key = prefix + name + ("" if index is None else f".{index}")
            if isinstance(item, Tensor):
                found[key] = item
            elif isinstance(item, MixerState):
                found.update(state_tensors(item, key + "."))
    return found


def segments_equivalence(mixer: Mixer, *, length: int = 150, pad: int = 11, atol: float = 1e-5, rtol: float = 1e-5,
                         state_atol: float | None = None, state_rtol: float | None = None) -> None:
    """Without autograd, a long sequence gives the outputs and the state it gives with autograd.

    x (2, ``length``, C), the second row left-padded by ``pad`` tokens (0: no padding mask), runs
    once with autograd on and once without, each from a fresh state (in a ``DecodeCache``); the
    outputs must agree within ``atol``/``rtol``, every tensor of the states after them within
    ``state_atol``/``state_rtol`` (the same by default; 0 and 0: equal). seqzoo's recurrent
    mixers run such a sequence in segments when no gradient is wanted
    (``plugins/mixer/_segments.py``): a test that sets its ``SEGMENT`` to 8 first cuts 150 tokens
    into 19 segments, the padding across the first one's end. A mixer that never segments passes
    as it is. Raises AssertionError naming what differs.
    """
    batch = 2
    x = torch.randn(batch, length, mixer.dim)
    padding = torch.ones(batch, length, dtype=torch.long) if pad else None
    if padding is not None:
        padding[1, :pad] = 0
    runs = []
    for grad in (True, False):
        cache = DecodeCache([mixer.new_state(batch, length)], batch, length)
        with torch.set_grad_enabled(grad):
            out = mixer(x, _context(torch.arange(length)[None], cache=cache, key_padding=padding), cache.states[0])
        runs.append((out.detach(), {k: v.detach() for k, v in state_tensors(cache.states[0]).items()}))
    (whole, whole_state), (cut, cut_state) = runs
    torch.testing.assert_close(cut, whole, atol=atol, rtol=rtol,
                               msg=lambda m: f"the outputs without autograd differ from those with it: {m}")
    state_atol, state_rtol = (atol, rtol) if state_atol is None else (state_atol, state_rtol)
    for name, value in whole_state.items():
        torch.testing.assert_close(cut_state[name], value, atol=state_atol, rtol=state_rtol,
                                   msg=lambda m, name=name: f"the state's {name} without autograd differs: {m}")


def bfloat16_equivalence(mixer: Mixer, *, inputs: Collection[str] = (), length: int = 40,
                         tolerance: float = 0.05, autocast: bool = True) -> None:
    """bfloat16 stays close to float32, with the recurrence's state kept in float32.

    On x (2, ``length``, C) rounded to bfloat16: a bfloat16 copy of the float32 ``mixer`` (from a
    bfloat16 state), and ``mixer`` itself under autocast to bfloat16 (unless not ``autocast``),
    give outputs within ``tolerance`` · max |y| of ``mixer``'s own in float32. The copy's output
    is bfloat16; every floating tensor of both states is float32, except those named in
    ``inputs``: histories of inputs (a conv's ``conv``, a token shift's ``shift``), which the copy
    keeps in bfloat16 (under autocast their dtype is the layers' before them'). Raises
    AssertionError naming what differs.
    """
    x = torch.randn(2, length, mixer.dim).bfloat16()
    low_mixer = copy.deepcopy(mixer).to(torch.bfloat16)
    context = _context(torch.arange(length)[None])
    states = {"bfloat16": low_mixer.new_state(2, length, dtype=torch.bfloat16)}
    with torch.no_grad():
        high = mixer(x.float(), context)
        outputs = {"bfloat16": low_mixer(x, context, states["bfloat16"])}
        if autocast:
            states["autocast"] = mixer.new_state(2, length)
            with torch.autocast(x.device.type, dtype=torch.bfloat16):  # the recurrence opts out of autocast
                outputs["autocast"] = mixer(x.float(), context, states["autocast"])
    if outputs["bfloat16"].dtype != torch.bfloat16:
        raise AssertionError(f"bfloat16 inputs gave a {outputs['bfloat16'].dtype} output")
    for path, state in states.items():
        for name, value in state_tensors(state).items():
            want = torch.float32 if name not in inputs else torch.bfloat16 if path == "bfloat16" else None
            if value.is_floating_point() and want is not None and value.dtype != want:
                raise AssertionError(f"{path}: the state's {name} is {value.dtype}, not {want}")
    for path, out in outputs.items():
        worst = (out.float() - high).abs().max().item()
        if not worst <= tolerance * high.abs().max().item():
            raise AssertionError(f"{path} differs from float32 by {worst:.2e}, over {tolerance} of the largest output")


Reference = Callable[..., tuple[Tensor, object]]  # a recurrence of seqzoo.reference: (outputs, final state)


def matches_reference(mixer: Mixer, reference: Reference, adapter: Callable[[Mixer, Tensor, Reference], Tensor],
                      *, batch: int = 2, length: int = 11, tolerance: float = 1e-9, seed: int = 0) -> None:
    """Check a token mixer against a recurrence of ``seqzoo.reference``: in float64, on random input
    x (B, T, C), its whole-sequence forward and its decoding through ``new_state`` (3 tokens, then
    one at a time) both equal ``adapter(mixer, x, reference)`` -> (B, T, C), which computes the
    mixer's own projections, calls ``reference`` on them in place of the mixer's kernel, and
    applies the rest of the layer (gate, output projection) to its outputs::

        mixer = seqzoo.registry().create("mixer", {"kind": "linear_attention", "heads": 2}, 16)
        matches_reference(mixer, reference.linear_attention, lambda m, x, run: ...)

    The caller's mixer is left as it is: a float64 copy is checked, its parameters each moved by
    N(0, 0.1²) first, so one left at its initial ones or zeros (a norm's weight, a skip's D) still
    shows when the adapter leaves it out. ``tolerance`` bounds max |mixer − reference| over the
    largest |reference|. Raises AssertionError saying which path differs and by how much, or that
    the adapter never called ``reference`` (a check that compared nothing).
    """
    generator = torch.Generator().manual_seed(seed)
    mixer = copy.deepcopy(mixer).double().eval()
    calls = []

    def recorded(*args: object, **kwargs: object) -> tuple[Tensor, object]:
        calls.append(1)
        return reference(*args, **kwargs)

    label = reference.__name__ if isinstance(reference, FunctionType) else repr(reference)
    name = f"{type(mixer).__name__} against {label}"
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.1)
        x = torch.randn(batch, length, mixer.dim, generator=generator, dtype=torch.float64)
        expected = adapter(mixer, x, recorded)
        if not calls:
            raise AssertionError(f"{name}: the adapter never called the reference it was given, so nothing "
                                 f"was compared; run the mixer's inputs through it")
        scale = expected.abs().max().item() or 1.0
        paths = {"the whole-sequence forward": _full(mixer, x), "decoding through the state": _pieces(mixer, x)[0]}
        for path, out in paths.items():
            if out.shape != expected.shape:
                raise AssertionError(f"{name}: {path} gave {tuple(out.shape)}, the adapter {tuple(expected.shape)}")
            worst = (out - expected).abs().max().item() / scale
            if not worst <= tolerance:  # NaN fails too
                raise AssertionError(f"{name}: {path} differs by {worst:.1e} of the reference's largest value "
                                     f"({tolerance:.0e} allowed)")


Inputs = dict[str, Tensor | tuple[Tensor, ...] | None]  # a kernel's inputs by name


def _tensors(value: object) -> list[Tensor]:
    """The tensors of a tensor, None, or a (nested) tuple or list of them, in order."""
    if isinstance(value, Tensor):
        return [value]
    return [] if value is None else [t for item in value for t in _tensors(item)]


def relative_difference(got: object, want: object) -> float:
    """max |got − want| over max |want|, in float64, the worst over the tensors of two (nested)
    tuples of them: how far a chunked form is from its reference whatever their scale (a
    tolerance check ``relative_difference(...) <= 1e-12``; NaN, which fails it, where ``got`` is
    not finite). Where ``want`` is all zeros: 0 if ``got`` is too, else inf."""
    ratios = []
    for have, expected in zip(_tensors(got), _tensors(want), strict=True):
        difference, scale = (have.double() - expected.double()).abs().max().item(), expected.abs().max().item()
        ratios.append(difference / scale if scale else 0.0 if difference == 0 else math.inf)
    return math.nan if any(math.isnan(r) for r in ratios) else max(ratios, default=0.0)


def gradients_match_reference(chunked: Callable[[Inputs], object], reference: Callable[[Inputs], object],
                              inputs: Inputs, *, grad: Collection[str] | None = None,
                              dtype: torch.dtype = torch.float32, tolerance: float = 1e-4, seed: int = 5) -> None:
    """Every input's gradient through ``chunked`` in ``dtype`` (a chunked form, a scan) matches its
    gradient through ``reference`` in float64 (a token-by-token recurrence of ``seqzoo.reference``).

    ``inputs``: name -> a float64 tensor, a tuple of them (a state of several tensors) or None
    (an input left out). Each function takes the inputs as leaves (detached, in its dtype; those
    named in ``grad``, default all, requiring a gradient) and returns its outputs and final state
    (a tensor or a nested tuple of them). The loss is each of those times a random weight of its
    shape (N(0, 1) from ``seed``), summed, the same weights for both. Every checked gradient must be
    finite and within ``tolerance`` · max |reference's| of the reference's. Raises AssertionError
    naming the input.
    """
    checked = [name for name, value in inputs.items() if value is not None and (grad is None or name in grad)]
    generator, weights = torch.Generator().manual_seed(seed), []

    def grads(run: Callable[[Inputs], object], to: torch.dtype) -> dict[str, Tensor]:
        leaves: Inputs = {}
        for name, value in inputs.items():
            if isinstance(value, tuple):
                leaves[name] = tuple(t.detach().to(to).requires_grad_(name in checked) for t in value)
            else:
                leaves[name] = None if value is None else value.detach().to(to).requires_grad_(name in checked)
        outs = _tensors(run(leaves))
        if not weights:
            weights.extend(torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in outs)
        sum((t * w.to(to)).sum() for t, w in zip(outs, weights)).backward()
        found = {}
        for name in checked:
            parts = _tensors(leaves[name])
            found.update({name if len(parts) == 1 else f"{name}[{i}]": t.grad for i, t in enumerate(parts)})
        return found

    expected, got = grads(reference, torch.float64), grads(chunked, dtype)
    for name, want in expected.items():
        have = got[name]
        if have is None or want is None:
            raise AssertionError(f"{name}: no gradient reached it (chunked: {have is not None}, "
                                 f"reference: {want is not None})")
        worst = (have.double() - want).abs().max().item()
        if not (torch.isfinite(have).all() and worst <= tolerance * want.abs().max().item()):
            raise AssertionError(f"{name}: the {dtype} gradient differs from the float64 reference's by {worst:.2e} "
                                 f"(over {tolerance:.0e} of its largest)")


def kernel_paths_agree(mixer: Mixer, x: Tensor, *, tolerance: float, steps: int = 10, padding: Tensor | None = None,
                       floor: float = 0.0, paths: tuple[str, str] = ("fla", "torch")) -> None:
    """The same mixer through two kernel paths (``SEQZOO_SCAN``: ``fla`` takes flash-linear-attention's
    Triton kernels on CUDA, ``torch`` the plain chunked forms) gives the same results.

    x (B, T, C) on the mixer's device and dtype: the first T − ``steps`` tokens in one forward
    (``padding`` (B, T − steps) its mask, if given) from a fresh state, the backward of its squared
    sum, then ``steps`` decode steps. The output, the steps, x's gradient and the final state's
    floating tensors must agree within ``tolerance`` · max |second path's| + ``floor``, every
    parameter's gradient within ``tolerance`` · max + 1e-6. ``SEQZOO_SCAN`` is restored after.
    Raises AssertionError naming what differs.
    """
    batch, length, _ = x.shape
    prefix = length - steps

    def run(path: str) -> tuple[dict[str, Tensor], list[Tensor]]:
        saved = os.environ.get("SEQZOO_SCAN")
        os.environ["SEQZOO_SCAN"] = path
        try:
            mixer.zero_grad()
            leaf = x.detach().requires_grad_()
            state = mixer.new_state(batch, length, device=x.device, dtype=x.dtype)
            out = mixer(leaf[:, :prefix], _context(torch.arange(prefix, device=x.device)[None], key_padding=padding),
                        state)
            out.float().square().sum().backward()
            with torch.no_grad():
                decoded = [mixer(leaf[:, t:t + 1], _context(torch.tensor([[t]], device=x.device)), state)
                           for t in range(prefix, length)]
        finally:
            if saved is None:
                os.environ.pop("SEQZOO_SCAN", None)
            else:
                os.environ["SEQZOO_SCAN"] = saved
        results = {"the output": out, "the decode steps": torch.cat(decoded, 1), "the input's gradient": leaf.grad}
        results.update({f"the state's {k}": v for k, v in state_tensors(state).items() if v.is_floating_point()})
        return results, [p.grad.clone() for p in mixer.parameters()]

    (first, first_grads), (second, second_grads) = run(paths[0]), run(paths[1])
    pairs = [(name, got, second[name], floor) for name, got in first.items()]
    names = [name for name, _ in mixer.named_parameters()]
    pairs += [(f"{name}'s gradient", got, want, 1e-6) for name, got, want in zip(names, first_grads, second_grads)]
    for name, got, want, slack in pairs:
        worst = (got.float() - want.float()).abs().max().item()
        if not worst <= tolerance * want.float().abs().max().item() + slack:
            raise AssertionError(f"{name}: SEQZOO_SCAN={paths[0]} differs from {paths[1]} by {worst:.2e}")
