"""The component interfaces (plus tokenizers) that plugins implement.

Every component is constructed by the core as ``Cls(*core_args, **recipe_params)``: the core passes
the structural arguments listed in ``CORE_ARGS`` for its kind, the recipe passes the rest as keyword
arguments, validated beforehand against the constructor's signature and type hints.

Shape legend: B batch, T query length, S key length, H heads, K kv heads, D head dim, C model dim.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

import torch
from torch import Tensor, nn

from .errors import InputError
from .functional import (  # noqa: F401  (the kernels' first home: still importable from here)
    causal_mask,
    default_scale,
    expand_kv,
    masked_softmax_attend,
    softcap,
    step_through,
    upcast,
)

# Constructor arguments the core supplies, per kind, in order. A component's constructor must take
# these first; everything after them is a recipe parameter.
CORE_ARGS: dict[str, tuple[str, ...]] = {
    "score": ("query_dim", "key_dim", "heads"),
    "position": ("dim", "head_dim", "heads", "max_seq_len"),
    "norm": ("dim",),
    "ffn": ("dim",),
    "cell": ("input_size", "hidden_size"),
    "mixer": ("dim",),
    "router": ("dim", "experts", "top_k"),
    "model": ("parts",),  # the builder (seqzoo.builder.Parts) that turns the model's specs into modules
}


class Part(nn.Module):
    """What every registered component module declares, whatever its kind (the kind's base class
    subclasses this): the recipe parameters the conformance kit builds it with, and whether it
    initialises its own weights."""

    #: Recipe parameters for the conformance kit when none are given (a required one, a width that
    #: fits the kit's small shapes); {} when the defaults do.
    example_params: ClassVar[dict] = {}
    #: True when the constructor's initialisation must stand: the model's N(0, std) pass
    #: (``seqzoo.nn.init.init_weights``) leaves the module and everything in it alone.
    own_init: ClassVar[bool] = False


class ScoreFunction(Part):
    """An attention score: how strongly each query attends to each key.

    Constructor: ``(query_dim, key_dim, heads, **params)`` where ``query_dim``/``key_dim`` are the
    per-head dims of q and k and ``heads`` is H. A new score writes ``scores``; the default
    ``attend`` turns scores into a masked softmax over keys in float32 and applies it to v. Fused
    variants override ``attend``. A score whose weights are not a softmax of its scores (sigmoid
    attention) sets ``normalization`` to another name, and the kit skips the softmax check.
    """

    normalization: str = "softmax"

    def __init__(self, query_dim: int, key_dim: int, heads: int) -> None:
        super().__init__()
        self.query_dim = query_dim
        self.key_dim = key_dim
        self.heads = heads

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """Logits for every query–key pair: q (B, H, T, D), k (B, H, S, D) -> (B, H, T, S)."""
        raise NotImplementedError(f"{type(self).__name__} must implement scores(q, k)")

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        causal: bool = False,
        dropout: float = 0.0,
    ) -> Tensor:
        """Attention output (B, H, T, Dv).

        q (B, H, T, D); k (B, K, S, D) and v (B, K, S, Dv) with K dividing H (grouped heads);
        ``mask`` a boolean (B|1, H|1, T, S) tensor, True where a query may attend; ``bias`` an
        additive (B|1, H|1, T, S) tensor; ``causal`` a top-left causal mask (used only when ``mask``
        is None). Rows whose keys are all masked give zeros, never NaN.
        """
        return masked_softmax_attend(
            self.scores(q, expand_kv(k, q.shape[1])), expand_kv(v, q.shape[1]),
            mask=mask, bias=bias, causal=causal, dropout=dropout, training=self.training,
        )


class PositionScheme(Part):
    """How a stack knows where tokens are. One instance per stack, shared by all its layers.

    Constructor: ``(dim, head_dim, heads, max_seq_len, **params)``. Three hooks, each an identity by
    default; a scheme overrides the ones it needs. Positions are explicit integer tensors of shape
    (B|1, T), so a KV cache only has to offset them (per-row positions serve left padding).
    """

    #: The largest number of positions the scheme can represent (learned tables), or None.
    max_positions: int | None = None
    #: Whether the hooks' work has the same shapes for every decode step of a static KV cache
    #: (no Python number read from the positions), so ``generate(compile=True)`` traces it once.
    compiles_statically: bool = True

    def __init__(self, dim: int, head_dim: int, heads: int, max_seq_len: int) -> None:
        super().__init__()
        self.dim = dim
        self.head_dim = head_dim
        self.heads = heads
        self.max_seq_len = max_seq_len
        #: Set by the stack that owns the scheme: True in decoders (keys never follow the query),
        #: False in encoders. Relative schemes with direction-dependent buckets (T5) read it.
        self.causal = True

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """Absolute schemes add to token embeddings: x (B, T, C), positions (B|1, T) -> (B, T, C)."""
        return x

    def prepare(self, q_pos: Tensor, k_pos: Tensor):
        """Optional: work every layer of one forward shares (RoPE's cos/sin tables), done once per
        forward by the stack. A scheme that overrides it receives the result back as the keyword
        ``prepared=`` of ``rotate`` and ``bias``; the default returns None and passes nothing."""
        return None

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor,
               prepared: object = None) -> tuple[Tensor, Tensor]:
        """Rotary schemes: q (B, H, T, D) at q_pos (B|1, T), k (B, K, T', D) at k_pos (B|1, T')."""
        return q, k

    def bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor, prepared: object = None) -> Tensor | None:
        """Additive logit bias (B|1, H, T, S) for q (B, H, T, D) at q_pos (B|1, T) against keys at
        k_pos (B|1, S), or None."""
        return None

    def rotary(self) -> Rotary | None:
        """For a scheme that rotates pairs of dims by angles p·ω_k: what ``seqzoo positions`` draws
        it from (its ``angles`` and its unscaled base); None for every other scheme."""
        return None


@dataclass(frozen=True)
class Rotary:
    """What a rotary scheme tells the position plots: ``angles(positions) -> (cos, sin)``
    (1, 1, T, P) with its scaling applied; the ``base`` and ``rotary_dim`` of the unscaled
    ω_k = base^(−2k/d_r); the context it was trained on and the factor its scaling stretches it by."""

    angles: object  # Callable[[Tensor], tuple[Tensor, Tensor]]
    base: float
    rotary_dim: int
    context: int
    factor: float = 1.0


class PositionBias(PositionScheme):
    """A scheme whose logit bias depends on positions only (ALiBi, T5 buckets): it writes
    ``prepare(q_pos, k_pos) -> (B|1, H, T, S)``, built once per forward and shared by every layer;
    ``bias`` hands that table back in the query's dtype."""

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement prepare(q_pos, k_pos)")

    def bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor, prepared: Tensor | None = None) -> Tensor:
        """q (B, H, T, D) -> (B|1, H, T, S) in q's dtype (``prepared``: ``prepare``'s table)."""
        table = prepared if prepared is not None else self.prepare(q_pos, k_pos)
        return table.to(q.dtype)


# -- token mixers ------------------------------------------------------------------------------------
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
    arguments for the position hooks ({} when the scheme prepares nothing).
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

    def __post_init__(self) -> None:
        if self.prepared is not None:  # shared with another context of the same scheme
            return
        self.prepared = {}
        if type(self.position).prepare is not PositionScheme.prepare:
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


class RopeScaling(Part):
    """A RoPE context-extension rule (kind ``rope_scaling``, the ``scaling:`` of ``rope``).

    Constructor: ``(**params)`` only. It changes the rotation frequencies ω_k and may return an
    amplitude ``attention_factor`` that multiplies both cos and sin (so logits scale by its square).
    """

    #: A sequence length at which the rule switches frequencies, making keys cached before it
    #: stale (LongRoPE's L): ``generate`` re-encodes the whole sequence once, at the step that
    #: first takes it past this length, as transformers' Phi-3 does. None: cached keys stay valid.
    stale_after: int | None = None
    #: How many times the trained context the rule stretches RoPE over (1: it does not), and that
    #: context when the rule names one (null: the model's max_seq_len).
    factor: float = 1.0
    original_max_seq_len: int | None = None

    def frequencies(self, inv_freq: Tensor, *, rotary_dim: int, base: float, max_seq_len: int,
                    positions: Tensor) -> tuple[Tensor, float]:
        """inv_freq (d_r/2,) float64, the unscaled ω_k = base^(−2k/d_r) -> (scaled ω' in the same
        dtype, factor).

        ``max_seq_len`` is the model's; ``positions`` (B|1, T) the positions being rotated (the
        dynamic rule reads the current length from them).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement frequencies(...)")


class Norm(Part):
    """A normalisation layer. Constructor ``(dim, **params)``; ``forward(x (..., C)) -> (..., C)``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim


class FeedForward(Part):
    """A position-wise feed-forward block. Constructor ``(dim, **params)``;
    ``forward(x (B, T, C)) -> (B, T, C)``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def active_parameters(self) -> int:
        """The parameters one token goes through: all of them, unless the block routes each token to
        a few of its parts (a mixture of experts)."""
        return sum(p.numel() for p in self.parameters())


class Activation(Part):
    """An elementwise activation (kind ``activation``): ``forward(x) -> x``'s shape. Constructor
    ``(**params)`` only; FFNs name one in their recipe (``{kind: mlp, activation: silu}``)."""


@dataclass
class Routing:
    """A router's decision for N tokens: ``experts`` (N, k) int64, the chosen experts; ``weights``
    (N, k) float32, what each chosen expert's output is multiplied by; ``logits`` (N, E) float32, the
    raw router logits (the z-loss reads them); ``probs`` (N, E) float32, each token's distribution
    over all experts (the balancing loss averages it)."""

    experts: Tensor
    weights: Tensor
    logits: Tensor
    probs: Tensor


class Router(Part):
    """Chooses ``top_k`` of ``experts`` experts per token. Constructor ``(dim, experts, top_k,
    **params)``; ``forward(x (N, C)) -> Routing``. Scores are computed in float32: a tie or a flip
    in the top-k under bfloat16 would send a token to another expert."""

    def __init__(self, dim: int, experts: int, top_k: int) -> None:
        super().__init__()
        if top_k > experts:
            raise InputError(f"router: top_k={top_k} must be at most experts={experts}")
        self.dim, self.experts, self.top_k = dim, experts, top_k


class AuxiliaryLosses:
    """A module that computes training signals beside its output (a mixture of experts' balancing
    and z-losses, its expert load). After each forward, ``auxiliary`` holds ``{name: (coefficient,
    loss tensor)}`` for the losses that join the training objective and ``statistics`` holds
    ``{name: tensor}`` for what is only reported. The trainer adds Σ coefficient·loss over the
    model's modules (``auxiliary_losses``) and logs both."""

    auxiliary: dict[str, tuple[float, Tensor]]
    statistics: dict[str, Tensor]


def auxiliary_losses(model: nn.Module) -> tuple[Tensor | None, dict[str, float]]:
    """(Σ coefficient·loss over every ``AuxiliaryLosses`` module of ``model`` from its last
    forward, or None when there is none; {name: mean value over those modules} to report)."""
    total, values = None, {}
    for module in model.modules():
        if not isinstance(module, AuxiliaryLosses):
            continue
        for name, (coefficient, loss) in module.auxiliary.items():
            values.setdefault(name, []).append(float(loss.detach()))
            if coefficient:
                total = coefficient * loss if total is None else total + coefficient * loss
    return total, {name: sum(v) / len(v) for name, v in values.items()}


def auxiliary_statistics(model: nn.Module) -> dict[str, list[list[float]]]:
    """{name: one list per ``AuxiliaryLosses`` module that has it} from the last forward: a mixture
    of experts' ``expert_load`` per MoE layer, in layer order."""
    out: dict[str, list[list[float]]] = {}
    for module in model.modules():
        if isinstance(module, AuxiliaryLosses):
            for name, value in module.statistics.items():
                out.setdefault(name, []).append(value.detach().float().flatten().tolist())
    return out


class TransferRule:
    """Carries a trained model's weights across one kind of recipe change (kind ``transfer``;
    ``seqzoo edit``). Constructor: no arguments.

    ``claims(old, new, changed)`` gets the old and new resolved model sections and the dotted
    keys that differ (``attention.kv_heads``, ``layer_types.local.position``) and returns the ones
    it handles. ``transfer(old, new, old_state, new_state)`` then writes the tensors of the new
    state dict it makes (in place) and returns {tensor name: how it was made}; every other tensor
    of the new model is copied bit for bit from the old one by the edit. ``exact``: the edited
    model computes what the old one did (the edit checks that its logits are identical);
    otherwise ``error(old_state, new_state)`` may report a reconstruction error, {what: value}.
    """

    exact: bool = False

    def claims(self, old: dict, new: dict, changed: list[str]) -> list[str]:
        raise NotImplementedError(f"{type(self).__name__} must implement claims(old, new, changed)")

    def transfer(self, old: dict, new: dict, old_state: dict[str, Tensor],
                 new_state: dict[str, Tensor]) -> dict[str, str]:
        return {}

    def error(self, old_state: dict[str, Tensor], new_state: dict[str, Tensor]) -> dict[str, float]:
        return {}

    def measure(self, old: nn.Module, new: nn.Module, probe: Tensor) -> dict[str, float]:
        """What the rule compares between the built models on ``probe`` ids (1, T) when their
        logits cannot be (a decoder turned encoder has none): {what: value}."""
        return {}


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


class Tokenizer:
    """Text <-> ids. Registered under kind ``tokenizer`` and named by a recipe's ``tokenizer:``."""

    #: The number of ids (a class attribute when it is fixed, as the bytes tokenizer's; a property
    #: of a tokenizer read from a file). Recipes check model.vocab_size against a fixed one.
    vocab_size: int | None = None
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    #: The id of the mask token masked-LM models predict ([MASK], <mask>), or None.
    mask_id: int | None = None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError(f"{type(self).__name__} must implement encode(text)")

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError(f"{type(self).__name__} must implement decode(ids)")

    def special_ids(self) -> set[int]:
        """The ids of special tokens ([CLS], [SEP], padding, ...), which masked-LM training never
        masks: pad, bos, eos and mask here; tokenizers with more special tokens add theirs."""
        return {i for i in (self.pad_id, self.bos_id, self.eos_id, self.mask_id) if i is not None}

    @classmethod
    def from_str(cls, text: str, **params) -> Tokenizer:
        """The tokenizer whose serialised form (``to_str``) is ``text``, with the recipe's ``params``
        (a checkpoint rebuilds its tokenizer so). Default: a tokenizer that has no such form."""
        return cls(**params)

    def to_str(self) -> str | None:
        """The tokenizer's own serialised form (an hf tokenizer's tokenizer.json text), which a
        checkpoint stores; None for a tokenizer that needs none (bytes)."""
        return None

    def to_hf_files(self) -> dict[str, str] | None:
        """{file name: text} of this tokenizer for a Hugging Face folder, or None when it has no
        such form (``to_hf`` then writes the model without one, and says so)."""
        text = self.to_str()
        return None if text is None else {"tokenizer.json": text}

    def token(self, token_id: int | None) -> str | None:
        """The text of one id, as the vocabulary names it (None for None). Default: the id decoded."""
        return None if token_id is None else self.decode([token_id])

    def identity(self) -> str:
        """What makes two tokenizers encode every text alike, as a short string: token shards
        record it and training refuses shards whose identity is not the model's tokenizer's.
        Default: the class's qualified name, right for a tokenizer with no vocabulary file;
        tokenizers built from a file return a hash of its contents."""
        return f"{type(self).__module__}.{type(self).__qualname__}"

    def encode_documents(self, texts: list[str]) -> list:
        """The ids of whole documents of a corpus (``seqzoo data prepare``), each a sequence of
        ints or an integer numpy array: no special tokens added (prepare puts the end token
        between documents itself). Default: ``encode`` each; tokenizers with a batched or
        zero-copy path override it."""
        return [self.encode(text) for text in texts]


class Task:
    """Training data (kind ``task``): a generator of (prompt, answer) text pairs.

    Constructor: ``(**params)``. ``example(rng, split)`` draws one pair for ``split`` ("train" or
    "eval"; eval may use other lengths, so held-out examples also test generalisation).
    ``exact_match`` says whether answers can be scored by exact match of greedy generations
    (false for free text, which is scored by loss only). Decoder LMs see ``prompt=answer``; seq2seq
    models see the pair. Prompts must not contain ``separator``.
    """

    exact_match: bool = True
    separator: str = "="

    def example(self, rng, split: str = "train") -> tuple[str, str]:
        raise NotImplementedError(f"{type(self).__name__} must implement example(rng, split)")


IGNORE = -100  # the label of a position that carries no loss (PyTorch's cross-entropy ignore_index)


class TokenTask(Task):
    """Training data given as token ids rather than text pairs (kind ``task``): windows of a
    prepared corpus (``tokens``), synthetic token sequences (``mqar``).

    The trainer asks for rows by their index in the run's stream — row ``i`` is the ``i``-th row
    the run trains on, over all ranks and micro-batches — so the stream's position is one integer,
    which checkpoints keep, and two ranks never read the same row. Scored by held-out loss and
    perplexity, per group of held-out rows; with ``token_accuracy`` also by the argmax accuracy at
    the labelled positions.
    """

    exact_match = False
    #: Whether evaluation also scores the argmax prediction at every labelled position.
    token_accuracy: bool = False
    #: Input tokens per row (T): every row of ``batch`` and ``held_out`` has this length.
    seq_len: int = 0

    def bind(self, tokenizer: Tokenizer, vocab_size: int, seed: int) -> None:
        """Called once before training with the model's tokenizer and vocabulary size: refuse data
        they cannot read; ``seed`` (``train.seed``) fixes the stream."""

    def batch(self, start: int, size: int) -> dict[str, Tensor]:
        """Rows ``start .. start + size − 1`` of the training stream: ``ids`` (B, T) and ``labels``
        (B, T) int64, the label of position t being the token after it (IGNORE: no loss); and,
        when the task packs documents with masking on, ``documents`` (B, T) (equal ids share a
        document within a row) and ``positions`` (B, T) when positions restart per document."""
        raise NotImplementedError(f"{type(self).__name__} must implement batch(start, size)")

    def held_out(self, rows: int, batch_size: int):
        """The fixed held-out data, about ``rows`` rows in all, as (group name, batch) pairs; the
        same every call. Each group is scored on its own (MQAR: one group per number of pairs)."""
        raise NotImplementedError(f"{type(self).__name__} must implement held_out(rows, batch_size)")

    def identity(self) -> str:
        """What identifies the data beyond the recipe (a prepared folder's fingerprint), recorded in
        checkpoints so a run is not resumed on other data; "" when the recipe says it all."""
        return ""

    def example(self, rng, split: str = "train") -> tuple[str, str]:
        raise NotImplementedError(f"{type(self).__name__} gives token batches (batch), not text pairs")


# -- the model contract ------------------------------------------------------------------------------
class DecodeSession(Protocol):
    """One generation in progress (``LanguageModel.start_generation``): the decoding state of a
    batch, fed the tokens chosen at each step."""

    #: (B, T0): what every output row starts with — the prompt (causal models) or the decoder
    #: start token (seq2seq models).
    prefix: Tensor

    def next(self, tokens: Tensor | None) -> Tensor:
        """tokens (B,) chosen at the last step, or None for the first -> next logits (B, V)."""
        ...

    def reorder(self, rows: Tensor) -> None:
        """Keep batch rows ``rows`` (B',) in that order (beam search follows its beams)."""
        ...


class Model(nn.Module):
    """Every model a recipe builds (kind ``model``): what ``build``, ``load`` and ``from_hf``
    attach to it, and what ``save``, ``generate``, ``to_hf`` and the plots read, declared here
    (nothing is probed with ``hasattr``). ``LanguageModel`` and ``MaskedLanguageModel`` refine it.

    Constructor: ``(parts, **params)``. ``parts`` is the builder (``seqzoo.builder.Parts``) that
    turns the specs among the recipe's keys into modules: ``parts.stack(section, causal=True)``,
    ``parts.make("norm", spec, dim)``, ``parts.factory("cell", spec)``.
    """

    #: The resolved recipe the model was built from (``seqzoo.build`` sets it; ``save`` stores it).
    recipe: dict | None = None
    #: The tokenizer's serialised form when it has one (a tokenizer.json text), carried from a
    #: checkpoint or a Hugging Face folder so no file outside is needed; else None.
    tokenizer_state: str | None = None
    #: Which plugin, distribution and version provided each component the recipe names.
    components: dict | None = None
    #: ``causal`` (decoder-only), ``seq2seq`` (a source, then a decoder) or ``encoder``
    #: (bidirectional: hidden states, a masked-LM head).
    family: ClassVar[Literal["causal", "seq2seq", "encoder"]] = "encoder"
    #: Whether decoding records a source–target alignment in ``last_alignment`` (B, T, S): a
    #: recurrent seq2seq with an attention score (Bahdanau, Luong); Transformers' maps are read
    #: from their attention modules instead.
    records_alignment: bool = False
    last_alignment: Tensor | None = None

    @classmethod
    def check_recipe(cls, model: dict, path: tuple, validator) -> None:
        """Cross-field rules of the model section (``dim % heads``, per-layer patterns), run by
        recipe validation after each key is checked; raise ``SchemaError`` at the key that is
        wrong. Default: none."""

    @property
    def max_positions(self) -> int | None:
        """The most positions the model can read (a learned position table), or None."""
        return None


class LanguageModel(Model):
    """What ``seqzoo.generate``, beam search, ``seqzoo train`` and FSDP wrapping rely on in a
    model that generates text. The built-in ``decoder_lm``, ``encoder_decoder``, ``rnn_lm`` and
    ``rnn_seq2seq`` subclass it; a plugin's model subclasses it to be generated from and trained.

    ``forward`` takes the family's inputs — ``(input_ids, *, attention_mask=None, ...)`` for causal
    models, ``(src_ids, tgt_ids, src_mask=None)`` for seq2seq ones — and returns logits (B, T, V),
    or with ``targets=`` (when ``fused_loss``) the mean cross-entropy against them.
    """

    #: ``causal``: the output continues the input (decoder-only); ``seq2seq``: the input is a
    #: source and the output starts with ``decoder_start_id``.
    family: ClassVar[Literal["causal", "seq2seq"]] = "causal"
    #: The first decoder token of seq2seq models.
    decoder_start_id: int = 0
    #: Where a batch of prompts of different lengths is padded: ``left``, ``right``, or None when
    #: the model cannot mask padding (prompts are then batched by length).
    prompt_padding: Literal["left", "right"] | None = "left"
    #: Whether ``forward`` takes ``targets=`` and returns the loss with the LM head fused in.
    fused_loss: bool = False
    #: Whether ``start_generation`` takes ``static``/``compile`` (a static KV cache, compiled steps).
    supports_compile: bool = False
    #: Whether ``forward`` takes ``documents=`` (B, T): ids of the packed documents each token
    #: belongs to, so no token attends across a document boundary (token-shard training).
    supports_documents: bool = False

    def start_generation(self, input_ids: Tensor, max_new_tokens: int, use_cache: bool = True,
                         attention_mask: Tensor | None = None, **options: bool) -> DecodeSession:
        """A decoding session for ``input_ids`` (B, T) and up to ``max_new_tokens`` new tokens;
        ``attention_mask`` (B, T) marks real tokens; ``options``: ``static``, ``compile`` (only
        when ``supports_compile``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement start_generation(...)")

    def shard_units(self) -> list[nn.Module]:
        """The submodules FSDP shards one by one (each layer) before the whole model."""
        return []

    def tie_weights(self) -> None:
        """Re-tie shared weights (the LM head and the embedding) after a move or a load."""


class MaskedLanguageModel(Model):
    """What ``seqzoo.fill_mask`` and the masked-LM objective of ``seqzoo train`` rely on in a
    bidirectional model (the built-in ``encoder``; a plugin's model subclasses it to be trained
    and queried the same way).

    ``forward(input_ids, attention_mask=None, token_type_ids=None, *, head=False, select=None)``
    returns the hidden states (B, T, C); with ``head=True`` the masked-LM logits (B, T, V), or
    (N, V) at the N positions where ``select`` (B, T) is true (training scores only those).
    ``attention_mask`` (B, T) is 1 for real tokens.
    """

    #: Whether the model has a masked-LM head (an encoder built without one predicts nothing).
    has_mlm_head: bool = False


# The base class each kind's components must subclass (kinds not listed are unconstrained).
BASES: dict[str, type] = {
    "score": ScoreFunction,
    "position": PositionScheme,
    "norm": Norm,
    "ffn": FeedForward,
    "cell": RecurrentCell,
    "model": Model,
    "tokenizer": Tokenizer,
    "rope_scaling": RopeScaling,
    "activation": Activation,
    "task": Task,
    "mixer": Mixer,
    "router": Router,
    "transfer": TransferRule,
}
