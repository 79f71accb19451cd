"""The five component interfaces (plus tokenizers) that plugins implement.

Every component is constructed by the core as ``Cls(*core_args, **recipe_params)``: the core passes
the structural arguments listed in ``CORE_ARGS`` for its kind, the recipe passes the rest as keyword
arguments, validated beforehand against the constructor's signature and type hints.

Shape legend: B batch, T query length, S key length, H heads, K kv heads, D head dim, C model dim.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Constructor arguments the core supplies, per kind, in order. A component's constructor must take
# these first; everything after them is a recipe parameter.
CORE_ARGS: dict[str, tuple[str, ...]] = {
    "score": ("query_dim", "key_dim", "heads"),
    "position": ("dim", "head_dim", "heads", "max_seq_len"),
    "norm": ("dim",),
    "ffn": ("dim",),
    "cell": ("input_size", "hidden_size"),
}


def upcast(x: Tensor) -> Tensor:
    """x in at least float32 (half inputs are promoted, float64 is kept) for precise reductions."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def expand_kv(x: Tensor, heads: int) -> Tensor:
    """Repeat each of the K key/value heads ``heads // K`` times: (B, K, S, D) -> (B, H, S, D).

    Query head h reads kv head h // (H // K) (repeat_interleave, as HF ``repeat_kv``; tiling with
    ``repeat`` would map h to h mod K, which is wrong).
    """
    kv_heads = x.shape[1]
    if kv_heads == heads:
        return x
    return x.repeat_interleave(heads // kv_heads, dim=1)


class ScoreFunction(nn.Module):
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


def causal_mask(t: int, s: int, device: torch.device | None = None) -> Tensor:
    """Top-left aligned causal mask (T, S): query i may see keys 0..i (as SDPA ``is_causal``)."""
    return torch.ones(t, s, dtype=torch.bool, device=device).tril()


def masked_softmax_attend(
    logits: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    dropout: float = 0.0,
    training: bool = False,
) -> Tensor:
    """softmax(logits + bias, masked) @ v with the softmax in float32 and fully masked rows -> 0.

    logits (B, H, T, S), v (B, H, S, Dv) -> (B, H, T, Dv). v may hold K < H grouped heads
    (B, K, S, Dv): query head h reads v head h // (H // K), as ``expand_kv``, without copying v.
    """
    probs = upcast(logits)
    if bias is not None:
        probs = probs + bias  # in float32: a bf16 sum would round large ALiBi biases
    if mask is None and causal:
        mask = causal_mask(logits.shape[-2], logits.shape[-1], logits.device)
    if mask is not None:
        probs = probs.masked_fill(~mask, float("-inf"))
    probs = probs.softmax(dim=-1)
    if mask is not None:
        # A row with no visible key is 0/0 = NaN after softmax; such rows attend to nothing.
        probs = probs.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    probs = probs.to(v.dtype)
    if dropout > 0.0 and training:
        probs = F.dropout(probs, p=dropout)
    b, heads, t, s = probs.shape
    if v.shape[1] != heads:  # the H // K query heads of each kv head are consecutive
        return (probs.reshape(b, v.shape[1], heads // v.shape[1] * t, s) @ v).view(b, heads, t, v.shape[-1])
    return probs @ v


def default_scale(head_dim: int, scale: float | None) -> float:
    """The logit scale a score uses: ``scale`` when given, else 1/sqrt(D) (Vaswani 2017)."""
    return 1.0 / math.sqrt(head_dim) if scale is None else scale


class PositionScheme(nn.Module):
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


class RopeScaling(nn.Module):
    """A RoPE context-extension rule (kind ``rope_scaling``, the ``scaling:`` of ``rope``).

    Constructor: ``(**params)`` only. It changes the rotation frequencies ω_k and may return an
    amplitude ``attention_factor`` that multiplies both cos and sin (so logits scale by its square).
    """

    def frequencies(self, inv_freq: Tensor, *, rotary_dim: int, base: float, max_seq_len: int,
                    positions: Tensor) -> tuple[Tensor, float]:
        """inv_freq (d_r/2,) float64, the unscaled ω_k = base^(−2k/d_r) -> (scaled ω' in the same
        dtype, factor).

        ``max_seq_len`` is the model's; ``positions`` (B|1, T) the positions being rotated (the
        dynamic rule reads the current length from them).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement frequencies(...)")


class Norm(nn.Module):
    """A normalisation layer. Constructor ``(dim, **params)``; ``forward(x (..., C)) -> (..., C)``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim


class FeedForward(nn.Module):
    """A position-wise feed-forward block. Constructor ``(dim, **params)``;
    ``forward(x (B, T, C)) -> (B, T, C)``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim


class RecurrentCell(nn.Module):
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
        outputs = []
        for t in range(x.shape[1]):
            h_t, new = self.step(x[:, t], state)
            if lengths is not None:
                live = (t < lengths)[:, None]  # (B, 1): rows still inside their sequence
                h_t = torch.where(live, h_t, torch.zeros_like(h_t))
                new = (torch.where(live, new, state) if isinstance(new, Tensor)
                       else tuple(torch.where(live, n, o) for n, o in zip(new, state)))
            state = new
            outputs.append(h_t)
        return torch.stack(outputs, dim=1), state

    def check_input(self, x: Tensor, lengths: Tensor | None) -> Tensor | None:
        """Raise InputError unless x is (B, T >= 1, input_size) and 0 <= lengths <= T; return the
        lengths as int64 on x's device (or None)."""
        from .errors import InputError

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

    vocab_size: int
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError(f"{type(self).__name__} must implement encode(text)")

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError(f"{type(self).__name__} must implement decode(ids)")


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


# The base class each kind's components must subclass (kinds not listed are unconstrained).
BASES: dict[str, type] = {
    "score": ScoreFunction,
    "position": PositionScheme,
    "norm": nn.Module,
    "ffn": nn.Module,
    "cell": RecurrentCell,
    "model": nn.Module,
    "tokenizer": Tokenizer,
    "rope_scaling": RopeScaling,
    "activation": nn.Module,
    "task": Task,
}
