"""Import and export: ``from_hf(folder) -> model`` and ``to_hf(model, folder)``, with the registered
converter of the family, every weight checked before one is copied."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from ...errors import CheckpointError, SeqzooError, few, first_line
from ...files import atomic_write, write_text_atomic
from ...interfaces import LanguageModel, Model
from ...recipe import resolve
from ...registry import registry, tokenizer
from ..build import check_fits, instantiate, pick_device
from ..checkpoint import mismatches, unwrap
from .checks import kind_of
from .converter import HFConverter, _check_coverage, full_recipe
from .folder import CONFIG, INDEX, TOKENIZER, WEIGHTS, HFWeights, read_config
from .rules import Rule

# Tokenizer files copied along when an exported model's tokenizer still sits next to them.
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model", "spiece.model")


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
        return load_converted(converter, config, weights, folder, device=device, dtype=dtype or weights.dtype(),
                              tokenizer_text=_tokenizer_text(folder / TOKENIZER))


def _tokenizer_text(file: Path) -> str | None:
    """The text of a folder's tokenizer.json (None: there is none), parsed once here: the file is
    stored as it is and built only at the first encode, where a broken one would name no file."""
    if not file.is_file():
        return None
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{file}: not a valid tokenizer.json (not UTF-8: {error})") from None
    try:
        from tokenizers import Tokenizer
    except ImportError:  # the hf tokenizer says what to install when it is used
        return text
    try:
        Tokenizer.from_str(text)
    except Exception as error:  # the Rust side raises plain Exceptions
        raise CheckpointError(f"{file}: not a valid tokenizer.json ({first_line(error)})") from None
    return text


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
    cut: dict[str, tuple[str, ...]] = {}  # a source of an any_cut rule -> all of that rule's
    for rule in rules:
        # Shapes only: saving a meta copy costs nothing (a fused qkv reorder would copy real data).
        meta = [torch.empty_like(state[t], device="meta") for t in rule.targets]
        for name, tensor in zip(rule.sources, rule.save(*meta), strict=True):
            expected[name] = tuple(tensor.shape)
            if rule.any_cut:
                cut[name] = rule.sources
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
                    if n in names and n not in cut and weights.shape(names[n]) != shape)
    for parts in sorted(set(cut.values())):  # cut anywhere: only the parts stacked must agree
        if all(n in names for n in parts):
            ours, theirs = _stacked(parts, expected.get), _stacked(parts, lambda n: weights.shape(names[n]))
            if theirs != ours:
                shapes.append(f"{' + '.join(parts)} {theirs} != {ours}")
    problems += mismatches(missing, unexpected, shapes, against="config")
    if problems:
        raise CheckpointError(f"{folder}: weights do not match its {converter.model_type} config: "
                              + "; ".join(problems))
    if dropped:
        what = "; ".join(f"{what} ({few(found)})" for what, found in dropped.items())
        warnings.warn(f"{folder}: dropped {what}: seqzoo's {model.recipe['model']['kind']} has no place "
                      f"for it", stacklevel=3)
    return names


def _stacked(parts: tuple[str, ...], shape) -> tuple[int, ...]:
    """The shape of the tensors ``parts`` (each's shape ``shape(name)``) stacked along dim 0."""
    return (sum(shape(n)[0] for n in parts), *shape(parts[0])[1:])


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
