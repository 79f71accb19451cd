"""Checkpoints: safetensors only (never pickle), with the resolved recipe in the metadata.

Metadata keys: ``seqzoo.format``, ``seqzoo.recipe`` (JSON of the resolved recipe),
``seqzoo.components`` (which plugin/version provided each component), ``seqzoo.tied`` (names of
tensors stored once under another name) and, when the tokenizer has one, ``seqzoo.tokenizer`` (its
serialised form, e.g. an hf tokenizer's tokenizer.json; ``load`` keeps it as
``model.tokenizer_state``). Writes are atomic: a temp file in the same folder,
fsync, rename, fsync of the folder.
"""
from __future__ import annotations

import copy
import json
import os
import re
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from ..errors import CheckpointError, RecipeError, RegistryError, SeqzooError, few, first_line
from ..files import FolderNotWritable, atomic_write, check_output_file
from ..interfaces import Model
from ..recipe import parse_requirement, resolve
from ..registry import canonical_name, installed_version, registry, tokenizer
from . import tensorfile
from .build import instantiate, pick_device

FORMAT = "1"


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside the wrappers training may put around it: ``torch.compile`` (which keeps it
    as ``_orig_mod``) and ``DistributedDataParallel`` (``.module``), in either order or alone."""
    model = getattr(model, "_orig_mod", model)
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        model = model.module
    return getattr(model, "_orig_mod", model)


def tied_names(model: nn.Module) -> dict[str, str]:
    """Parameters reachable under more than one name (tied weights): each later name -> the first."""
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in first:
            tied[name] = first[id(parameter)]
        else:
            first[id(parameter)] = name
    return tied


EXTRA_PREFIX = "extra/"  # tensors that are not weights (training state); load() skips them


def save(model: nn.Module, path: str | os.PathLike, *, extra_metadata: dict[str, str] | None = None,
         state: dict[str, Tensor] | None = None, extra_tensors: dict[str, Tensor] | None = None) -> Path:
    """Write ``model``'s weights and resolved recipe to ``path`` atomically; returns the path.

    ``state`` replaces ``model.state_dict()`` (the gathered weights of a sharded model);
    ``extra_tensors`` (optimizer state, RNG state) are stored under ``extra/`` and read back with
    ``read_extras``.
    """
    model = unwrap(model)
    if not isinstance(model, Model) or model.recipe is None:
        raise SeqzooError("model has no .recipe; build it with seqzoo.build so it can be rebuilt on load")
    recipe = model.recipe
    recipe = _with_actual_dtype(recipe, model)
    tied = tied_names(model)  # stored once, under the first name
    state = model.state_dict() if state is None else state  # a sharded model's gathered weights
    tensors = {name: t.detach().contiguous() for name, t in state.items() if name not in tied}
    tensors.update({EXTRA_PREFIX + name: t.detach().contiguous() for name, t in (extra_tensors or {}).items()})
    if any(t.device.type == "meta" for t in tensors.values()):
        raise SeqzooError("cannot save a model built on device='meta': it has no weights")
    metadata = {
        "seqzoo.format": FORMAT,
        "seqzoo.recipe": json.dumps(recipe, sort_keys=True),
        "seqzoo.components": json.dumps(model.components or {}, sort_keys=True),
        "seqzoo.tied": json.dumps(tied, sort_keys=True),
        **(extra_metadata or {}),
    }
    tokenizer_state = _tokenizer_state(model)
    if tokenizer_state is not None:
        metadata["seqzoo.tokenizer"] = tokenizer_state
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    _check_output(path)
    # atomic_write: a crash at any moment leaves either the old file or the complete new one, and
    # the file gets the umask's mode (0644), as open() would give it.
    try:
        atomic_write(path, lambda tmp: tensorfile.write(tmp, tensors, metadata))
    except FolderNotWritable as error:
        raise CheckpointError(f"{path}: cannot write in {folder} ({error.strerror or error})") from None
    except OSError as error:
        kept = "the previous file is intact" if path.exists() else "nothing was written"
        raise CheckpointError(f"{path}: could not save ({error.strerror or error}); {kept}") from None
    return path


def _tokenizer_state(model: nn.Module) -> str | None:
    """The tokenizer's own serialised form (an hf tokenizer's tokenizer.json text), so the checkpoint
    rebuilds it without the file it came from; None for tokenizers that need nothing (bytes)."""
    state = model.tokenizer_state
    if state is None:
        try:
            state = tokenizer(model).to_str()
        except SeqzooError as error:  # the weights are still worth saving
            warnings.warn(f"the tokenizer is not stored in the checkpoint: {error}", stacklevel=3)
    return state


def _with_actual_dtype(recipe: dict, model: nn.Module) -> dict:
    """The recipe with ``runtime.dtype`` set to the dtype the weights are in now (after .half()...)."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    name = str(dtype).removeprefix("torch.") if dtype is not None else None
    if name is None or recipe.get("runtime", {}).get("dtype") == name:
        return recipe
    return {**recipe, "runtime": {**recipe.get("runtime", {}), "dtype": name}}


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The metadata of a seqzoo checkpoint, or a CheckpointError saying what is wrong with it."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not a readable safetensors file ({first_line(error)})") from None
    if "seqzoo.recipe" not in metadata:
        raise CheckpointError(f"{path}: safetensors file without a seqzoo recipe (not saved by seqzoo.save?)")
    # A newer seqzoo's layout would be misread, not refused, further on. Every seqzoo writes the key;
    # a file without it is let through as the one format there has been.
    if "seqzoo.format" in metadata and metadata["seqzoo.format"] != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {metadata['seqzoo.format']!r}, but this seqzoo reads "
                              f"format {FORMAT!r}; upgrade seqzoo to load it")
    return metadata


def read_recipe(path: str | os.PathLike, metadata: dict[str, str] | None = None) -> dict:
    """The resolved recipe a seqzoo checkpoint carries (``metadata``: its metadata, if read)."""
    metadata = read_metadata(path) if metadata is None else metadata
    try:
        recipe = json.loads(metadata["seqzoo.recipe"])
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path}: corrupt seqzoo metadata ({error})") from None
    if not isinstance(recipe, dict):
        raise CheckpointError(f"{path}: corrupt seqzoo metadata (the recipe is not a mapping)")
    return upgrade_recipe(recipe)


# -- checkpoints written before the mixer slot was renamed (seqzoo 0.1.0 up to commit 64f90cd) ----
#: Old block module names and what they are called now: the token mixer was ``attn`` whatever its
#: kind, and the norms around it ``attn_norm`` / ``attn_out_norm``.
RENAMED_MODULES = {"attn": "mixer", "attn_norm": "mixer_norm", "attn_out_norm": "mixer_out_norm"}
_OLD_BLOCK_NAME = re.compile(r"(^|\.)(blocks\.\d+\.)(" + "|".join(RENAMED_MODULES) + r")(?=\.|$)")


def upgrade_name(name: str) -> str:
    """A parameter name of an old checkpoint as today's model calls it
    (``decoder.blocks.0.attn.A_log`` -> ``decoder.blocks.0.mixer.A_log``); today's names pass."""
    return _OLD_BLOCK_NAME.sub(lambda m: m[1] + m[2] + RENAMED_MODULES[m[3]], name)


def upgrade_recipe(recipe: dict) -> dict:
    """A stored recipe in today's keys: the per-layer ``attn_norm`` is ``mixer_norm`` now."""
    model = recipe.get("model")
    if not isinstance(model, dict):
        return recipe
    parts = [*(model.get("layer_types") or {}).values(), *(model.get("layer_overrides") or {}).values()]
    if not any(isinstance(part, dict) and "attn_norm" in part for part in parts):
        return recipe
    recipe = copy.deepcopy(recipe)
    model = recipe["model"]
    for section in ("layer_types", "layer_overrides"):
        for part in (model.get(section) or {}).values():
            if isinstance(part, dict) and "attn_norm" in part:
                part["mixer_norm"] = part.pop("attn_norm")
    return recipe


def load(path: str | os.PathLike, device: str | torch.device | None = None) -> nn.Module:
    """Rebuild the model stored at ``path`` from the file alone and load its weights."""
    metadata = read_metadata(path)
    recipe = read_recipe(path, metadata)
    if isinstance(device, str):  # a device that is not there is the caller's problem, not the file's
        device = pick_device(device)
    _check_provenance(path, metadata, recipe)
    try:
        # No random initialisation: every parameter is read from the file next.
        model = instantiate(resolve(recipe, label=str(path)), device=device, initialise=False)
    except RecipeError as error:  # already names the checkpoint and the recipe key
        raise CheckpointError(str(error)) from None
    except SeqzooError as error:
        raise CheckpointError(f"{path}: its recipe no longer builds: {error}") from None
    load_weights(model, path, metadata)
    if "seqzoo.tokenizer" in metadata:
        model.tokenizer_state = metadata["seqzoo.tokenizer"]
    model.eval()
    return model


def load_weights(model: nn.Module, path: str | os.PathLike, metadata: dict[str, str] | None = None,
                 *, same_dtype: bool = True) -> None:
    """Read the weights stored at ``path`` into ``model``'s own tensors, one at a time (no second
    copy of the model in memory), checking each against its checksum when the file has them; a
    CheckpointError names every missing, unexpected or mis-shaped tensor first, or the damaged
    one. ``same_dtype``: a stored dtype other than the model's is an error (``load``: the file
    was altered), else a cast (``--init`` of a float32 run from bfloat16 weights)."""
    metadata = read_metadata(path) if metadata is None else metadata
    try:
        tied = json.loads(metadata.get("seqzoo.tied", "{}"))
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path}: corrupt seqzoo metadata ({error})") from None
    reader = _reader(path)
    names = {upgrade_name(name): name for name in reader.names() if not name.startswith(EXTRA_PREFIX)}
    stored = {new: torch.empty(reader.shape(old), dtype=reader.dtype(old), device="meta") for new, old in names.items()}
    tied = {upgrade_name(name): upgrade_name(source) for name, source in tied.items()}
    stored.update({name: stored[source] for name, source in tied.items() if source in stored})
    state = model.state_dict()
    _check_tensors(path, state, stored, same_dtype=same_dtype)
    with torch.no_grad():
        _read(reader, path, ((names[name], state[name]) for name in names))
        for name, source in tied.items():  # a tie the model does not share (to_empty unties)
            if state[name].data_ptr() != state[source].data_ptr():
                state[name].copy_(state[source])


def _reader(path: str | os.PathLike) -> tensorfile.Reader:
    try:
        return tensorfile.Reader(path)
    except tensorfile.DamagedFile as error:
        raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from None


def _read(reader: tensorfile.Reader, path, targets) -> None:
    try:
        reader.read_into(targets)
    except tensorfile.DamagedFile as error:
        raise CheckpointError(f"{path}: {error}; restore it from a copy, or save it again") from None


class ProvenanceWarning(UserWarning):
    """A checkpoint's component comes from a plugin that is missing here, or from another
    distribution or major version than the one it was saved with."""


def _major(version: str) -> str:
    match = re.match(r"\s*v?(\d+)", version or "")
    return match[1] if match else (version or "").strip()


def _install_hint(dist: str, version: str, requires: object) -> str:
    """One way to say what to install for ``dist``: the recipe's own ``requires:`` entry for it
    when there is one (its author's range), else the exact version the checkpoint was saved with."""
    for text in requires if isinstance(requires, list) else []:
        try:
            if canonical_name(parse_requirement(str(text)).name) == canonical_name(dist):
                return f"pip install '{text}'"
        except ValueError:
            continue
    return f"pip install '{dist}=={version}'" if version else f"pip install '{dist}'"


def _check_provenance(path, metadata: dict[str, str], recipe: dict) -> None:
    """Compare ``seqzoo.components`` (what provided each component at save time) with this
    process's registry: a component that is not registered here is a CheckpointError naming the
    distribution to install (before any did-you-mean the recipe check would give); another
    distribution or major version is a warning, once per component."""
    try:
        saved = json.loads(metadata.get("seqzoo.components", "{}"))
    except json.JSONDecodeError:
        return  # the recipe check that follows reports corrupt metadata
    if not isinstance(saved, dict):
        return
    reg = registry()
    seen = set()
    for key, record in saved.items():
        if not isinstance(record, dict) or "kind" not in record or "name" not in record:
            continue
        kind, name = str(record["kind"]), str(record["name"])
        if (kind, name) in seen:
            continue
        seen.add((kind, name))
        dist, version = record.get("distribution") or "", record.get("version") or ""
        plugin = record.get("plugin") or ""
        was = f"{dist} {version}".strip() if dist else f"local plugin {plugin}"
        if dist:
            fix = _install_hint(dist, version, recipe.get("requires"))
        else:
            fix = f"load it with seqzoo --plugin {plugin} or SEQZOO_PLUGINS"
        try:
            now = reg.get(kind, name)
        except RegistryError:
            disabled = next((p for p in reg.plugins.values() if p.status == "disabled" and dist
                             and canonical_name(p.distribution) == canonical_name(dist)), None)
            if disabled is not None:  # installed: what is missing is the permission to load it
                raise CheckpointError(
                    f"{path}: recipe key {key}: {kind} {name!r} comes from {was}, which is installed here but "
                    f"turned off by SEQZOO_DISABLE_PLUGINS; unset it (or take {disabled.name} out of it) to load "
                    f"this checkpoint") from None
            if not dist:
                state = "not loaded here"
            elif installed_version(dist) is not None:
                state = "installed here but does not register it (see `seqzoo plugins`)"
            else:
                state = "not installed here"
            raise CheckpointError(f"{path}: recipe key {key}: {kind} {name!r} comes from {was}, which is "
                                  f"{state}; {fix}") from None
        if dist and now.distribution.lower() != dist.lower():
            message = (f"{path}: {kind} {name!r} was saved from {was} but is now provided by "
                       f"{now.origin}; outputs may differ ({fix} to match)")
        elif dist and _major(now.version) != _major(version):
            message = (f"{path}: {kind} {name!r} was saved with {was} but {now.version} is loaded, "
                       f"a different major version; outputs may differ ({fix} to match)")
        else:
            continue
        warnings.warn(message, ProvenanceWarning, stacklevel=3)


def read_extras(path: str | os.PathLike) -> tuple[dict[str, str], dict[str, Tensor]]:
    """The metadata and the ``extra_tensors`` (prefix removed) that ``save`` stored at ``path``."""
    metadata = read_metadata(path)
    reader = _reader(path)
    extras = {name: torch.empty(reader.shape(name), dtype=reader.dtype(name))
              for name in reader.names() if name.startswith(EXTRA_PREFIX)}
    _read(reader, path, extras.items())
    return metadata, {name[len(EXTRA_PREFIX):]: tensor for name, tensor in extras.items()}


def _check_tensors(path, expected: dict[str, Tensor], stored: dict[str, Tensor], *,
                   same_dtype: bool = True) -> None:
    missing = sorted(set(expected) - set(stored))
    unexpected = sorted(set(stored) - set(expected))
    shapes = sorted(f"{n} {tuple(stored[n].shape)} != {tuple(t.shape)}"
                    for n, t in expected.items() if n in stored and stored[n].shape != t.shape)
    # save() records the weights' dtype in the recipe, so a different stored dtype means the file
    # was altered after saving.
    dtypes = sorted(f"{n} {str(stored[n].dtype)[6:]} != {str(t.dtype)[6:]}"
                    for n, t in expected.items() if same_dtype and n in stored and stored[n].dtype != t.dtype)
    problems = mismatches(missing, unexpected, shapes, dtypes, against="recipe")
    if problems:
        raise CheckpointError(f"{path}: weights do not match the recipe: " + "; ".join(problems))


def mismatches(missing: list[str], unexpected: list[str], shapes: list[str], dtypes: list[str] = (),
               *, against: str) -> list[str]:
    """Tensor mismatches by name, a few of each kind, as phrases for one error message."""
    kinds = [("missing tensors", missing), ("unexpected tensors", unexpected),
             (f"wrong shapes (stored != {against})", shapes), (f"wrong dtypes (stored != {against})", dtypes)]
    return [f"{what}: {few(list(names))}" for what, names in kinds if names]


def _check_output(path: Path) -> None:
    """``files.check_output_file`` (not a folder, in a folder that exists), in every command's words,
    as the CheckpointError that the callers of ``save`` catch."""
    try:
        check_output_file(path, "model.safetensors")
    except SeqzooError as error:
        raise CheckpointError(str(error)) from None


def check_can_save(path: str | os.PathLike) -> None:
    """Refuse, before any work, an output ``path`` that ``save`` could not write: its folder must
    exist and be writable, it must not be a folder, and the serializer must work in this
    environment (safetensors needs numpy to save torch tensors). A long run checks this first, so
    it never ends with nowhere to put its result."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    _check_output(path)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CheckpointError(f"{path}: cannot write in {folder} (permission denied); pick a writable "
                              f"folder for the output")
    try:
        tensorfile.digest(torch.zeros(1))  # the writer hands tensors' bytes over through numpy
    except (ImportError, RuntimeError):
        raise CheckpointError("cannot save checkpoints here: safetensors needs numpy to save torch tensors and "
                              "it is not installed (pip install 'safetensors[torch]')") from None
