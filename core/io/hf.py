"""Hugging Face checkpoints in and out: ``from_hf(folder) -> model``, ``to_hf(model, folder)``.

A Hugging Face folder is ``config.json`` plus ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``), optionally with ``tokenizer.json``. Only safetensors are read:
a folder with nothing but ``pytorch_model.bin`` (pickle) is refused.

One converter per ``model_type``, registered under kind ``converter`` (``plugins/converter/``, or a
third-party plugin), turns the config into an ordinary seqzoo recipe and declares, as a list of
``Rule`` s, how each seqzoo tensor is made from Hugging Face tensors (renamed, transposed, fused) and
back. The same rules serve both directions, so import and export cannot drift apart, and they are
checked before any weight is copied: every missing, unexpected or mis-shaped tensor is reported by its
Hugging Face name in one ``CheckpointError`` — never a partial load.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from ..errors import CheckpointError, SeqzooError, few
from ..files import atomic_write, write_text_atomic
from ..interfaces import LanguageModel, Model
from ..recipe import resolve
from ..registry import registry, tokenizer
from .build import check_fits, instantiate, pick_device
from .checkpoint import mismatches, unwrap

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
# Tokenizer files copied along when an exported model's tokenizer still sits next to them.
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model", "spiece.model")


# -- rules: how one seqzoo tensor is made from Hugging Face tensors, and back ----------------------
def _one(tensor: Tensor) -> tuple[Tensor, ...]:
    return (tensor,)


@dataclass(frozen=True)
class Rule:
    """seqzoo tensor ``target`` = ``load(*hf tensors named by sources)``; ``save`` inverts it.

    ``save`` must work on any tensor of the target's shape (meta tensors included): the import
    checks the stored shapes against ``save`` applied to the freshly built model. A tuple
    ``target`` names several seqzoo tensors made together (parts of one fused HF tensor, see
    ``split``): ``load`` returns one tensor per target and ``save`` takes them all.
    """

    target: str | tuple[str, ...]
    sources: tuple[str, ...]
    load: Callable[..., Tensor | tuple[Tensor, ...]] = lambda tensor: tensor
    save: Callable[..., tuple[Tensor, ...]] = _one

    @property
    def targets(self) -> tuple[str, ...]:
        return self.target if isinstance(self.target, tuple) else (self.target,)

    def load_all(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        """One tensor per target from the HF tensors named by ``sources``."""
        out = self.load(*tensors)
        return tuple(out) if isinstance(self.target, tuple) else (out,)


def copy(target: str, source: str) -> Rule:
    """The same tensor under another name."""
    return Rule(target, (source,))


def transposed(target: str, source: str) -> Rule:
    """GPT-2's ``Conv1D`` stores weights [in, out]; ``nn.Linear`` wants [out, in]."""
    return Rule(target, (source,), lambda w: w.t(), lambda w: (w.t(),))


def fused(target: str, sources: tuple[str, ...], sizes: tuple[int, ...]) -> Rule:
    """Separate projections (q, k, v) stacked along the output dim: [q (H·D) | k (K·D) | v (K·D)]."""
    return Rule(target, tuple(sources), lambda *parts: torch.cat(parts, dim=0),
                lambda t: tuple(t.split(list(sizes), dim=0)))


def split(targets: tuple[str, ...], source: str, sizes: tuple[int, ...]) -> Rule:
    """One HF tensor holding several seqzoo tensors stacked along the output dim (ModernBERT's and
    Phi-3's fused [gate | up]): split on import, concatenated again on export."""
    return Rule(tuple(targets), (source,), lambda t: tuple(t.split(list(sizes), dim=0)),
                lambda *parts: (torch.cat(parts, dim=0),))


def fused_per_head(target: str, source: str, heads: int) -> Rule:
    """q/k/v fused per head (BLOOM, GPT-NeoX): the HF projection's output rows are [H, 3, D]
    (head-major), seqzoo's ``qkv_proj`` rows [3, H, D] ([q | k | v]); a weight or a bias,
    reordered both ways."""
    def regroup(t: Tensor, outer: int, inner: int) -> Tensor:  # rows [outer, inner, D] -> [inner, outer, D]
        return t.reshape(outer, inner, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)

    return Rule(target, (source,), lambda t: regroup(t, heads, 3), lambda t: (regroup(t, 3, heads),))


def linear(target: str, source: str, bias: bool, *, transpose: bool = False) -> list[Rule]:
    """``target.weight`` (and ``.bias``) from ``source.weight`` (and ``.bias``)."""
    make = transposed if transpose else copy
    rules = [make(f"{target}.weight", f"{source}.weight")]
    return rules + [copy(f"{target}.bias", f"{source}.bias")] if bias else rules


def norm(target: str, source: str, bias: bool = True) -> list[Rule]:
    """A norm's weight (and bias): LayerNorm has both, RMSNorm (T5, LLaMA) only a weight."""
    return linear(target, source, bias)


def renamed(ours: str, theirs: str, names: Mapping[str, str], bias: bool, *, transpose: bool = False) -> list[Rule]:
    """``linear`` for each {seqzoo name: HF name} pair of one layer's projections or norms, under the
    prefixes ``ours`` and ``theirs`` (``decoder.blocks.3.``, ``model.layers.3.``)."""
    return [rule for a, b in names.items() for rule in linear(ours + a, theirs + b, bias, transpose=transpose)]


# -- activations: Hugging Face names <-> seqzoo ffn specs ------------------------------------------
# HF ``ACT2FN`` names of the activations seqzoo has, as (seqzoo activation, GELU approximation).
# gelu_new, gelu_fast and gelu_pytorch_tanh are the same function, 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))).
ACTIVATIONS: dict[str, tuple[str, str | None]] = {
    "gelu": ("gelu", "none"), "gelu_python": ("gelu", "none"), "gelu_new": ("gelu", "tanh"),
    "gelu_fast": ("gelu", "tanh"), "gelu_pytorch_tanh": ("gelu", "tanh"), "relu": ("relu", None),
    "silu": ("silu", None), "swish": ("silu", None), "quick_gelu": ("quick_gelu", None),
    "tanh": ("tanh", None), "sigmoid": ("sigmoid", None),
}


def _activation(name: Any, where: str) -> tuple[str, str | None]:
    if name not in ACTIVATIONS:
        raise CheckpointError(f"{where}: activation {name!r} has no seqzoo equivalent; supported: "
                              f"{', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name]


def mlp_ffn(act: Any, hidden: int, bias: bool, where: str = "config.json") -> dict:
    """The ungated FFN spec for HF activation ``act``: W₂ act(W₁x + b₁) + b₂."""
    kind, approximate = _activation(act, where)
    if kind == "gelu":
        return {"kind": "gelu", "hidden": hidden, "bias": bias, "approximate": approximate}
    if kind == "relu":
        return {"kind": "relu", "hidden": hidden, "bias": bias}
    return {"kind": "mlp", "hidden": hidden, "bias": bias, "activation": kind}


def glu_ffn(act: Any, hidden: int, bias: bool, where: str = "config.json") -> dict:
    """The gated FFN spec for HF activation ``act`` on the gate: W₂ (act(W₁x) ⊙ W₃x)."""
    kind, approximate = _activation(act, where)
    if kind == "silu":
        return {"kind": "swiglu", "hidden": hidden, "bias": bias}
    if kind == "gelu":
        return {"kind": "geglu", "hidden": hidden, "bias": bias, "approximate": approximate}
    return {"kind": "glu", "hidden": hidden, "bias": bias, "activation": kind}


def ffn_activation(ffn: dict | None, tanh_name: str = "gelu_new") -> tuple[str, bool] | None:
    """(HF activation name, gated?) of a resolved ffn spec, or None when HF has no name for it (or
    there is no FFN: ``ffn: null``). ``tanh_name`` is the family's name for tanh-GELU (gelu_new in
    GPT-2/BERT, gelu_pytorch_tanh in LLaMA)."""
    if ffn is None:
        return None
    kind = ffn["kind"]
    gated = kind in ("swiglu", "geglu", "glu")
    if kind in ("gelu", "geglu"):
        return (tanh_name if ffn["approximate"] == "tanh" else "gelu"), gated
    if kind == "swiglu":
        return "silu", True
    if kind == "relu":
        return "relu", False
    if kind in ("mlp", "glu"):
        spec = ffn["activation"]
        name = kind_of(spec)
        if name == "gelu":
            tanh = isinstance(spec, dict) and spec.get("approximate") == "tanh"
            return (tanh_name if tanh else "gelu"), gated
        if name == "gelu_tanh":
            return tanh_name, gated
        return (name, gated) if name in ACTIVATIONS else None
    return None


def activation_spec(name: Any) -> str | dict:
    """seqzoo's ``activation`` spec for a Hugging Face activation name (``hidden_act``)."""
    ffn = mlp_ffn(name, 1, True)
    if ffn["kind"] == "gelu":
        return {"kind": "gelu", "approximate": ffn["approximate"]}
    return ffn["kind"] if ffn["kind"] == "relu" else ffn["activation"]


def activation_name(spec: Any, tanh_name: str = "gelu_new") -> str | None:
    """The Hugging Face name of a resolved ``activation`` spec, or None when it has none."""
    found = ffn_activation({"kind": "mlp", "activation": spec}, tanh_name)
    return found[0] if found else None


def kind_of(spec: Any) -> str | None:
    """The component name of a spec: ``"rope"`` for ``"rope"`` or ``{kind: rope, ...}``."""
    return spec if isinstance(spec, str) else spec.get("kind") if isinstance(spec, dict) else None


def first_problem(*checks: tuple[bool, str]) -> str | None:
    """The message of the first failed (ok, message) check, or None: what ``accepts`` returns."""
    return next((message for ok, message in checks if not ok), None)


def uniform_problem(model: dict) -> str | None:
    """Why a model section is not a uniform stack of attention layers with the 2023 block options
    (a per-layer pattern, another mixer, a parallel residual, softcaps, sinks), or None. Families
    whose Hugging Face classes have none of these refuse such models rather than drop a part."""
    attn = model["attention"] or {}
    return first_problem(
        (model.get("pattern") is None and not model.get("layer_overrides"),
         "model.pattern: layers differ; this family's layers are all alike"),
        (model.get("mixer") is None, f"model.mixer is {kind_of(model.get('mixer'))}; this family attends"),
        (model.get("residual", "sequential") == "sequential",
         f"model.residual is {model.get('residual')}; this family adds its sublayers in sequence"),
        (model.get("final_softcap") is None, "model.final_softcap is set; this family has none"),
        (attn.get("softcap") is None, "model.attention.softcap is set; this family has none"),
        (not attn.get("sinks"), "model.attention.sinks is set; this family has none"),
    )


def decoder_problem(model: dict, *, position: str, norm: str, ffn_gated: bool, tanh_name: str,
                    qk_norm: bool = False, placement: str = "pre") -> str | None:
    """Checks shared by the decoder-only families (GPT-2, LLaMA, BLOOM); ``qk_norm``: the family
    normalises q and k (Qwen3, OLMo 2), which its converter checks further; ``placement``: where
    its norms sit (``output`` for OLMo 2)."""
    if model["kind"] != "decoder_lm":
        return f"model.kind is {model['kind']}, needs decoder_lm"
    problem = uniform_problem(model)
    if problem:
        return problem
    attn, act = model["attention"] or {}, ffn_activation(model["ffn"], tanh_name)
    return first_problem(
        (kind_of(model["position"]) == position,
         f"model.position is {kind_of(model['position'])}, needs {position}"),
        (kind_of(model["norm"]) == norm, f"model.norm is {kind_of(model['norm'])}, needs {norm}"),
        (model["placement"] == placement, f"model.placement is {model['placement']}, needs {placement}"),
        (act is not None, f"model.ffn {kind_of(model['ffn'])} has no Hugging Face activation name"),
        (act is None or act[1] == ffn_gated,
         f"model.ffn is {'gated' if act and act[1] else 'ungated'}, needs {'gated' if ffn_gated else 'ungated'}"),
        (qk_norm or attn.get("qk_norm") is None, "model.attention.qk_norm is set; this family has none"),
        (not qk_norm or attn.get("qk_norm") is not None, "model.attention.qk_norm is null; this family has one"),
        (not model["scale_embeddings"], "model.scale_embeddings is true; this family has none"),
    )



def layer_pattern(kinds: list) -> list:
    """The shortest ``pattern`` whose repetition (layer i takes pattern[i % len]) gives each layer's
    kind — how Hugging Face configs repeat their per-layer lists (``layer_types``,
    ``no_rope_layers``), a last period cut short included: Gemma 3 1B's 26 layers -> 6 entries."""
    return next(kinds[:p] for p in range(1, len(kinds) + 1)
                if all(kind == kinds[i % p] for i, kind in enumerate(kinds)))


def plain_attention_problem(model: dict, family: str, *, biases: bool, any_head_dim: bool = False) -> str | None:
    """Why ``model.attention`` is not the attention of the 2017–2022 families (GPT-2, BERT, BLOOM,
    T5, GPT-NeoX) — as many K/V heads as query heads, each C/H wide (any width: ``any_head_dim``,
    T5), no window, no QK-norm, and a bias on every projection (``biases``) or on none — or None."""
    attn = model["attention"]
    have = attn["bias"] and attn["out_bias"] in (None, True) if biases else not attn["bias"] and not attn["out_bias"]
    return first_problem(
        (attn["kv_heads"] in (None, attn["heads"]), f"model.attention.kv_heads: {family} has no GQA"),
        (any_head_dim or attn["head_dim"] in (None, model["dim"] // attn["heads"]),
         "model.attention.head_dim must be dim / heads"),
        (have, f"model.attention: {family} has {'biases everywhere' if biases else 'no biases'}"),
        (attn["window"] is None, f"model.attention.window: {family} has no sliding window"),
        (attn["qk_norm"] is None, f"model.attention.qk_norm: {family} has none"),
    )

# -- the converter interface -----------------------------------------------------------------------
class HFConverter:
    """One Hugging Face family (``model_type``), registered under kind ``converter``.

    A converter writes ``recipe`` (config -> seqzoo recipe), ``rules`` (the tensor mapping for a
    config), ``hf_config`` (seqzoo model -> config) and ``accepts`` (can this model be exported as
    this family?). ``to_seqzoo`` and ``to_hf`` follow from the rules. Configs are the plain dicts of
    ``config.json``; a missing key takes the default of the family's ``transformers`` config class.
    """

    #: The ``model_type`` of config.json; the registry name of the converter.
    model_type: ClassVar[str] = ""
    #: ``architectures`` entry written on export (the class transformers should load).
    architecture: ClassVar[str] = ""
    #: Canonical tensor names start with this (``model.``, ``transformer.``); checkpoints of the
    #: bare base model (``LlamaModel``, ``GPT2Model``) leave it out and get it added on import.
    base_prefix: ClassVar[str] = ""
    #: Regexes of tensors some checkpoints carry that hold no weights (old buffers such as
    #: ``position_ids``, ``rotary_emb.inv_freq``, GPT-2's ``attn.bias`` mask).
    ignored: ClassVar[tuple[str, ...]] = ()
    #: Tensors some checkpoints carry that seqzoo knowingly leaves out, as {regex: what they are}
    #: (BERT pre-training's next-sentence head): the import skips them and says in one warning
    #: line what it dropped.
    dropped: ClassVar[dict[str, str]] = {}
    #: Exported when named (``model_type=``, ``--model-type``), and picked by ``to_hf`` on its own
    #: only when no other family fits: a family whose models mostly have another family's layout
    #: (xlm-roberta has roberta's; a Phi-3 without LongRoPE or partial rotary is a LLaMA or Mistral).
    named_only: ClassVar[bool] = False

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        """The seqzoo recipe (``model`` section at least) for ``config``. ``names`` are the
        checkpoint's canonical tensor names, for what only the weights tell (a pooler, a head)."""
        raise NotImplementedError(f"{type(self).__name__} must implement recipe(config)")

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        """How every seqzoo tensor is made from the checkpoint's tensors, for ``config`` and the
        resolved ``recipe`` (which says what the weights decided: a tied head, a pooler)."""
        raise NotImplementedError(f"{type(self).__name__} must implement rules(config, recipe)")

    def aliases(self, config: dict, recipe: dict) -> dict[str, str]:
        """Tied copies a checkpoint may also store: {name: the canonical name it duplicates}."""
        return {}

    def accepts(self, recipe: dict) -> str | None:
        """None if a model with this resolved recipe can be exported as this family, else why not."""
        raise NotImplementedError(f"{type(self).__name__} cannot export")

    def hf_config(self, model: nn.Module) -> dict:
        """The config.json dict for a seqzoo model this converter accepts."""
        raise NotImplementedError(f"{type(self).__name__} cannot export")

    def canonical_names(self, names: Collection[str]) -> dict[str, str]:
        """{canonical name: stored name}; adds ``base_prefix`` to a bare base model's names."""
        prefix = self.base_prefix
        if prefix and not any(n.startswith(prefix) for n in names):
            return {n if n.startswith("lm_head.") else prefix + n: n for n in names}
        return {n: n for n in names}

    def to_seqzoo(self, hf_tensors: Mapping[str, Tensor], config: dict) -> dict[str, Tensor]:
        """seqzoo state dict from canonical Hugging Face tensors (no checks; ``from_hf`` checks)."""
        recipe = resolve(full_recipe(self, config, None, list(hf_tensors))).data
        return {t: x for r in self.rules(config, recipe)
                for t, x in zip(r.targets, r.load_all(*(hf_tensors[s] for s in r.sources)), strict=True)}

    def to_hf(self, model: nn.Module) -> tuple[dict, dict[str, Tensor]]:
        """(config.json dict, Hugging Face tensors) for a seqzoo model this converter accepts."""
        config = self.hf_config(model)
        state = model.state_dict()
        rules = self.rules(config, model.recipe)
        _check_coverage(self, model, rules)
        tensors: dict[str, Tensor] = {}
        for rule in rules:
            saved = rule.save(*(state[t].detach() for t in rule.targets))
            for name, tensor in zip(rule.sources, saved, strict=True):
                tensors[name] = tensor.to("cpu").contiguous().clone()  # clone: split views share memory
        return config, tensors



class CausalLMConverter(HFConverter):
    """A decoder-only family: the token embedding is the HF tensor ``embedding``, and the output
    head is ``lm_head.weight`` — stored, or tied to the embedding (then a checkpoint may still
    carry the copy, which must equal it)."""

    #: The HF name of the token embedding (``model.embed_tokens.weight``, ``transformer.wte.weight``).
    embedding: ClassVar[str] = ""

    def ends(self, recipe: dict, final_norm: str, norm_bias: bool) -> list[Rule]:
        """The rules outside the layers: the embedding, the final norm (HF ``final_norm``) and an
        untied head."""
        rules = [copy("embed.weight", self.embedding), *norm("decoder.final_norm", final_norm, norm_bias)]
        if not recipe["model"]["tie_embeddings"]:
            rules.append(copy("lm_head.weight", "lm_head.weight"))
        return rules

    def aliases(self, config: dict, recipe: dict) -> dict[str, str]:
        return {"lm_head.weight": self.embedding} if recipe["model"]["tie_embeddings"] else {}

def _check_coverage(converter: HFConverter, model: nn.Module, rules: list[Rule]) -> None:
    """Every seqzoo tensor must be made by a rule, or share its memory with one that is (a tied
    head); a converter that misses one would leave random weights behind."""
    state = model.state_dict()
    targets = {t for r in rules for t in r.targets}

    def where(t: Tensor) -> tuple:
        return t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)

    filled = {where(state[n]) for n in targets if n in state}
    uncovered = sorted(n for n, t in state.items() if n not in targets and where(t) not in filled)
    unknown = sorted(targets - set(state))
    if uncovered or unknown:
        problems = ([f"no rule fills {few(uncovered)}"] if uncovered else []) + \
                   ([f"rules name unknown tensors {few(unknown)}"] if unknown else [])
        raise CheckpointError(f"converter {converter.model_type!r} does not match the model it built: "
                              + "; ".join(problems))


def special_ids(model: nn.Module) -> dict[str, int | None]:
    """bos/eos/pad ids for config.json, from the model's tokenizer."""
    tok = tokenizer(model)
    return {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}


# -- reading a Hugging Face folder -----------------------------------------------------------------
def read_config(folder: Path) -> dict:
    """config.json of a Hugging Face folder, or a CheckpointError saying what is wrong."""
    if not folder.exists():
        raise CheckpointError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a folder; give the Hugging Face checkpoint folder "
                              f"(config.json + model.safetensors)")
    path = folder / CONFIG
    if not path.is_file():
        raise CheckpointError(f"{folder}: no {CONFIG}; a Hugging Face checkpoint folder has config.json "
                              f"and model.safetensors")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


class HFWeights(Mapping):
    """The tensors of a Hugging Face folder, read lazily from one or more safetensors files."""

    def __init__(self, folder: Path, stack: contextlib.ExitStack) -> None:
        self.folder = folder
        index, single = folder / INDEX, folder / WEIGHTS
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
                raise CheckpointError(f"{index}: not a safetensors index ({type(error).__name__}: "
                                      f"{error})") from None
            files = sorted(set(weight_map.values()))
        elif single.is_file():
            files, weight_map = [WEIGHTS], None
        else:
            pickles = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
            if pickles:
                raise CheckpointError(
                    f"{folder}: has only {', '.join(pickles)} (pickle); seqzoo reads safetensors only. "
                    f"Convert it once with transformers: AutoModel.from_pretrained(folder)"
                    f".save_pretrained(new_folder) writes model.safetensors")
            raise CheckpointError(f"{folder}: no {WEIGHTS} or {INDEX}")
        self.handles = {}
        for name in files:
            path = folder / name
            if not path.is_file():
                raise CheckpointError(f"{folder}: shard {name} listed in {INDEX} is missing")
            try:
                self.handles[name] = stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            except (SafetensorError, OSError, ValueError) as error:
                raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from None
        self.where: dict[str, str] = {}
        for file, handle in self.handles.items():
            for key in handle.keys():
                self.where[key] = file
        if weight_map is not None:
            lost = sorted(k for k, f in weight_map.items() if self.where.get(k) != f)
            if lost:
                raise CheckpointError(f"{index}: tensors listed but not in their shard: {few(lost)}")

    def __getitem__(self, name: str) -> Tensor:
        return self.handles[self.where[name]].get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.handles[self.where[name]].get_slice(name).get_shape())

    def dtype(self) -> str | None:
        """The dtype of the first floating-point tensor ("float32", "bfloat16", ...)."""
        for name in self.where:
            text = self.handles[self.where[name]].get_slice(name).get_dtype()
            found = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}.get(text)
            if found:
                return found
        return None


# -- converters from the registry ------------------------------------------------------------------
def supported() -> list[str]:
    """The model_types some registered converter handles."""
    return registry().names("converter")


def converter_for(model_type: Any, where: str = "config.json") -> HFConverter:
    """The registered converter for ``model_type``; a clear error naming the supported ones."""
    names = supported()
    if not isinstance(model_type, str) or model_type not in names:
        what = "no model_type" if model_type is None else f"model_type {model_type!r} is not supported"
        raise CheckpointError(f"{where}: {what}; supported: {', '.join(names)} (a converter "
                              f"plugin of kind 'converter' adds a family)")
    return registry().get("converter", model_type).cls()


def _tokenizer_spec(folder: Path | None, config: dict) -> dict:
    """An ``hf`` tokenizer for the folder's tokenizer.json (or none: ids only), with the special
    ids config.json names."""
    def first(value):  # eos_token_id may be a list (Llama 3); some configs say -1 for none
        if isinstance(value, list):
            value = value[0] if value else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    path = folder / TOKENIZER if folder is not None else None
    return {"kind": "hf", "path": str(path.resolve()) if path is not None and path.is_file() else None,
            "bos_id": first(config.get("bos_token_id")), "eos_id": first(config.get("eos_token_id")),
            "pad_id": first(config.get("pad_token_id"))}


def full_recipe(converter: HFConverter, config: dict, folder: Path | None, names: Collection[str],
                dtype: str | None = None) -> dict:
    """The converter's recipe with a tokenizer (``hf``, from the folder's tokenizer.json if any)
    and the runtime dtype filled in."""
    recipe = converter.recipe(config, names)
    recipe.setdefault("seqzoo", 1)
    recipe.setdefault("tokenizer", _tokenizer_spec(folder, config))
    runtime = dict(recipe.get("runtime") or {})
    if dtype is not None:
        runtime["dtype"] = dtype
    recipe["runtime"] = runtime
    return recipe


def from_hf(path: str | os.PathLike, *, device: str | torch.device | None = None,
            dtype: str | None = None) -> nn.Module:
    """Load a Hugging Face checkpoint folder as a seqzoo model with an ordinary recipe.

    ``dtype`` (float32, bfloat16, ...) defaults to the stored weights' dtype; ``device`` to the
    recipe's ``auto``. The model's tokenizer (``tokenizer.json`` when present) travels with it:
    ``seqzoo.save`` stores it, so the checkpoint later needs no other file.
    """
    folder = Path(path)
    config = read_config(folder)
    converter = converter_for(config.get("model_type"), str(folder / CONFIG))
    with contextlib.ExitStack() as stack:
        weights = HFWeights(folder, stack)
        tokenizer_file = folder / TOKENIZER
        return load_converted(converter, config, weights, folder, device=device, dtype=dtype or weights.dtype(),
                              tokenizer_text=tokenizer_file.read_text(encoding="utf-8")
                              if tokenizer_file.is_file() else None)


def load_converted(converter: HFConverter, config: dict, weights: Mapping, folder: Path, *,
                   device: str | torch.device | None, dtype: str | None, tokenizer_text: str | None = None,
                   tokenizer_spec: dict | None = None) -> nn.Module:
    """A seqzoo model from Hugging Face-named tensors: ``weights`` maps each stored name to its
    tensor and has ``shape(name)`` (a folder's safetensors, or another format's tensors under HF
    names); ``folder`` names the source in messages. ``tokenizer_spec`` replaces the recipe's
    ``hf`` tokenizer from config.json; ``tokenizer_text`` is the tokenizer.json it carries."""
    stored = converter.canonical_names(list(weights))  # canonical -> stored name
    recipe = full_recipe(converter, config, folder, stored, dtype)
    if tokenizer_spec is not None:
        recipe["tokenizer"] = tokenizer_spec
    resolved = resolve(recipe)
    target = device if isinstance(device, torch.device) else pick_device(device or "auto")
    model = instantiate(resolved, device="meta")  # no random init of weights about to be replaced
    rules = converter.rules(config, resolved.data)
    renamed = _check_weights(converter, config, folder, model, rules, weights, stored)
    if any(True for _ in model.buffers()):
        model = instantiate(resolved, device=target)  # non-weight state must come from the build
    else:
        check_fits(model, next(model.parameters()).dtype, target)  # a clear error, not an OOM
        model = model.to_empty(device=target)
        if isinstance(model, LanguageModel):
            model.tie_weights()  # to_empty gives each module its own copy of a shared weight
    _check_coverage(converter, model, rules)
    state = model.state_dict()
    with torch.no_grad():
        for rule in rules:
            tensors = rule.load_all(*(weights[renamed[s]] for s in rule.sources))
            for target_name, tensor in zip(rule.targets, tensors, strict=True):
                state[target_name].copy_(tensor.to(dtype=state[target_name].dtype))
    if tokenizer_text is not None:
        model.tokenizer_state = tokenizer_text
    model.eval()
    return model


def _check_weights(converter: HFConverter, config: dict, folder: Path, model: nn.Module,
                   rules: list[Rule], weights: HFWeights, stored: dict[str, str]) -> dict[str, str]:
    """Compare the checkpoint with what the rules need; return {canonical: stored name}.

    Raises one CheckpointError naming every missing, unexpected and mis-shaped tensor, and tied
    copies that differ from the tensor they should duplicate.
    """
    state = model.state_dict()
    expected: dict[str, tuple[int, ...]] = {}
    for rule in rules:
        # Shapes only: saving a meta copy costs nothing (a fused qkv reorder would copy real data).
        meta = [torch.empty_like(state[t], device="meta") for t in rule.targets]
        for name, tensor in zip(rule.sources, rule.save(*meta), strict=True):
            expected[name] = tuple(tensor.shape)
    names = dict(stored)
    problems = []
    aliases = converter.aliases(config, model.recipe)
    for alias, source in aliases.items():
        if alias in names and source not in names and source in expected:
            names[source] = names.pop(alias)  # only the tied copy was stored: use it
        elif alias in names and source in names:
            if not torch.equal(weights[names[alias]], weights[names[source]]):
                problems.append(f"{alias} differs from {source}, but the config ties them "
                                f"(set tie_word_embeddings: false in config.json to keep both)")
    ignored = [re.compile(p) for p in converter.ignored]
    missing = sorted(n for n in expected if n not in names)
    extra = [n for n in names if n not in expected and n not in aliases and not any(p.search(n) for p in ignored)]
    dropped = {what: sorted(n for n in extra if re.search(p, n)) for p, what in converter.dropped.items()}
    dropped = {what: found for what, found in dropped.items() if found}
    unexpected = sorted(n for n in extra if not any(n in found for found in dropped.values()))
    shapes = sorted(f"{n} {weights.shape(names[n])} != {shape}" for n, shape in expected.items()
                    if n in names and weights.shape(names[n]) != shape)
    problems += mismatches(missing, unexpected, shapes, against="config")
    if problems:
        raise CheckpointError(f"{folder}: weights do not match its {converter.model_type} config: "
                              + "; ".join(problems))
    if dropped:
        what = "; ".join(f"{what} ({few(found)})" for what, found in dropped.items())
        warnings.warn(f"{folder}: dropped {what}: seqzoo's {model.recipe['model']['kind']} has no place "
                      f"for it", stacklevel=3)
    return names


# -- export ----------------------------------------------------------------------------------------
def exporter_for(model: nn.Module, model_type: str | None = None) -> HFConverter:
    """The converter that exports ``model``: the one named, or the only one that accepts it
    (named-only families count when no other family accepts it)."""
    if not isinstance(model, Model) or model.recipe is None:
        raise SeqzooError("model has no .recipe; build, load or import it with seqzoo")
    recipe = model.recipe
    if model_type is not None:
        converter = converter_for(model_type, "model_type")
        reason = converter.accepts(recipe)
        if reason is not None:
            raise CheckpointError(f"cannot export as {model_type}: {reason}")
        return converter
    reasons = {}
    accepting, named_only = [], []
    for name in supported():
        converter = converter_for(name)
        reason = converter.accepts(recipe)
        if reason is None:
            (named_only if converter.named_only else accepting).append(converter)
        elif not converter.named_only:
            reasons[name] = reason
    accepting = accepting or named_only  # a named-only family only when it alone fits
    if len(accepting) == 1:
        return accepting[0]
    if accepting:
        names = ", ".join(c.model_type for c in accepting)
        raise CheckpointError(f"several Hugging Face families fit this model ({names}); pick one "
                              f"with model_type=... (--model-type)")
    detail = "; ".join(f"{name}: {why}" for name, why in reasons.items())
    raise CheckpointError(f"no Hugging Face converter can export this {recipe['model']['kind']} "
                          f"model ({detail})")


def to_hf(model: nn.Module, out_dir: str | os.PathLike, *, model_type: str | None = None) -> Path:
    """Write ``model`` as a Hugging Face folder that ``transformers`` loads: config.json,
    model.safetensors and the tokenizer's tokenizer.json plus tokenizer_config.json (an ``hf``
    tokenizer's own, the ``bytes`` tokenizer's byte-level one; a warning when there is none).
    Every file is written atomically with the umask's mode. Returns the folder."""
    model = unwrap(model)
    converter = exporter_for(model, model_type)
    folder = Path(out_dir)
    if folder.exists() and not folder.is_dir():
        raise CheckpointError(f"{folder}: exists and is not a folder")
    if (folder / INDEX).exists():
        raise CheckpointError(f"{folder}: already holds a sharded checkpoint ({INDEX}); export into "
                              f"an empty folder")
    config, tensors = converter.to_hf(model)
    config = {"architectures": [converter.architecture], "model_type": converter.model_type, **config}
    dtype = next((str(t.dtype).removeprefix("torch.") for t in tensors.values() if t.is_floating_point()), None)
    if dtype is not None:
        config.setdefault("dtype", dtype)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / WEIGHTS, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    write_text_atomic(folder / CONFIG, json.dumps(config, indent=2, sort_keys=True) + "\n")
    _write_tokenizer(model, folder)
    return folder


def _write_tokenizer(model: nn.Module, folder: Path) -> None:
    """The model's tokenizer as Hugging Face files, or a one-line warning that none was written.

    An ``hf`` tokenizer writes its tokenizer.json back, with the files that sat next to it. Any
    other tokenizer exports through its own ``to_hf_files()`` ({file name: text}; the bytes
    tokenizer's is a byte-level tokenizer.json), which raises a SeqzooError when it cannot.
    """
    spec = model.recipe.get("tokenizer", "bytes")
    kind = kind_of(spec)
    tok = tokenizer(model)
    if kind != "hf":
        try:
            files = tok.to_hf_files()
        except SeqzooError as error:  # the weights are still worth exporting
            warnings.warn(f"{folder}: no tokenizer written: {error}", stacklevel=3)
            return
        if files is None:
            warnings.warn(f"{folder}: no tokenizer written: the {kind!r} tokenizer has no Hugging Face "
                          f"form (its to_hf_files() gives none)", stacklevel=3)
            return
        for name, content in files.items():
            write_text_atomic(folder / name, content)
        return
    text = tok.to_str()
    if text is None:
        warnings.warn(f"{folder}: no tokenizer written: the model was imported without a tokenizer.json",
                      stacklevel=3)
        return
    write_text_atomic(folder / TOKENIZER, text)
    source = Path(spec["path"]).parent if isinstance(spec, dict) and spec.get("path") else None
    copied = False
    if source is not None and source.is_dir() and source.resolve() != folder.resolve():
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                atomic_write(folder / name, lambda tmp, name=name: shutil.copyfile(source / name, tmp))
                copied = copied or name == "tokenizer_config.json"
    if not copied and not (folder / "tokenizer_config.json").exists():
        special = {"bos_token": tok.token(tok.bos_id), "eos_token": tok.token(tok.eos_id),
                   "pad_token": tok.token(tok.pad_id)}
        config = {"tokenizer_class": "PreTrainedTokenizerFast",
                  **{k: v for k, v in special.items() if v is not None}}
        write_text_atomic(folder / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
