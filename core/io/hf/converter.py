"""The converter interface: one Hugging Face family (``model_type``) as a recipe from its config,
tensor rules, an export check and a config from a model; and the recipe a converter's yields."""
from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, ClassVar

from torch import Tensor, nn

from ...errors import CheckpointError, few
from ...recipe import resolve
from ...registry import tokenizer
from .folder import TOKENIZER
from .rules import Rule, copy, norm


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
    #: The family's llama.cpp form (``seqzoo.io.gguf.GGUFArch``): its architecture name, metadata
    #: keys and the tensors whose values differ; None where llama.cpp has no such architecture.
    gguf: ClassVar[Any] = None

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
