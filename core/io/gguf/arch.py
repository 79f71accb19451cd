"""A Hugging Face family's GGUF form, as data: ``GGUFArch``, declared beside the family's HF names
in its converter plugin (``gguf = GGUFArch("qwen2", ...)``), so the GGUF file is one more step from
the HF tensors the converter already makes, not a second converter.

Three things say everything a family needs:

- ``keys``: the metadata llama.cpp reads, each a ``Key`` from a config.json key (``{arch}.`` is
  prepended to the GGUF key), used both ways;
- the tensor names come from the gguf package's own map (``gguf.get_tensor_name_map``), which knows
  every HF spelling llama.cpp's converter does; ``renames`` only covers what it does not know;
- ``transforms``: the few tensors whose values differ between HF and llama.cpp (Gemma's norm
  weights +1, Mamba's A = −exp(A_log), llama's q/k row order, GPT-2's transposed Conv1D), each a
  ``Rule`` pair of functions in both directions (``seqzoo.io.hf.rules``, the HF converters' own
  mechanism, with the HF tensor as the "target" and the GGUF tensors as its "sources").

``export`` / ``config`` hooks hold what is not a plain key (layer patterns, RoPE scaling), with
``from_tensors`` for what only the file's tensor names tell (Jamba's sparse layers), and
``problem`` what llama.cpp hard-codes and a model may not match (a refusal, never a wrong file).
A family llama.cpp splits in two architectures (Nemotron-H with experts is its ``nemotron_h_moe``)
lists the other as a ``variant``.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..hf.rules import Rule


@dataclass(frozen=True)
class Key:
    """GGUF key ``{arch}.{name}`` <-> config.json ``hf`` of GGUF type ``kind`` (u32, f32, bool, str).
    ``default``: the value the import gives the HF key when the file has no such key (llama.cpp's
    own default); ``optional``: written only when the config has a non-null value."""

    name: str
    hf: str
    kind: str = "u32"
    default: Any = None
    optional: bool = False


#: The keys of a LLaMA-like config.json, which most families share.
LLAMA_KEYS = (
    Key("block_count", "num_hidden_layers"), Key("context_length", "max_position_embeddings"),
    Key("embedding_length", "hidden_size"), Key("feed_forward_length", "intermediate_size"),
    Key("attention.head_count", "num_attention_heads"),
    Key("attention.head_count_kv", "num_key_value_heads", optional=True),
    Key("attention.key_length", "head_dim", optional=True), Key("attention.value_length", "head_dim", optional=True),
    Key("attention.layer_norm_rms_epsilon", "rms_norm_eps", "f32"))
#: Mixture-of-experts counts (Mixtral's and the Qwen MoEs' config keys differ: see each family).
EXPERT_KEYS = (Key("expert_count", "num_local_experts"), Key("expert_used_count", "num_experts_per_tok"))


@dataclass(frozen=True)
class Transform:
    """HF tensors whose names match ``pattern`` (a regex) are stored in GGUF by ``rule``:
    ``rule(hf_name, gguf_name, config) -> Rule`` with the HF name as target and the GGUF name(s)
    as sources. The first matching transform wins."""

    pattern: str
    rule: Callable[[str, str | None, Mapping], Rule]


@dataclass(frozen=True)
class GGUFArch:
    """A family's llama.cpp architecture (``general.architecture``) and what differs from the HF
    form. ``output``: ``optional`` (a tied model writes no ``output.weight``), ``required`` (a tied
    model writes a copy; llama.cpp will not reuse the embedding), ``never`` (llama.cpp never reads
    one, e.g. Gemma 2). ``imports``: whether a file of this architecture imports as this family,
    or a predicate on its metadata where several families share an architecture (llama: LLaMA,
    Mistral, Mixtral). ``drop``: patterns of HF tensors llama.cpp's graph has no place for (BERT's
    pooler), left out with a warning.

    The hooks: ``rope`` writes and reads RoPE's base and scaling from ``rope_parameters`` (False:
    none, or the ``export`` hook does it); ``export(config)`` -> more keys (without the
    ``{arch}.`` prefix); ``config(get)`` -> more config.json keys on import, ``get(key, default)``
    reading the file's ``{arch}.`` keys; ``problem(config)`` -> why llama.cpp would compute
    something else, or None; ``fixed``: keys with one value for every model."""

    name: str
    keys: tuple[Key, ...] = LLAMA_KEYS
    transforms: tuple[Transform, ...] = ()
    renames: Mapping[str, str] = field(default_factory=dict)
    output: str = "optional"
    imports: bool | Callable[[Callable[..., Any]], bool] = True
    rope: bool = True
    export: Callable[[Mapping], dict] | None = None
    config: Callable[[Callable[..., Any]], dict] | None = None
    problem: Callable[[Mapping], str | None] | None = None
    fixed: Mapping[str, Any] = field(default_factory=dict)
    from_tensors: Callable[[frozenset[str]], dict] | None = None
    drop: tuple[str, ...] = ()
    scaled_head: str | None = None
    #: Other architectures the family is written as, each a GGUFArch of its own (read back by the
    #: same converter), and ``variant(config)`` -> the name of the one a model is written as.
    variants: tuple[GGUFArch, ...] = ()
    variant: Callable[[Mapping], str] | None = None

    def key(self, name: str) -> str:
        return f"{self.name}.{name}"

    def named(self, name: str) -> GGUFArch:
        """This architecture, or its variant called ``name``."""
        return next(a for a in (self, *self.variants) if a.name == name)

    def written_as(self, config: Mapping) -> GGUFArch:
        """The architecture a model of HF ``config`` is written as."""
        return self.named(self.variant(config)) if self.variant else self


# -- the value transforms -------------------------------------------------------------------------
def as_is(hf: str, gguf_name: str, config: Mapping) -> Rule:
    return Rule(hf, (gguf_name,))


def plus_one(hf: str, gguf_name: str, config: Mapping) -> Rule:
    """Gemma stores a norm's weight w and multiplies by (1 + w); llama.cpp multiplies by what it
    reads, so the file holds 1 + w."""
    return Rule(hf, (gguf_name,), lambda t: t - 1.0, lambda t: (t + 1.0,))


def permute_rows(heads: int) -> Callable[[Tensor], Tensor]:
    """llama.cpp's q/k row order from HF's: each head's rows [half 1 | half 2] become adjacent
    rotary pairs (r, r + D/2), as its RoPE rotates (2i, 2i + 1) where HF rotates halves."""
    return lambda w: w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def unpermute_rows(heads: int) -> Callable[[Tensor], Tensor]:
    """The inverse of ``permute_rows``."""
    return lambda w: w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def rotary_pairs(heads_key: str) -> Callable[[str, str, Mapping], Rule]:
    """q or k (weights and biases) of a family llama.cpp runs with its NORM RoPE (llama, smollm3),
    permuted per head (``heads_key``: the config key of the projection's head count)."""
    def rule(hf: str, gguf_name: str, config: Mapping) -> Rule:
        heads = config[heads_key] or config["num_attention_heads"]
        return Rule(hf, (gguf_name,), unpermute_rows(heads), lambda t: (permute_rows(heads)(t),))
    return rule


def transposed(hf: str, gguf_name: str, config: Mapping) -> Rule:
    """GPT-2's Conv1D weights are [in, out]; llama.cpp wants a linear's [out, in]."""
    return Rule(hf, (gguf_name,), lambda t: t.t().contiguous(), lambda t: (t.t().contiguous(),))


def log_rate(a: Tensor) -> Tensor:
    """A_log from llama.cpp's A = −exp(A_log): log(−A), moved by one float32 step where log's
    rounding misses, so that exp(A_log) gives −A back exactly (an A_log whose neighbours share its
    exp cannot be told apart, but the mixers read A_log through its exp only)."""
    rate = -a
    out = torch.log(rate)
    for toward in (math.inf, -math.inf):
        step = torch.nextafter(out, torch.full_like(out, toward))
        out = torch.where((torch.exp(out) != rate) & (torch.exp(step) == rate), step, out)
    return out


def a_from_log(hf: str, gguf_name: str, config: Mapping) -> Rule:
    """Mamba's A_log: llama.cpp reads A = −exp(A_log) (``ssm_a``)."""
    return Rule(hf, (gguf_name,), log_rate, lambda t: (-torch.exp(t),))


def conv_squeezed(hf: str, gguf_name: str, config: Mapping) -> Rule:
    """A depthwise conv1d weight [C, 1, K] is stored [C, K]."""
    return Rule(hf, (gguf_name,), lambda t: t.unsqueeze(1), lambda t: (t.squeeze(1),))


def per_head_column(hf: str, gguf_name: str, config: Mapping) -> Rule:
    """Mamba-2's A_log and D, one per head [H], are stored [H, 1] (A as −exp(A_log))."""
    if hf.endswith("A_log"):
        return Rule(hf, (gguf_name,), lambda a: log_rate(a.reshape(-1)), lambda t: (-torch.exp(t).unsqueeze(-1),))
    return Rule(hf, (gguf_name,), lambda t: t.reshape(-1), lambda t: (t.unsqueeze(-1),))


def grouped_norm(groups_key: str) -> Callable[[str, str, Mapping], Rule]:
    """Mamba-2's gated norm weight [d_inner] is stored [groups, d_inner / groups]."""
    def rule(hf: str, gguf_name: str, config: Mapping) -> Rule:
        groups = config[groups_key]
        return Rule(hf, (gguf_name,), lambda t: t.reshape(-1), lambda t: (t.reshape(groups, -1),))
    return rule


def interleaved_qkv(heads_key: str) -> Callable[[str, str, Mapping], Rule]:
    """GPT-NeoX's and BLOOM's fused q/k/v rows are per head [H, 3, D]; llama.cpp's [3, H, D]."""
    def rule(hf: str, gguf_name: str, config: Mapping) -> Rule:
        heads = config[heads_key]

        def regroup(t: Tensor, outer: int, inner: int) -> Tensor:
            return t.reshape(outer, inner, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)
        return Rule(hf, (gguf_name,), lambda t: regroup(t, 3, heads), lambda t: (regroup(t, heads, 3),))
    return rule


def gate_up_experts(hf: str, gguf_name: str, config: Mapping) -> Rule:
    """transformers' fused experts [E, 2F, C] (gate rows, then up rows) are two GGUF tensors,
    ``ffn_gate_exps`` and ``ffn_up_exps`` [E, F, C]."""
    block = re.search(r"layers\.(\d+)\.", hf).group(1)
    return Rule(hf, (f"blk.{block}.ffn_gate_exps.weight", f"blk.{block}.ffn_up_exps.weight"),
                lambda gate, up: torch.cat([gate, up], dim=1), lambda t: tuple(t.chunk(2, dim=1)))


def shared_gate(hf: str, gguf_name: str, config: Mapping) -> Rule:
    """Qwen2-MoE's shared-expert gate [1, C] is stored as a vector {C}."""
    return Rule(hf, (gguf_name,), lambda t: t.reshape(1, -1), lambda t: (t.reshape(-1),))


# -- RoPE -----------------------------------------------------------------------------------------
def llama3_factors(parameters: Mapping, head_dim: int) -> Tensor:
    """llama.cpp's ``rope_freqs`` for Llama 3's scaling: each frequency's divisor (1 for short
    wavelengths, ``factor`` for long ones, a smooth blend between), as its converter writes it."""
    base, factor = parameters["rope_theta"], parameters.get("factor", 8.0)
    low, high = parameters.get("low_freq_factor", 1.0), parameters.get("high_freq_factor", 4.0)
    original = parameters.get("original_max_position_embeddings", 8192)
    frequencies = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    factors = []
    for f in frequencies.tolist():
        wavelength = 2 * math.pi / f
        if wavelength < original / high:
            factors.append(1.0)
        elif wavelength > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32)


# -- shared by the families' hooks ----------------------------------------------------------------
def sliding_flags(config: Mapping) -> list[bool]:
    """config.json's ``layer_types`` as llama.cpp's per-layer flags (true: sliding window)."""
    return [kind == "sliding_attention" for kind in config["layer_types"]]


def layer_types(flags) -> list[str]:
    """The inverse of ``sliding_flags``."""
    return ["sliding_attention" if flag else "full_attention" for flag in flags]


def no_window(config: Mapping) -> str | None:
    """A Qwen's sliding window, which llama.cpp's qwen2/qwen3 graphs do not apply."""
    if config.get("use_sliding_window"):
        return ("llama.cpp's qwen architectures attend to every past token; this model has a sliding window "
                "(use_sliding_window); export it with model.attention.window null")
    return None


def heads_fill_width(config: Mapping) -> str | None:
    """llama.cpp shapes q and o as {C, C} in some architectures: heads × head_dim must be C."""
    heads, dim = config["num_attention_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or dim // heads
    if heads * head_dim != dim:
        return (f"llama.cpp's graph for this architecture needs heads × head_dim = hidden size; this model has "
                f"{heads} × {head_dim} != {dim}")
    return None


def head_scale(arch: GGUFArch, config: Mapping) -> float:
    """d^-1/2 of a ``scaled_head`` family, d its embedding width."""
    width = next(k.hf for k in arch.keys if k.name == "embedding_length")
    return float(config[width]) ** -0.5


def first(*checks: Callable[[Mapping], str | None]) -> Callable[[Mapping], str | None]:
    """The first problem any of ``checks`` finds."""
    return lambda config: next((p for p in (check(config) for check in checks) if p), None)


#: q and k of the families llama.cpp runs with its NORM RoPE on HF's rotate-half weights.
NORM_ROPE = (Transform(r"q_proj\.", rotary_pairs("num_attention_heads")),
             Transform(r"k_proj\.", rotary_pairs("num_key_value_heads")))
#: Gemma's (1 + w) norms, every one of them (the q/k norms of Gemma 3 included).
GEMMA_NORMS = (Transform(r"norm\.weight$", plus_one),)


def window_within_context(config: Mapping) -> str | None:
    """A sliding window on an architecture (llama) whose llama.cpp graph has none: fine only when
    it covers the whole context."""
    window, context = config.get("sliding_window"), config["max_position_embeddings"]
    if window is not None and window < context:
        return (f"llama.cpp's llama architecture has no sliding window: this model attends to its last {window} "
                f"tokens, llama.cpp would attend to all {context}; export it with model.attention.window null "
                f"(or at least max_seq_len)")
    return None


def layer_period(flags: list[bool], what: str) -> tuple[int, int]:
    """(period, offset) of the layers ``flags`` marks, which must be regular: layer i is marked
    when i >= offset and (i - offset) % period == 0 (Jamba's attention and expert layers)."""
    marked = [i for i, flag in enumerate(flags) if flag]
    if not marked:
        raise ValueError(f"no {what} layer")
    offset = marked[0]
    period = marked[1] - marked[0] if len(marked) > 1 else len(flags)
    if [i >= offset and (i - offset) % period == 0 for i in range(len(flags))] != list(flags):
        raise ValueError(f"the {what} layers {marked} are not every {period}th from {offset}")
    return period, offset
