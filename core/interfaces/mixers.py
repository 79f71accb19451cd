"""Token mixers (attention, recurrences, state-space layers) and the recurrent cells under them:
what a layer that moves information between positions promises.

Shape legend: B batch, T query length, S key length, C model dim.
"""
from __future__ import annotations

from dataclasses import InitVar, dataclass, field

import torch
from torch import Tensor

from ..errors import InputError
from ..functional import step_through
from .attention import DeferredTable, PositionBias, PositionScheme
from .part import Part


class MixerState:
    """A mixer's decoding state for one layer: the layer's slice of the KV cache, or a recurrent
    state of fixed size. ``reorder`` keeps batch rows ``rows`` (B',) in that order, in place (beam
    search follows its surviving beams; batched generation drops finished rows)."""

    def reorder(self, rows: Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement reorder(rows)")


@dataclass
class MixerContext:
    """What every mixer of one configuration sees in one forward, built once by the stack (per
    distinct position scheme and window, never per layer).

    position: the layers' position scheme; q_pos (B|1, T) and k_pos (B|1, S) the absolute positions
    of the new tokens and of every key; ``mask`` boolean (B|1, 1, T, S), True where a query may
    attend, or None with ``causal`` telling the kernel to apply a plain top-left causal mask;
    ``padding`` (B, T) 1 for the real tokens among the new ones, or None when all are real;
    ``cache`` the model-level decode cache (``seqzoo.nn.cache.DecodeCache``) whose ``states[layer]`` the
    block hands each mixer, or None; ``static``: one token per row at the cache's static slot
    (``generate(compile=True)``). ``prepared`` is ``position.prepare(q_pos, k_pos)`` as keyword
    arguments for the position hooks ({} when the scheme prepares nothing; a ``PositionBias``'s
    table is deferred until a layer asks for it). ``shared``: other work the layers of this
    context compute once and reuse (the FlexAttention block mask). ``mask_spec``: what the mask is
    made of (``MaskSpec``); given one, ``mask`` is built from it only when a layer reads it, so a
    forward whose layers all take FlexAttention or the blockwise path never holds (T × S) booleans.
    """

    position: PositionScheme
    q_pos: Tensor
    k_pos: Tensor
    mask: InitVar[Tensor | None] = None
    causal: bool = False
    cache: object | None = None
    padding: Tensor | None = None
    static: bool = False
    prepared: dict | None = None
    shared: dict = field(default_factory=dict)
    mask_spec: MaskSpec | None = None

    def __post_init__(self, mask: Tensor | None) -> None:
        self._mask = mask
        self._initialise_prepared()

    @property
    def masked(self) -> bool:
        """Whether a mask hides keys (``mask`` is not None), without building a deferred one."""
        return self._mask is not None or self.mask_spec is not None

    def mask_rows(self, start: int, stop: int) -> Tensor | None:
        """Queries ``start:stop`` of ``mask`` (B|1, 1, stop − start, S), built for those rows alone
        when the mask is deferred; None when nothing is hidden."""
        if self._mask is None and self.mask_spec is not None:
            return self.mask_spec.rows(start, stop)
        return None if self._mask is None else self._mask[..., start:stop, :]

    def replace(self, **changes) -> MixerContext:
        """A copy with ``changes`` (``dataclasses.replace`` would drop the mask, an InitVar)."""
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "mask"}
        return MixerContext(**{**fields, "mask": self._mask, **changes})

    def _initialise_prepared(self) -> None:
        if self.prepared is not None:  # shared with another context of the same scheme
            return
        self.prepared = {}
        if isinstance(self.position, PositionBias):
            self.prepared = {"prepared": DeferredTable(self.position.prepare, self.q_pos, self.k_pos)}
        elif type(self.position).prepare is not PositionScheme.prepare:
            self.prepared = {"prepared": self.position.prepare(self.q_pos, self.k_pos)}


def _context_mask(context: MixerContext) -> Tensor | None:
    if context._mask is None and context.mask_spec is not None:
        context._mask = context.mask_spec.rows(0, context.mask_spec.queries)
    return context._mask


# A property set after the dataclass is made: ``mask`` stays a constructor argument (an InitVar)
# and reads build the deferred mask once.
MixerContext.mask = property(_context_mask, doc="The boolean (B|1, 1, T, S) mask, or None.")


@dataclass(frozen=True)
class MaskSpec:
    """A self-attention mask by its parts, so it can be built a block of rows at a time (``rows``)
    or evaluated one element at a time (``visible``, FlexAttention's mask_mod) instead of held whole.

    ``queries`` new tokens after ``past`` cached ones, over ``keys`` = past + queries keys, by slot.
    ``causal``: a query sees no later slot. ``window``: itself and the W − 1 keys before it (both
    ways, W − 1 on each side, when not causal). ``key_padding`` (B, S) true for real keys;
    ``documents`` (B, T) the packed document of each token (no cache): a query sees its own only.
    ``device``: where ``rows`` builds the mask.
    """

    queries: int
    keys: int
    past: int
    causal: bool
    window: int | None = None
    key_padding: Tensor | None = None
    documents: Tensor | None = None
    device: torch.device | None = None

    @property
    def batch(self) -> int:
        """The mask's rows: B when padding or documents differ per row, else 1."""
        for per_row in (self.key_padding, self.documents):
            if per_row is not None:
                return per_row.shape[0]
        return 1

    def rows(self, start: int, stop: int) -> Tensor:
        """Queries ``start:stop`` of the mask -> (B|1, 1, stop − start, S) boolean, built from
        comparisons of (R, 1) and (1, S) slot numbers (no (R, S) integer table)."""
        device = self.device
        q_slot = torch.arange(self.past + start, self.past + stop, device=device)[:, None]
        k_slot = torch.arange(self.keys, device=device)[None, :]
        allowed = torch.ones(stop - start, self.keys, dtype=torch.bool, device=device)
        if self.causal:
            allowed &= k_slot <= q_slot
        if self.window is not None:
            allowed &= k_slot > q_slot - self.window
            if not self.causal:
                allowed &= k_slot < q_slot + self.window
        mask = allowed[None, None]
        if self.key_padding is not None:
            mask = mask & self.key_padding.bool()[:, None, None, :]
        if self.documents is not None:
            mask = mask & (self.documents[:, None, start:stop, None] == self.documents[:, None, None, :])
        return mask

    def visible(self, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        """Whether query ``q`` (of the new tokens) may read key ``kv`` in row ``b``: one element of
        ``rows``, for FlexAttention. Indices past the ends (flex pads to its blocks) read clamped
        and come out hidden."""
        inside = (q < self.queries) & (kv < self.keys)
        q, kv = q.clamp(max=self.queries - 1), kv.clamp(max=self.keys - 1)
        slot = q + self.past
        seen = inside
        if self.causal:
            seen = seen & (kv <= slot)
        if self.window is not None:
            seen = seen & (kv > slot - self.window)
            if not self.causal:
                seen = seen & (kv < slot + self.window)
        if self.key_padding is not None:
            seen = seen & self.key_padding[b, kv].bool()
        if self.documents is not None:
            seen = seen & (self.documents[b, q] == self.documents[b, kv])
        return seen


class Mixer(Part):
    """A token mixer: the part of a layer that moves information between positions (attention, a
    recurrent cell run as a layer, a state-space model). Constructor ``(dim, **params)``.

    ``forward(x, context, state)`` maps x (B, T, C) to (B, T, C) for T new tokens; with a ``state``
    (from ``new_state``) it continues from the tokens fed before and updates the state, so feeding
    a sequence in pieces equals feeding it whole. ``context.padding`` marks padded positions: in
    each row the real tokens are one contiguous run (left padding in batched generation, right
    padding in encoders); padded positions must not change the state or any real token's output.
    """

    #: Whether the decode step has the same shapes every token and reads no Python number from
    #: the state, so ``generate(compile=True)`` traces it once.
    compiles_statically: bool = True
    #: Whether the mixer is causal by construction (a recurrence); such mixers cannot serve an
    #: encoder (bidirectional) stack, and the stack refuses them there.
    causal_only: bool = False
    #: The sliding window W the stack masks this layer's attention with (a query sees itself and
    #: the W − 1 keys before it; in a bidirectional stack, W − 1 on each side), or None; mixers
    #: that do not attend leave it None.
    window: int | None = None
    #: Whether the mixer honours ``context.mask`` (a boolean (B|1, 1, T, S) mask of the keys each
    #: query may read), as attention does. A recurrence reads ``context.padding`` only, so it
    #: cannot keep packed documents apart: document masking refuses a stack with such a layer.
    reads_mask: bool = False
    #: True for the mixer that is no mixer (``none``): the layer is its feed-forward block alone
    #: (Nemotron-H's FFN-only layers), and the block leaves out the mixer sublayer and its norms.
    empty: bool = False

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> MixerState:
        """An empty decoding state for ``batch`` rows and up to ``max_len`` tokens."""
        raise NotImplementedError(f"{type(self).__name__} must implement new_state(batch, max_len)")

    @classmethod
    def position_dims(cls, spec: dict, dim: int) -> tuple[int, int] | None:
        """(head_dim, heads) the layer's position scheme must be built for: attention's H heads of
        D features, latent attention's d_r-wide rotated part. None for a mixer that never calls
        its position scheme (a recurrence)."""
        return None

    @classmethod
    def branches(cls, spec: dict) -> list[dict]:
        """The specs of the mixers this one runs inside it (a parallel layer's branches), so the
        builder can shape the layer's position scheme for the branch that attends; [] for most."""
        return []

    def forward(self, x: Tensor, context: MixerContext, state: MixerState | None = None) -> Tensor:
        """x (B, T, C) -> (B, T, C)."""
        raise NotImplementedError(f"{type(self).__name__} must implement forward(x, context, state)")


class RecurrentCell(Part):
    """A recurrent cell. Constructor ``(input_size, hidden_size, **params)``.

    A state is a tensor or a tuple of tensors, each (B, hidden_size); the first (or only) one is
    the output h (LSTM: ``(h, c)``; RNN, GRU: ``h``). ``step`` advances one time step; ``forward``
    runs a whole sequence and by default loops over ``step`` (built-ins override it with the fused
    cuDNN-backed kernels on the same parameters, and must agree with the loop).
    """

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size

    def initial_state(self, batch: int, device: torch.device | None = None,
                      dtype: torch.dtype | None = None):
        """The state before the first step: zeros (B, hidden_size)."""
        return torch.zeros(batch, self.hidden_size, device=device, dtype=dtype)

    @staticmethod
    def output(state) -> Tensor:
        """The output h (B, hidden_size) of a state: the state itself, or its first tensor."""
        return state if isinstance(state, Tensor) else state[0]

    def step(self, x_t: Tensor, state):
        """One step: x_t (B, input_size) -> (h_t (B, hidden_size), new state)."""
        raise NotImplementedError(f"{type(self).__name__} must implement step(x_t, state)")

    def forward(self, x: Tensor, state=None, lengths: Tensor | None = None):
        """A whole sequence: x (B, T, input_size) -> (h_all (B, T, hidden_size), final state).

        ``lengths`` (B,) int64: each row's real length (right padding). A row's state stops
        changing after its last real step, so the final state is the one at that step, and its
        outputs at padded positions are zeros.
        """
        lengths = self.check_input(x, lengths)
        if state is None:
            state = self.initial_state(x.shape[0], x.device, x.dtype)
        return step_through(self.step, x, state, lengths)

    def check_input(self, x: Tensor, lengths: Tensor | None) -> Tensor | None:
        """Raise InputError unless x is (B, T >= 1, input_size) and 0 <= lengths <= T; return the
        lengths as int64 on x's device (or None)."""
        name = type(self).__name__
        if x.dim() != 3 or x.shape[1] < 1 or x.shape[2] != self.input_size:
            raise InputError(f"{name}: x must be (B, T >= 1, input_size={self.input_size}), "
                             f"got shape {tuple(x.shape)}")
        if lengths is None:
            return None
        if lengths.shape != (x.shape[0],) or lengths.dtype.is_floating_point or lengths.dtype in (
                torch.bool, torch.complex64, torch.complex128):
            raise InputError(f"{name}: lengths must be an integer tensor of shape (B,)=({x.shape[0]},), "
                             f"got {lengths.dtype} of shape {tuple(lengths.shape)}")
        lengths = lengths.to(device=x.device, dtype=torch.long)
        bad = lengths[(lengths < 0) | (lengths > x.shape[1])]
        if bad.numel():
            raise InputError(f"{name}: lengths must lie in [0, T={x.shape[1]}], "
                             f"got {bad[:5].tolist()}; pad x to the longest length")
        return lengths
