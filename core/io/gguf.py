"""GGUF files (llama.cpp's format) in and out for the LLaMA architecture: ``from_gguf(path)`` and
``to_gguf(model, path)``, through the ``gguf`` package (``pip install 'seqzoo[gguf]'``).

A GGUF file holds the config as metadata (``llama.block_count``, ``llama.embedding_length``, ...),
the tokenizer as metadata too (``tokenizer.ggml.tokens`` / ``merges`` / ``token_type``), and the
tensors under llama.cpp's names, quantised or not. The import reads the config into LLaMA's
Hugging Face keys and the tensors into LLaMA's Hugging Face names, then goes through the ``llama``
converter's rules like any Hugging Face folder (``hf.load_converted``): one mapping, checked the
same way. Tensors are dequantised by the ``gguf`` package's own dequantisers (F32, F16, BF16, Q8_0,
Q4_0, Q4_1 and the other types it knows). Two layout facts:

- llama.cpp permutes the q and k projections' rows so that each head's rotary pairs are adjacent
  (its RoPE rotates (2i, 2i+1)); transformers' and seqzoo's LLaMA rotate halves (i, i + D/2). The
  import undoes the permutation and the export applies it, so the imported recipe is LLaMA's.
- GGUF lists a tensor's dimensions innermost first; the ``gguf`` package hands them to numpy the
  other way round, which is torch's order.

The tokenizer becomes a ``tokenizers`` byte-level BPE (``tokenizer.ggml.model`` gpt2) with the
pre-tokenizer llama.cpp uses for the file's ``tokenizer.ggml.pre`` (GPT-2's regex; SmolLM's and
StarCoder's split every digit first), control tokens as special tokens.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from torch import nn

from ..errors import CheckpointError, few
from ..registry import registry, tokenizer
from .checkpoint import unwrap
from .gguf_types import WRITABLE
from .hf import load_converted

INSTALL = "pip install 'seqzoo[gguf]' (the gguf package)"
#: llama.cpp's tensor names (block i) -> LLaMA's Hugging Face names; q and k are (un)permuted.
LAYER_NAMES = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
               "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
               "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
               "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
               "ffn_down.weight": "mlp.down_proj.weight"}
OUTER_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
               "output.weight": "lm_head.weight"}
#: ``tokenizer.ggml.pre`` values and the splits llama.cpp applies before byte-level BPE.
GPT2_PRE = ("gpt2", "default", "mpt", "olmo", "jais")
DIGITS_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")


def _gguf():
    try:
        import gguf
    except ImportError:
        raise CheckpointError(f"GGUF files need the gguf package: {INSTALL}") from None
    return gguf


def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's q/k row order from transformers': each head's rows [half 1 | half 2] become
    pairs (r, r + D/2) next to each other."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of ``_permute``: adjacent rotary pairs back to halves."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


class GGUFFile(Mapping):
    """A GGUF file's metadata (``meta``) and its tensors under LLaMA's Hugging Face names,
    dequantised to float32 on access."""

    def __init__(self, path: str | os.PathLike) -> None:
        gguf = _gguf()
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path}: no such file")
        try:
            self.reader = gguf.GGUFReader(str(self.path))
        except Exception as error:  # the reader raises ValueError / struct.error on a bad file
            raise CheckpointError(f"{self.path}: not a readable GGUF file ({type(error).__name__}: {error})") from None
        self.meta = {name: field.contents() for name, field in self.reader.fields.items()}
        architecture = self.meta.get("general.architecture")
        if architecture != "llama":
            raise CheckpointError(f"{self.path}: general.architecture {architecture!r} is not supported; seqzoo "
                                  f"reads llama GGUF files")
        self.heads = self.meta["llama.attention.head_count"]
        self.kv_heads = self.meta.get("llama.attention.head_count_kv", self.heads)
        self.tensors = {}
        for t in self.reader.tensors:
            name = self._hf_name(t.name)
            if name is None:
                raise CheckpointError(f"{self.path}: tensor {t.name} has no place in a llama model")
            self.tensors[name] = t
        unknown = sorted({t.tensor_type.name for t in self.reader.tensors} - self.dequantisable())
        if unknown:
            raise CheckpointError(f"{self.path}: tensor types {', '.join(unknown)} cannot be dequantised by the gguf "
                                  f"package installed; supported: {', '.join(sorted(self.dequantisable()))}")

    @staticmethod
    def dequantisable() -> set[str]:
        """The tensor types the installed gguf package can turn into float32."""
        gguf = _gguf()
        plain = {"F32", "F16", "BF16", "F64"}  # the package has a dequantiser class per quantised type
        return plain | {t.name for t in gguf.GGMLQuantizationType
                        if isinstance(getattr(gguf.quants, t.name, None), type)}

    def _hf_name(self, name: str) -> str | None:
        if name in OUTER_NAMES:
            return OUTER_NAMES[name]
        parts = name.split(".", 2)
        if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER_NAMES:
            return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"
        return None

    def __getitem__(self, name: str) -> torch.Tensor:
        gguf = _gguf()
        t = self.tensors[name]
        array = gguf.quants.dequantize(t.data, t.tensor_type)
        tensor = torch.from_numpy(array.astype("float32", copy=True).reshape(self.shape(name)))
        if name.endswith("q_proj.weight"):
            return _unpermute(tensor, self.heads)
        if name.endswith("k_proj.weight"):
            return _unpermute(tensor, self.kv_heads)
        return tensor

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in reversed(self.tensors[name].shape.tolist()))

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def types(self) -> dict[str, int]:
        """How many tensors of each type the file holds."""
        out: dict[str, int] = {}
        for t in self.tensors.values():
            out[t.tensor_type.name] = out.get(t.tensor_type.name, 0) + 1
        return out

    # -- what the metadata says ------------------------------------------------------------------
    def config(self) -> dict:
        """LLaMA's config.json keys from the metadata."""
        m = self.meta
        scaling = m.get("llama.rope.scaling.type")
        if scaling not in (None, "none"):
            raise CheckpointError(f"{self.path}: llama.rope.scaling.type {scaling!r} is not supported; seqzoo reads "
                                  f"GGUF files with plain RoPE")
        dim, heads = m["llama.embedding_length"], self.heads
        head_dim = m.get("llama.attention.key_length", m.get("llama.rope.dimension_count", dim // heads))
        if m.get("llama.rope.dimension_count", head_dim) != head_dim:
            raise CheckpointError(f"{self.path}: llama.rope.dimension_count {m['llama.rope.dimension_count']} is not "
                                  f"supported; seqzoo's llama rotates whole heads of {head_dim}")
        special = {key: m.get(f"tokenizer.ggml.{name}_token_id")
                   for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding"))}
        return {"model_type": "llama", "vocab_size": len(m["tokenizer.ggml.tokens"]), "hidden_size": dim,
                "intermediate_size": m["llama.feed_forward_length"], "num_hidden_layers": m["llama.block_count"],
                "num_attention_heads": heads, "num_key_value_heads": self.kv_heads, "head_dim": head_dim,
                "max_position_embeddings": m["llama.context_length"],
                "rms_norm_eps": float(m["llama.attention.layer_norm_rms_epsilon"]),
                "rope_parameters": {"rope_type": "default",
                                    "rope_theta": float(m.get("llama.rope.freq_base", 10000.0))},
                "tie_word_embeddings": "lm_head.weight" not in self.tensors, "hidden_act": "silu", **special}

    def tokenizer_json(self) -> str:
        """The file's tokenizer as a tokenizers tokenizer.json text."""
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        m = self.meta
        kind, pre = m.get("tokenizer.ggml.model"), m.get("tokenizer.ggml.pre", "default")
        if kind != "gpt2":
            raise CheckpointError(f"{self.path}: tokenizer.ggml.model {kind!r} is not supported; seqzoo rebuilds "
                                  f"byte-level BPE (gpt2) tokenizers")
        if pre not in GPT2_PRE + DIGITS_PRE:
            raise CheckpointError(f"{self.path}: tokenizer.ggml.pre {pre!r} is not supported; supported: "
                                  f"{', '.join(GPT2_PRE + DIGITS_PRE)}")
        tokens = list(m["tokenizer.ggml.tokens"])
        merges = [tuple(pair.split(" ", 1)) for pair in m.get("tokenizer.ggml.merges", [])]
        bpe = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        bpe.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                             if pre in DIGITS_PRE else byte_level)
        bpe.decoder = decoders.ByteLevel()
        types = list(m.get("tokenizer.ggml.token_type", []))
        control = [AddedToken(t, special=True, normalized=False) for t, kind in zip(tokens, types) if kind == 3]
        bpe.add_special_tokens(control)
        return bpe.to_str()


def from_gguf(path: str | os.PathLike, *, device: str | torch.device | None = None,
              dtype: str | None = None) -> nn.Module:
    """A llama GGUF file as a seqzoo model with LLaMA's recipe and the file's tokenizer (float32
    unless ``dtype`` says otherwise: quantised tensors are dequantised)."""
    source = GGUFFile(path)
    config = source.config()
    converter = registry().get("converter", "llama").cls()
    spec = {"kind": "hf", "path": None, "bos_id": config["bos_token_id"], "eos_id": config["eos_token_id"],
            "pad_id": config["pad_token_id"],
            "add_special_tokens": bool(source.meta.get("tokenizer.ggml.add_bos_token"))}
    return load_converted(converter, config, source, source.path, device=device, dtype=dtype or "float32",
                          tokenizer_text=source.tokenizer_json(), tokenizer_spec=spec)


def to_gguf(model: nn.Module, path: str | os.PathLike, *, dtype: str = "F32") -> Path:
    """Write a LLaMA-family seqzoo model as a llama GGUF file, with its tokenizer (byte-level
    BPE). ``dtype``: the matrices' type — F32 (exact), F16, BF16, or the block quantisations
    Q8_0, Q4_0, Q4_1 through the gguf package's quantisers; norms stay F32, as llama.cpp keeps
    them. Returns the path."""
    gguf = _gguf()
    model = unwrap(model)
    converter = registry().get("converter", "llama").cls()
    problem = converter.accepts(model.recipe)
    if problem:
        raise CheckpointError(f"export-gguf writes llama models; this one is not: {problem}")
    config, tensors = converter.to_hf(model)
    if dtype not in WRITABLE:
        raise CheckpointError(f"export-gguf: tensor type {dtype!r} is not supported; use {', '.join(WRITABLE)}")
    if config["rope_parameters"]["rope_type"] != "default" or config.get("attention_bias") or config.get("mlp_bias"):
        raise CheckpointError("export-gguf: the llama GGUF layout written here has plain RoPE and no biases; "
                              "this model has RoPE scaling or biases")
    vocab, merges, control = _byte_level_bpe(model)
    out = Path(path)
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(str(model.recipe.get("name", "seqzoo model")))
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_pre_name(model))
    writer.add_token_list(vocab)
    writer.add_token_merges(merges)
    writer.add_token_types([3 if i in control else 1 for i in range(len(vocab))])
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                     ("pad_token_id", writer.add_pad_token_id)):
        if config.get(key) is not None:
            add(config[key])
    writer.add_add_bos_token(False)
    names = {hf: gguf_name for gguf_name, hf in OUTER_NAMES.items()}
    for i in range(config["num_hidden_layers"]):
        names.update({f"model.layers.{i}.{hf}": f"blk.{i}.{g}" for g, hf in LAYER_NAMES.items()})
    for name, tensor in tensors.items():
        if name.endswith("q_proj.weight"):
            tensor = _permute(tensor, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            tensor = _permute(tensor, config["num_key_value_heads"])
        if name not in names:
            raise CheckpointError(f"export-gguf: {name} has no llama.cpp name")
        kind = dtype if tensor.dim() == 2 else "F32"  # norms stay float32
        array, raw = _encoded(gguf, tensor, kind)
        writer.add_tensor(names[name], array, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


#: The tensor types ``to_gguf`` writes.


def _encoded(gguf, tensor: torch.Tensor, kind: str):
    """(numpy array for the writer, raw GGML type or None for a plain float array)."""
    t = tensor.detach().to("cpu", torch.float32).contiguous()
    if kind == "F32":
        return t.numpy(), None
    if kind == "F16":
        return t.to(torch.float16).numpy(), None
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    # BF16 and the block types go through the package's own quantiser, as bytes of that type
    return gguf.quants.quantize(t.numpy(), qtype), qtype


def _tokenizer_document(model: nn.Module) -> dict:
    tok = tokenizer(model)
    text = tok.to_str() or (tok.to_hf_files() or {}).get("tokenizer.json")
    if not text:
        raise CheckpointError("export-gguf: the model's tokenizer has no tokenizer.json form to write")
    return json.loads(text)


def _byte_level_bpe(model: nn.Module) -> tuple[list[str], list[str], set[int]]:
    """(tokens by id, merges as "a b", ids of special tokens) of the model's byte-level BPE."""
    doc = _tokenizer_document(model)
    bpe = doc.get("model") or {}
    if bpe.get("type") != "BPE":
        raise CheckpointError(f"export-gguf: the tokenizer is {bpe.get('type')!r}; GGUF's gpt2 tokenizer is "
                              f"byte-level BPE")
    ids = {**bpe["vocab"], **{t["content"]: t["id"] for t in doc.get("added_tokens", [])}}
    tokens = [None] * (max(ids.values()) + 1)
    for token, index in ids.items():
        tokens[index] = token
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise CheckpointError(f"export-gguf: the vocabulary has no token for ids {few([str(i) for i in missing])}")
    merges = [m if isinstance(m, str) else " ".join(m) for m in bpe.get("merges", [])]
    return tokens, merges, {t["id"] for t in doc.get("added_tokens", []) if t.get("special")}


def _pre_name(model: nn.Module) -> str:
    """``tokenizer.ggml.pre`` for the tokenizer's pre-tokenizer: smollm when digits split first."""
    pre = _tokenizer_document(model).get("pre_tokenizer") or {}
    kinds = [p.get("type") for p in pre.get("pretokenizers", [pre])]
    if kinds == ["ByteLevel"]:
        return "gpt2"
    if kinds == ["Digits", "ByteLevel"]:
        return "smollm"
    raise CheckpointError(f"export-gguf: the pre-tokenizer {kinds} has no llama.cpp name (gpt2 or smollm)")


def gguf_summary(path: str | os.PathLike) -> str:
    """One line: the file's architecture, size and tensor types (for the command line)."""
    source = GGUFFile(path)
    c = source.config()
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(source.types().items()))
    return (f"llama, {c['num_hidden_layers']} layers, dim {c['hidden_size']}, {c['num_attention_heads']} heads "
            f"({c['num_key_value_heads']} kv), vocab {c['vocab_size']}; tensors: {kinds}")
