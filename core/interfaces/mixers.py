"""Token mixers (attention, recurrences, state-space layers) and the recurrent cells under them:
what a layer that moves information between positions promises.

Shape legend: B batch, T query length, S key length, C model dim.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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
    ``cache`` the model-level decode cache (``seqzoo.nn.cache.KVCache``) whose ``states[layer]`` the
    block hands each mixer, or None; ``static``: one token per row at the cache's static slot
    (``generate(compile=True)``). ``prepared`` is ``position.prepare(q_pos, k_pos)`` as keyword
    arguments for the position hooks ({} when the scheme prepares nothing; a ``PositionBias``'s
    table is deferred until a layer asks for it). ``shared``: other work the layers of this
    context compute once and reuse (the FlexAttention block mask).
    """

    position: PositionScheme
    q_pos: Tensor
    k_pos: Tensor
    mask: Tensor | None
    causal: bool
    cache: object | None = None
    padding: Tensor | None = None
    static: bool = False
    prepared: dict | None = None
    shared: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.prepared is not None:  # shared with another context of the same scheme
            return
        self.prepared = {}
        if isinstance(self.position, PositionBias):
            self.prepared = {"prepared": DeferredTable(self.position.prepare, self.q_pos, self.k_pos)}
        elif type(self.position).prepare is not PositionScheme.prepare:
            self.prepared = {"prepared": self.position.prepare(self.q_pos, self.k_pos)}


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

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def new_state(self, batch: int, max_len: int, *, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> MixerState:
        """An empty decoding state for ``batch`` rows and up to ``max_len`` tokens."""
        raise NotImplementedError(f"{type(self).__name__} must implement new_state(batch, max_len)")

    @classmethod
    def position_dims(cls, spec: dict, dim: int) -> tuple[int, int] | None:
        """(head_dim, heads) the layer's position scheme must be built for, when this mixer's own
        spec decides them (latent attention rotates only its d_r-wide part); None: the model's
        ``attention:`` section does."""
        return None

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
