"""``to_gguf(model, path)`` and ``from_gguf(path)``: a model goes through its Hugging Face converter
(``converter.to_hf`` gives config.json keys and HF-named tensors), then through the family's
``GGUFArch`` (``converter.gguf``): metadata keys from the config, GGUF names from the gguf package's
tensor map, value transforms as ``Rule`` s. The import runs the same steps backwards and hands the
HF tensors to the converter's checked load (``seqzoo.io.hf.load_converted``), like any HF folder.
"""
from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import CheckpointError, few
from ...files import check_output_file
from ...interfaces import Model
from ...recipe import resolve
from ...registry import registry
from ..checkpoint import unwrap
from ..gguf_types import WRITABLE
from ..hf import converter_for, exporter_for, full_recipe, load_converted
from ..hf.converter import special_ids
from ..hf.rules import Rule
from . import tokenizer as tokens
from .arch import GGUFArch, as_is, head_scale, llama3_factors
from .reader import GGUFFile, gguf_package

#: Tensors llama.cpp keeps in float32 whatever the file's type (its converter's policy): besides
#: every vector, these matrices are read as float32 by its kernels.
KEEP_F32 = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "position_embd.weight", "token_types.weight",
            "ssm_conv1d.weight", "rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight",
            "ssm_a", "ssm_d", "ssm_conv1d_q.weight", "ssm_conv1d_k.weight", "ssm_conv1d_v.weight",
            "shortconv.conv.weight")
OUTPUT, EMBEDDING, ROPE_FREQS = "output.weight", "token_embd.weight", "rope_freqs.weight"
LONG, SHORT = "rope_factors_long.weight", "rope_factors_short.weight"


def families() -> dict[str, list[str]]:
    """{llama.cpp architecture: the HF model_types written as it}."""
    out: dict[str, list[str]] = {}
    for name in registry().names("converter"):
        arch = registry().get("converter", name).cls.gguf
        for each in (arch, *arch.variants) if arch is not None else ():
            out.setdefault(each.name, []).append(name)
    return out


def _arch_enum(name: str):
    gguf = gguf_package()
    return {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[name]


#: A per-expert HF tensor (``….experts.3.gate_proj.weight``, Mixtral's ``….experts.3.w1.weight``):
#: llama.cpp stores a layer's experts stacked, [E, …], under the name of ``….experts.gate_proj``.
EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<index>\d+)\.(?P<which>\w+)\.(?P<part>weight|bias)$")


def tensor_rules(arch: GGUFArch, config: Mapping, names: list[str], blocks: int, where: str) -> list[Rule]:
    """The ``Rule`` s between HF and GGUF tensors: the HF tensor(s) as target, the GGUF tensor(s)
    as sources; a layer's per-expert tensors become one stacked GGUF tensor."""
    table = gguf_package().get_tensor_name_map(_arch_enum(arch.name), blocks)

    def gguf_name(hf: str) -> str | None:
        for pattern, replacement in arch.renames.items():
            hf = re.sub(pattern, replacement, hf)
        return table.get_name(hf, try_suffixes=(".weight", ".bias"))

    rules, experts = [], {}
    for hf in names:
        match = EXPERT.match(hf)
        if match:
            stacked = f"{match['prefix']}.{match['which']}.{match['part']}"
            experts.setdefault(stacked, []).append((int(match["index"]), hf))
            continue
        transform = next((t for t in arch.transforms if re.search(t.pattern, hf)), None)
        name = gguf_name(hf)
        if transform is None and name is None:
            raise CheckpointError(f"{where}: {hf} has no llama.cpp name in its {arch.name} architecture")
        rules.append((transform.rule if transform else as_is)(hf, name, config))
    for stacked, members in experts.items():
        name = gguf_name(stacked)
        if name is None:
            raise CheckpointError(f"{where}: {stacked} has no llama.cpp name in its {arch.name} architecture")
        targets = tuple(hf for _, hf in sorted(members))
        rules.append(Rule(targets, (name,), lambda t: tuple(t.unbind(0)), lambda *t: (torch.stack(t),)))
    return rules


def _blocks(arch: GGUFArch, config: Mapping) -> int:
    """How many blocks the name map must know: the deeper stack's (T5's decoder may be deeper)."""
    return max(int(config[k.hf]) for k in arch.keys
               if k.name in ("block_count", "decoder_block_count") and config.get(k.hf) is not None)


# -- metadata -------------------------------------------------------------------------------------
def _add(writer, key: str, value: Any, kind: str | None = None) -> None:
    """One metadata key with llama.cpp's exact type (its loader refuses a key of another type)."""
    if isinstance(value, (list, tuple)):
        writer.add_array(key, list(value))
    elif kind == "bool" or isinstance(value, bool):
        writer.add_bool(key, bool(value))
    elif kind == "f32" or (kind is None and isinstance(value, float)):
        writer.add_float32(key, float(value))
    elif kind == "str" or isinstance(value, str):
        writer.add_string(key, str(value))
    elif kind in (None, "u32"):
        writer.add_uint32(key, int(value))
    else:
        raise ValueError(f"unknown GGUF key type {kind!r}")


def rope_metadata(config: Mapping) -> dict[str, Any]:
    """RoPE's base and scaling (linear, YaRN) as llama.cpp's keys; Llama 3's and LongRoPE's
    factors are tensors instead (``rope_tensors``)."""
    p = dict(config.get("rope_parameters") or {})
    theta = p.get("rope_theta", config.get("rope_theta"))
    out: dict[str, Any] = {} if theta is None else {"rope.freq_base": float(theta)}
    kind = p.get("rope_type", "default")
    if kind == "linear":
        out.update({"rope.scaling.type": "linear", "rope.scaling.factor": float(p["factor"])})
    elif kind == "yarn":
        out.update({"rope.scaling.type": "yarn", "rope.scaling.factor": float(p["factor"]),
                    "rope.scaling.original_context_length": int(p["original_max_position_embeddings"])})
        for key, name in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
            if p.get(key) is not None:
                out[f"rope.scaling.{name}"] = float(p[key])
        if p.get("truncate") is False:
            raise CheckpointError("export-gguf: this YaRN keeps its correction range fractional (truncate: false); "
                                  "llama.cpp rounds it to whole dimensions")
        if p.get("attention_factor") is not None:
            raise CheckpointError("export-gguf: YaRN's attention_factor is set explicitly; llama.cpp derives it from "
                                  "the factor (0.1·ln(factor) + 1) and has no key for another value")
    elif kind == "llama3":  # the factors are a tensor; these keys (ignored by llama.cpp) bring them back
        out.update({"rope.scaling.original_context_length": int(p.get("original_max_position_embeddings", 8192)),
                    "rope.scaling.low_freq_factor": float(p.get("low_freq_factor", 1.0)),
                    "rope.scaling.high_freq_factor": float(p.get("high_freq_factor", 4.0))})
    elif kind == "longrope":  # the factors are tensors (``rope_factors_long`` / ``_short``)
        original = int(p.get("original_max_position_embeddings") or config["original_max_position_embeddings"])
        out.update({"rope.scaling.original_context_length": original,
                    "rope.scaling.attn_factor": longrope_attention(p, config["max_position_embeddings"], original)})
    elif kind != "default":
        raise CheckpointError(f"export-gguf: RoPE scaling {kind!r} has no llama.cpp form (linear, yarn, llama3, "
                              f"longrope have)")
    return out


def longrope_attention(p: Mapping, context: int, original: int) -> float:
    """LongRoPE's scale of cos and sin: the config's, else transformers' default
    √(1 + ln(s) / ln(L)) for s = context / L > 1 (L the original context), else 1."""
    if p.get("attention_factor") is not None:
        return float(p["attention_factor"])
    scale = context / original
    return math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0


def rope_parameters(get, theta_default: float = 10000.0) -> dict:
    """The inverse of ``rope_metadata`` (Llama 3 factors are read from the tensor)."""
    p: dict[str, Any] = {"rope_type": "default", "rope_theta": float(get("rope.freq_base", theta_default))}
    kind = get("rope.scaling.type", "none")
    if kind == "linear":
        p.update(rope_type="linear", factor=float(get("rope.scaling.factor")))
    elif kind == "yarn":
        p.update(rope_type="yarn", factor=float(get("rope.scaling.factor")),
                 original_max_position_embeddings=int(get("rope.scaling.original_context_length")),
                 beta_fast=float(get("rope.scaling.yarn_beta_fast", 32.0)),
                 beta_slow=float(get("rope.scaling.yarn_beta_slow", 1.0)))
    elif kind not in ("none", None):
        raise CheckpointError(f"rope.scaling.type {kind!r} is not read by seqzoo (none, linear, yarn are)")
    return p


def _llama3_parameters(factors: torch.Tensor, p: dict, head_dim: int, get, where: str) -> dict:
    """Llama 3's scaling parameters that give the file's ``rope_freqs``. llama.cpp keeps the
    factors only; seqzoo's files add the original context and the two frequency bounds, and other
    files are read with Llama 3.1's (8192, 1, 4), checked against the factors."""
    guess = {**{k: v for k, v in p.items() if k in ("rope_theta",)}, "rope_type": "llama3",
             "factor": float(factors.max()), "low_freq_factor": float(get("rope.scaling.low_freq_factor", 1.0)),
             "high_freq_factor": float(get("rope.scaling.high_freq_factor", 4.0)),
             "original_max_position_embeddings": int(get("rope.scaling.original_context_length", 8192))}
    if torch.allclose(llama3_factors(guess, head_dim), factors, rtol=1e-5, atol=1e-6):
        return guess
    raise CheckpointError(f"{where}: rope_freqs holds frequency factors that no Llama 3 scaling with original "
                          f"context {guess['original_max_position_embeddings']} gives; seqzoo cannot turn them back "
                          f"into RoPE parameters")


def metadata_for(arch: GGUFArch, config: Mapping) -> dict[str, tuple[Any, str | None]]:
    """{GGUF key: (value, type)} llama.cpp reads for ``config``: the family's keys, RoPE, fixed and
    derived keys."""
    metadata: dict[str, tuple[Any, str | None]] = {}
    for key in arch.keys:
        if config.get(key.hf) is not None:
            metadata[arch.key(key.name)] = (config[key.hf], key.kind)
    derived = {**(rope_metadata(config) if arch.rope else {}), **arch.fixed,
               **(arch.export(config) if arch.export else {})}
    metadata.update({arch.key(k): (v, None) for k, v in derived.items()})
    return metadata


#: Keys of the architecture a file may carry that change nothing seqzoo reads differently.
HARMLESS = ("vocab_size", "rope.scaling.finetuned", "rope.scaling.original_context_length", "attention.causal",
            "pooling_type")


def unread_keys(source: GGUFFile, arch: GGUFArch, config: Mapping) -> list[str]:
    """The file's ``{arch}.`` keys seqzoo would not have written for the config it read: keys of
    behaviour seqzoo does not read (a window, a scale), which would otherwise be lost in silence."""
    known = set(metadata_for(arch, config)) | {arch.key(k) for k in HARMLESS}
    unread = []
    for key, value in source.meta.items():
        if not key.startswith(arch.name + ".") or key in known:
            continue
        if key == arch.key("rope.dimension_count"):
            head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
            if value == head_dim:
                continue
        unread.append(key)
    return sorted(unread)


# -- export ---------------------------------------------------------------------------------------
def _refusal(model: nn.Module) -> str | None:
    """What in the model no llama.cpp architecture holds, named by its component."""
    m = model.recipe["model"]

    def name(mixer) -> str | None:
        if not isinstance(mixer, dict):
            return mixer
        cell = mixer.get("cell")
        return f"{mixer['kind']} ({cell['kind']})" if isinstance(cell, dict) else mixer["kind"]

    mixers = {name(m.get("mixer"))} | {name(t.get("mixer")) for t in (m.get("layer_types") or {}).values()
                                       if isinstance(t, dict) and t.get("mixer")}
    odd = sorted(k for k in mixers if k not in (None, "attention", "mamba", "mamba2"))
    if odd:
        return f"a {', '.join(odd)} mixer: GGUF has no architecture with it (llama.cpp runs attention, Mamba, Mamba-2)"
    score = (m.get("attention") or {}).get("score")
    kind = score.get("kind") if isinstance(score, dict) else score
    if kind not in (None, "scaled_dot"):
        return f"the {kind} attention score: llama.cpp computes scaled dot products only"
    return None


def _exporter(model: nn.Module, model_type: str | None):
    try:
        converter = exporter_for(model, model_type)
    except CheckpointError as error:
        refusal = _refusal(model) if isinstance(model, Model) and model.recipe else None
        raise CheckpointError(f"export-gguf: {refusal}" if refusal else f"export-gguf: {error}") from None
    if converter.gguf is None:
        known = ", ".join(f"{a} ({', '.join(t)})" for a, t in sorted(families().items()))
        raise CheckpointError(f"export-gguf: this model is a Hugging Face {converter.model_type}; seqzoo writes no "
                              f"GGUF form of that family yet (it writes: {known})")
    return converter


def _encoded(gguf, name: str, tensor: torch.Tensor, kind: str, fallbacks: list[str]):
    """(array for the writer, raw GGML type or None); vectors and llama.cpp's float32 matrices stay
    F32. A matrix whose rows a block type cannot divide is written F16, as llama.cpp's converter
    writes it, and named in ``fallbacks``."""
    t = tensor.detach().to("cpu", torch.float32).contiguous()
    if t.dim() < 2 or name.endswith(("_norm.weight", ".bias")) or name.endswith(KEEP_F32):
        kind = "F32"
    if kind not in ("F32", "F16", "BF16"):
        qtype = getattr(gguf.GGMLQuantizationType, kind)
        if t.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:
            fallbacks.append(f"{name} (rows of {t.shape[-1]})")
            kind = "F16"
    if kind == "F32":
        return t.numpy(), None
    if kind == "F16":
        return t.to(torch.float16).numpy(), None
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    # BF16 and the block types go through the package's own quantiser, as bytes of that type
    return gguf.quants.quantize(t.numpy(), qtype), qtype


def to_gguf(model: nn.Module, path: str | os.PathLike, *, dtype: str = "F32", model_type: str | None = None) -> Path:
    """Write a seqzoo model as a GGUF file llama.cpp runs, with its tokenizer. ``dtype``: the
    matrices' type — F32 (exact), F16, BF16 or a block quantisation (Q8_0, Q4_0, Q4_1, Q5_0,
    Q5_1) through the gguf package; norms and biases stay F32, and a matrix whose rows the block
    does not divide is written F16 with a warning naming it. ``model_type`` picks the HF family
    where several fit. Everything is checked before the file is opened. Returns the path."""
    check_output_file(path, "model.gguf")  # said before the work, not when the file is opened or renamed
    gguf = gguf_package()
    if dtype not in WRITABLE:
        raise CheckpointError(f"export-gguf: tensor type {dtype!r} is not supported; use {', '.join(WRITABLE)} "
                              f"(the installed gguf package cannot quantise K-quants)")
    model = unwrap(model)
    converter = _exporter(model, model_type)
    config, tensors = converter.to_hf(model)
    arch: GGUFArch = converter.gguf.written_as(config)
    where = f"export-gguf ({converter.model_type} as {arch.name})"
    problem = arch.problem(config) if arch.problem else None
    if problem:
        raise CheckpointError(f"{where}: {problem}")
    metadata = metadata_for(arch, config)
    stored: dict[str, torch.Tensor] = {}
    parameters = config.get("rope_parameters") or {}
    if arch.rope and parameters.get("rope_type") == "llama3":
        if arch.name != "llama":
            raise CheckpointError(f"{where}: llama.cpp reads Llama 3's RoPE factors (rope_freqs) only for llama")
        stored[ROPE_FREQS] = llama3_factors(parameters, config["head_dim"])
    if arch.rope and parameters.get("rope_type") == "longrope":
        if arch.name != "phi3":
            raise CheckpointError(f"{where}: llama.cpp reads LongRoPE's factors only for phi3")
        stored[LONG] = torch.tensor(parameters["long_factor"], dtype=torch.float32)
        stored[SHORT] = torch.tensor(parameters["short_factor"], dtype=torch.float32)
        warnings.warn(f"{where}: llama.cpp picks LongRoPE's long or short factors by its context size (n_ctx above "
                      f"{metadata[arch.key('rope.scaling.original_context_length')][0]}: long, for every token), "
                      f"where transformers and seqzoo pick by the sequence's length", stacklevel=2)
    dropped = sorted(n for n in tensors if any(re.search(p, n) for p in arch.drop))
    if dropped:
        warnings.warn(f"{where}: {few(dropped)} not written: llama.cpp's {arch.name} has no place for them",
                      stacklevel=2)
    kept = [n for n in tensors if n not in dropped]
    for rule in tensor_rules(arch, config, kept, _blocks(arch, config), where):
        stored.update(zip(rule.sources, rule.save(*(tensors[t] for t in rule.targets)), strict=True))
    if OUTPUT in stored and arch.output == "never":
        if not torch.equal(stored[OUTPUT], stored[EMBEDDING]):
            raise CheckpointError(f"{where}: llama.cpp's {arch.name} always uses the token embedding as the output "
                                  f"head; this model's lm_head differs from it")
        del stored[OUTPUT]
    if OUTPUT not in stored and arch.scaled_head and config.get(arch.scaled_head):
        stored[OUTPUT] = scaled_embedding(stored[EMBEDDING], arch, config)
    if OUTPUT not in stored and arch.output == "required":
        stored[OUTPUT] = stored[EMBEDDING]  # a tied head, written out: llama.cpp will not reuse the embedding
    rows = int(stored[EMBEDDING].shape[0])
    vocab = tokens.vocabulary(model, rows)
    fallbacks: list[str] = []
    encoded = {name: _encoded(gguf, name, tensor, dtype, fallbacks) for name, tensor in stored.items()}
    if fallbacks:
        block = gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, dtype)][0]
        warnings.warn(f"export-gguf: {few(fallbacks)}: {dtype}'s blocks of {block} do not divide these rows; they "
                      f"are written as F16, as llama.cpp's converter writes them", stacklevel=2)
    out = Path(path)
    partial = out.with_name(out.name + ".partial")  # renamed into place once whole: no half-written file
    writer = gguf.GGUFWriter(str(partial), arch.name)
    try:
        writer.add_name(str(model.recipe.get("name", "seqzoo model")))
        writer.add_file_type(_file_type(gguf, dtype))
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.add_vocab_size(rows)
        for key, (value, kind) in metadata.items():
            _add(writer, key, value, kind)
        tokens.write(writer, vocab, {**special_ids(model), **{k: config.get(k) for k in ("bos_token_id",
                                     "eos_token_id") if config.get(k) is not None}})
        if config.get("type_vocab_size"):
            writer.add_token_type_count(config["type_vocab_size"])
        for name, (array, raw) in encoded.items():
            writer.add_tensor(name, array, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(partial, out)
    except BaseException:
        partial.unlink(missing_ok=True)  # a failed write leaves nothing beside the target
        raise
    return out


def scaled_embedding(embedding: torch.Tensor, arch: GGUFArch, config: Mapping) -> torch.Tensor:
    """A ``scaled_head`` family's tied head as llama.cpp runs it: the embedding times d^-1/2, in
    float32 (the import recomputes it bit for bit to recognise the head as tied)."""
    return embedding.to(torch.float32) * head_scale(arch, config)


def _file_type(gguf, dtype: str) -> int:
    names = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16"}
    return int(getattr(gguf.LlamaFileType, names.get(dtype, f"MOSTLY_{dtype}")))


# -- import ---------------------------------------------------------------------------------------
def family_of(source: GGUFFile):
    """(converter, GGUFArch) that imports the file's architecture."""
    archs = families()
    where = str(source.path)
    if source.architecture not in archs:
        raise CheckpointError(f"{where}: general.architecture {source.architecture!r} is not supported; seqzoo reads "
                              f"{', '.join(sorted(archs))}")
    found = []
    for model_type in archs[source.architecture]:
        converter = converter_for(model_type)
        imports = converter.gguf.named(source.architecture).imports
        if imports is True or (callable(imports) and imports(source.get)):
            found.append(converter)
    if len(found) != 1:
        raise CheckpointError(f"{where}: {len(found)} seqzoo families read a {source.architecture} file with this "
                              f"metadata ({', '.join(c.model_type for c in found) or 'none'})")
    return found[0], found[0].gguf.named(source.architecture)


def hf_config(source: GGUFFile, converter, arch: GGUFArch) -> dict:
    """config.json keys from the file's metadata, keys llama.cpp defaults filled as it fills them."""
    config: dict[str, Any] = {"model_type": converter.model_type}
    for key in arch.keys:
        value = source.get(key.name, key.default)
        if value is None and not key.optional:
            raise CheckpointError(f"{source.path}: metadata {arch.key(key.name)} is missing; a {arch.name} file needs "
                                  f"it (llama.cpp refuses the file too)")
        if value is not None:
            config[key.hf] = float(value) if key.kind == "f32" else value
    if source.meta.get("tokenizer.ggml.token_type_count"):
        config["type_vocab_size"] = source.meta["tokenizer.ggml.token_type_count"]
    tokens_list = source.meta.get("tokenizer.ggml.tokens")
    config["vocab_size"] = len(tokens_list) if tokens_list is not None else source.shape(EMBEDDING)[0]
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        config[key] = source.meta.get(f"tokenizer.ggml.{name}_token_id")
    if arch.rope:
        config["rope_parameters"] = rope_parameters(source.get)
    if arch.config:
        config.update(arch.config(source.get))
    if arch.from_tensors:
        config.update(arch.from_tensors(frozenset(source.tensors)))
    same_shape = OUTPUT in source.tensors and source.shape(OUTPUT) == source.shape(EMBEDDING)
    if arch.scaled_head:
        config[arch.scaled_head] = same_shape and torch.equal(
            source.tensor(OUTPUT), scaled_embedding(source.tensor(EMBEDDING), arch, config))
    if OUTPUT not in source.tensors or (arch.scaled_head and config[arch.scaled_head]):
        config["tie_word_embeddings"] = True
    else:  # a head equal to the embedding is a tied one written out (required by some architectures)
        config["tie_word_embeddings"] = (arch.output == "required" and same_shape
                                         and torch.equal(source.tensor(OUTPUT), source.tensor(EMBEDDING)))
    return config


class _Tensors(dict):
    """HF-named tensors with ``shape(name)``, as ``load_converted`` reads them."""

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self[name].shape)


def from_gguf(path: str | os.PathLike, *, device: str | torch.device | None = None,
              dtype: str | None = None) -> nn.Module:
    """A GGUF file as a seqzoo model with its family's recipe and the file's tokenizer (float32
    unless ``dtype`` says otherwise: quantised tensors are dequantised)."""
    source = GGUFFile(path)
    converter, arch = family_of(source)
    where = str(source.path)
    config = hf_config(source, converter, arch)
    if LONG in source.tensors and SHORT in source.tensors:
        original = int(source.get("rope.scaling.original_context_length"))
        config["original_max_position_embeddings"] = original
        config["rope_parameters"] = {**config["rope_parameters"], "rope_type": "longrope",
                                     "long_factor": source.tensor(LONG).tolist(),
                                     "short_factor": source.tensor(SHORT).tolist(),
                                     "original_max_position_embeddings": original}
        attention = float(source.get("rope.scaling.attn_factor", 1.0))
        if not math.isclose(attention, longrope_attention({}, config["max_position_embeddings"], original),
                            rel_tol=1e-6):
            config["rope_parameters"]["attention_factor"] = attention
    if ROPE_FREQS in source.tensors:
        config["rope_parameters"] = _llama3_parameters(source.tensor(ROPE_FREQS), config["rope_parameters"],
                                                       int(config.get("head_dim") or config["hidden_size"]
                                                           // config["num_attention_heads"]), source.get, where)
    unread = unread_keys(source, arch, config)
    if unread:
        raise CheckpointError(f"{where}: metadata {few(unread)} is not read by seqzoo's {arch.name}: the model it "
                              f"describes computes something seqzoo would not; convert it without that key")
    recipe = resolve(full_recipe(converter, config, None, ())).data
    names = [s for rule in converter.rules(config, recipe) for s in rule.sources]
    rules = tensor_rules(arch, config, names, _blocks(arch, config), where)
    needed = {s for rule in rules for s in rule.sources}
    consumed = {ROPE_FREQS, LONG, SHORT} | ({OUTPUT} if config["tie_word_embeddings"] else set())
    missing = sorted(needed - set(source.tensors))
    unexpected = sorted(set(source.tensors) - needed - consumed)
    if missing or unexpected:
        said = ([f"missing {few(missing)}"] if missing else []) + \
               ([f"unexpected {few(unexpected)}"] if unexpected else [])
        raise CheckpointError(f"{where}: tensors do not match its {arch.name} metadata: {'; '.join(said)}")
    weights = _Tensors()
    for rule in rules:
        weights.update(zip(rule.targets, rule.load_all(*(source.tensor(s) for s in rule.sources)), strict=True))
    spec = {"kind": "hf", "path": None, "bos_id": config["bos_token_id"], "eos_id": config["eos_token_id"],
            "pad_id": config["pad_token_id"],
            # WordPiece files add [CLS] and [SEP] unless they say otherwise, as llama.cpp does
            "add_special_tokens": bool(source.meta.get("tokenizer.ggml.add_bos_token",
                                                       source.meta.get("tokenizer.ggml.model") == "bert")
                                       or source.meta.get("tokenizer.ggml.add_eos_token", False))}
    return load_converted(converter, config, weights, source.path, device=device, dtype=dtype or "float32",
                          tokenizer_text=tokens.read(source.meta, where), tokenizer_spec=spec)


def gguf_summary(path: str | os.PathLike) -> str:
    """One line: the file's architecture, size and tensor types (for the command line)."""
    source = GGUFFile(path)
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(source.types().items()))
    return (f"{source.architecture}, {source.get('block_count')} layers, dim {source.get('embedding_length')}, "
            f"vocab {len(source.meta.get('tokenizer.ggml.tokens', []))}; tensors: {kinds}")
