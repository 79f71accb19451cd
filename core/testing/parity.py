"""The converter kit: the checks every Hugging Face family passes against ``transformers`` itself.

A converter (kind ``converter``) is right when a random ``transformers`` model of its family, saved
with ``save_pretrained`` and read with ``seqzoo.from_hf``, gives the same outputs, decodes the same
tokens, and exports to a folder that ``transformers`` loads with the same outputs again. The checks
here do exactly that on whatever model the caller builds — a config chosen to exercise the family's
peculiarities (odd head counts, GQA, a window shorter than the sequence, more layers than one
pattern period, RoPE scaling) — so seqzoo's own tests and a third-party converter's tests hold every
family to the same bar::

    pair = import_reference(transformers.Gemma2ForCausalLM(config), tmp_path)
    check_logits(pair, length=20)
    check_padded_logits(pair, length=20)
    check_greedy(pair)                      # 32 tokens, with and without the KV cache
    check_export(pair, tmp_path / "out", length=20)
    # or all four: check_causal_lm(pair, tmp_path / "out", length=20)

``transformers`` is needed only by the caller (it builds the reference); nothing here imports it.
"""
from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from ..errors import CheckpointError
from ..io.checkpoint import unwrap
from ..io.hf import from_hf, to_hf
from ..nn.generation import generate

#: The bar for float32 logits, seqzoo against transformers.
TOL = 1e-4


class Imported(NamedTuple):
    """A transformers reference model, the seqzoo model imported from its saved folder, the folder."""

    hf: nn.Module
    model: nn.Module
    folder: Path

    @property
    def vocab_size(self) -> int:
        return self.hf.config.get_text_config().vocab_size


def import_reference(hf: nn.Module, folder: str | Path) -> Imported:
    """Save ``hf`` (put in eval mode) under ``folder`` and import it with ``seqzoo.from_hf``."""
    hf = hf.eval()
    folder = Path(folder)
    hf.save_pretrained(folder)
    return Imported(hf, from_hf(folder, device="cpu"), folder)


def randomised(model: nn.Module, *, norms: tuple[float, float] = (0.5, 1.5), bias_std: float | None = 0.1) -> nn.Module:
    """transformers starts norm weights at ones (Gemma's at zeros) and biases at zeros, where a
    norm or bias in the wrong place goes unseen: draw norm weights uniformly from ``norms`` and
    biases from N(0, ``bias_std``) (None leaves them). Returns the model."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name.lower() and name.endswith("weight"):
                parameter.uniform_(*norms)
            elif bias_std is not None and name.endswith("bias"):
                parameter.normal_(0.0, bias_std)
    return model


def cached_imports(build: Callable[[str], nn.Module], tmp_path_factory) -> Callable[[str], Imported]:
    """name -> ``import_reference(build(name), ...)``, each built from seed 0 and imported once
    (pytest's ``tmp_path_factory`` gives the folders): a module-scoped fixture returns this."""
    cache: dict[str, Imported] = {}

    def get(name: str) -> Imported:
        if name not in cache:
            torch.manual_seed(0)
            cache[name] = import_reference(build(name), tmp_path_factory.mktemp(name) / "hf")
        return cache[name]

    return get


def left_padded(vocab_size: int, length: int, pad: int = 3, batch: int = 2,
                generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """ids (B, length) of tokens ≥ 3 and their mask, the last row left-padded by ``pad`` zeros."""
    ids = torch.randint(3, vocab_size, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, :pad] = 0
    ids[-1, :pad] = 0
    return ids, mask


def max_difference(ours: Tensor, theirs: Tensor, where: Tensor | None = None) -> float:
    """max |ours − theirs| (over the positions ``where`` is true, if given)."""
    if where is not None:
        ours, theirs = ours[where], theirs[where]
    return (ours.float() - theirs.float()).abs().max().item()


def check_logits(pair: Imported, length: int, *, batch: int = 2, tol: float = TOL) -> float:
    """seqzoo's logits equal the reference's on an unpadded batch; returns max |Δ|."""
    ids = torch.randint(pair.vocab_size, (batch, length))
    with torch.no_grad():
        diff = max_difference(pair.model(ids), pair.hf(ids).logits)
    assert diff < tol, f"logits: max |Δ| = {diff:.2e} ≥ {tol:.0e}"
    return diff


def check_padded_logits(pair: Imported, length: int, *, position_ids: bool = True,
                        tol: float = TOL) -> float:
    """The same on a left-padded batch, at the real tokens. transformers numbers positions from
    the first real token only when given ``position_ids``, as its ``generate`` does (families
    with no positions to number, like BLOOM, pass ``position_ids=False``)."""
    ids, mask = left_padded(pair.vocab_size, length)
    kwargs = {"position_ids": (mask.cumsum(-1) - 1).clamp(min=0)} if position_ids else {}
    with torch.no_grad():
        ours = pair.model(ids, attention_mask=mask)
        theirs = pair.hf(ids, attention_mask=mask, **kwargs).logits
    diff = max_difference(ours, theirs, mask.bool())
    assert diff < tol, f"left-padded logits: max |Δ| = {diff:.2e} ≥ {tol:.0e}"
    return diff


def hf_greedy(hf: nn.Module, ids: Tensor, mask: Tensor, new: int, **kwargs) -> Tensor:
    """transformers' greedy ``generate`` for exactly ``new`` tokens (no end token can stop it)."""
    config = copy.deepcopy(hf.generation_config)
    # An end id outside the vocabulary is never produced, so generation runs the full length
    # (None would fall back to the config's eos in transformers 5).
    config.update(do_sample=False, max_new_tokens=new, min_new_tokens=None,
                  eos_token_id=hf.config.get_text_config().vocab_size + 1, pad_token_id=0, num_beams=1)
    with torch.no_grad():
        return hf.generate(ids, attention_mask=mask, generation_config=config, **kwargs)


def check_greedy(pair: Imported, *, prompt: int = 8, steps: int = 32, pad: int = 2) -> Tensor:
    """Greedy decoding of a left-padded batch gives transformers' tokens for ``steps`` steps, with
    seqzoo's KV cache and without it (the whole prefix recomputed each step). Returns the tokens."""
    ids, mask = left_padded(pair.vocab_size, prompt, pad=pad)
    theirs = hf_greedy(pair.hf, ids, mask, steps).tolist()
    for use_cache in (True, False):
        ours = generate(pair.model, ids, steps, attention_mask=mask, eos_id=None, use_cache=use_cache)
        assert ours.tolist() == theirs, f"greedy tokens differ from transformers' (use_cache={use_cache})"
    return torch.tensor(theirs)


def check_export(pair: Imported, out_dir: str | Path, length: int, *, tol: float = 1e-5,
                 run: Callable[[nn.Module, Tensor], Tensor] | None = None, model_type: str | None = None,
                 hf_class: type | None = None) -> Path:
    """``seqzoo.to_hf`` writes a folder of the same ``model_type`` that the reference's class loads,
    with the reference's outputs (``run(model, ids)``: the logits by default). Returns the folder.
    ``model_type``: name the family to export as (one that is only exported when named);
    ``hf_class``: the class that loads the folder (default: the reference's)."""
    out = to_hf(unwrap(pair.model), out_dir, model_type=model_type)
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert config["model_type"] == pair.hf.config.model_type, config["model_type"]
    again = (hf_class or type(pair.hf)).from_pretrained(out, dtype=torch.float32).eval()
    run = run or (lambda model, ids: model(ids).logits)
    ids = torch.randint(3, pair.vocab_size, (2, length))
    with torch.no_grad():
        diff = max_difference(run(again, ids), run(pair.hf, ids))
    assert diff < tol, f"exported folder: max |Δ| = {diff:.2e} ≥ {tol:.0e}"
    return out


def check_causal_lm(pair: Imported, out_dir: str | Path, length: int, *, position_ids: bool = True,
                    model_type: str | None = None) -> Path:
    """Every check of a causal LM family: logits plain and left-padded, greedy decoding with and
    without the cache, and the folder exported (as ``model_type`` if given). Returns the folder."""
    check_logits(pair, length)
    check_padded_logits(pair, length, position_ids=position_ids)
    # Export before decoding: transformers' dynamic RoPE keeps the longest length it has seen.
    out = check_export(pair, out_dir, length, model_type=model_type)
    check_greedy(pair)
    return out


def check_masked_lm_logits(pair: Imported, batch: dict[str, Tensor], *, tol: float = TOL) -> float:
    """An encoder's masked-LM logits equal the reference's (``BertForMaskedLM``,
    ``RobertaForMaskedLM``, ...; ``prediction_logits`` of ``BertForPreTraining``) on ``batch``
    ({input_ids, attention_mask, token_type_ids}, padded as the family pads), at its real tokens;
    returns max |Δ|."""
    with torch.no_grad():
        ours = pair.model(**batch, head=True)
        theirs = pair.hf(**batch)[0]  # logits / prediction_logits: the first output without labels
    mask = batch.get("attention_mask")
    diff = max_difference(ours, theirs, None if mask is None else mask.bool())
    assert diff < tol, f"masked-LM logits: max |Δ| = {diff:.2e} ≥ {tol:.0e}"
    return diff


def edited_copy(folder: str | Path, target: str | Path, config: dict, *,
                rename: Callable[[str], str] = lambda name: name, extra: dict[str, Tensor] | None = None) -> Path:
    """A copy of the Hugging Face folder ``folder`` at ``target`` (made here) with ``config`` as its
    config.json, its tensors renamed by ``rename`` and joined by ``extra``: an older checkpoint's
    names, a hand-edited config. Returns ``target``."""
    folder, target = Path(folder), Path(target)
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps(config), encoding="utf-8")
    tensors = {rename(name): t for name, t in load_file(folder / "model.safetensors").items()}
    save_file({**tensors, **(extra or {})}, target / "model.safetensors")
    return target


def check_refused(folder: str | Path, target: str | Path, change: dict, match: str) -> str:
    """``from_hf`` of ``folder`` with ``change`` written into its config.json fails with one
    CheckpointError line that ``match`` (a regex) finds. Returns the message."""
    config = {**json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")), **change}
    try:
        from_hf(edited_copy(folder, target, config))
    except CheckpointError as error:
        message = str(error)
    else:
        raise AssertionError(f"config change {change} imported; it should be refused")
    assert re.search(match, message), f"refusal {message!r} does not match {match!r}"
    assert "\n" not in message, f"refusal is more than one line: {message!r}"
    return message
