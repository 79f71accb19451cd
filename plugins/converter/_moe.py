"""What the mixture-of-experts families share: their experts' tensors, which layers are sparse,
and a mixin that turns a dense LLaMA-layout converter into its MoE sibling.

Checkpoints store a layer's experts one by one — ``experts.e.gate_proj`` / ``up_proj`` /
``down_proj`` (Qwen-MoE, OLMoE, DeepSeek, Jamba), Mixtral's ``experts.e.w1`` / ``w3`` / ``w2`` —
which is also what transformers 5 writes back from its fused 3-D parameters; gpt-oss stores them
stacked, transposed for ``x @ W``, with gate and up *interleaved* along 2F and biases beside
them. seqzoo stacks gated experts (``ffn.experts.gate_up`` (E, 2F, C) / ``down`` (E, C, F), see
``plugins/ffn/_experts.py``); other kinds, gpt-oss's clamped SwiGLU among them, are a list of
dense FFNs (``ffn.experts.e.gate`` / ``up`` / ``down``).
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

import torch
from torch import Tensor, nn

from seqzoo.builder import layer_plan
from seqzoo.io.hf import Rule, first_problem, kind_of, layer_pattern

#: HF names of an expert's (gate, up, down) projections.
PROJ = ("gate_proj", "up_proj", "down_proj")


def expert_rules(ours: str, theirs: str, experts: int, names: tuple[str, str, str] = PROJ, *,
                 bias: bool = False) -> list[Rule]:
    """Rules for E gated experts stacked under seqzoo's ``ours`` (``decoder.blocks.3.ffn.``:
    ``experts.gate_up`` (E, 2F, C), ``experts.down`` (E, C, F)) from the checkpoint's per-expert
    projections under ``theirs`` (``model.layers.3.mlp.``) named ``names`` (gate, up, down):
    stacked on import, split again on export."""
    gate, up, down = names
    rules = []
    for part in ("weight", "bias") if bias else ("weight",):
        suffix = "" if part == "weight" else "_bias"
        pairs = tuple(f"{theirs}experts.{e}.{n}.{part}" for e in range(experts) for n in (gate, up))
        downs = tuple(f"{theirs}experts.{e}.{down}.{part}" for e in range(experts))
        rules += [
            Rule(f"{ours}experts.gate_up{suffix}", pairs,
                 lambda *t: torch.stack([torch.cat(t[i:i + 2]) for i in range(0, len(t), 2)]),
                 lambda t: tuple(w for e in t for w in e.chunk(2, dim=0))),
            Rule(f"{ours}experts.down{suffix}", downs, lambda *t: torch.stack(t), lambda t: tuple(t.unbind(0))),
        ]
    return rules


def stacked_expert_rules(ours: str, theirs: str, experts: int) -> list[Rule]:
    """gpt-oss's stacked experts: ``experts.gate_up_proj`` (E, C, 2F) with gate at even and up at
    odd columns and ``gate_up_proj_bias`` (E, 2F) likewise; ``down_proj`` (E, F, C) and
    ``down_proj_bias`` (E, C). Split into every expert's projections, and stacked again."""
    names = [f"{ours}experts.{e}." for e in range(experts)]
    both = lambda part: tuple(n + p for n in names for p in (f"gate.{part}", f"up.{part}"))  # noqa: E731
    return [
        Rule(both("weight"), (theirs + "experts.gate_up_proj",),
             lambda t: tuple(w for e in t for w in (e[:, 0::2].t(), e[:, 1::2].t())),
             lambda *w: (torch.stack([_interleave(w[i].t(), w[i + 1].t()) for i in range(0, len(w), 2)]),)),
        Rule(both("bias"), (theirs + "experts.gate_up_proj_bias",),
             lambda t: tuple(b for e in t for b in (e[0::2], e[1::2])),
             lambda *b: (torch.stack([_interleave(b[i], b[i + 1]) for i in range(0, len(b), 2)]),)),
        Rule(tuple(n + "down.weight" for n in names), (theirs + "experts.down_proj",),
             lambda t: tuple(e.t() for e in t), lambda *w: (torch.stack([x.t() for x in w]),)),
        Rule(tuple(n + "down.bias" for n in names), (theirs + "experts.down_proj_bias",),
             lambda t: tuple(t.unbind(0)), lambda *b: (torch.stack(b),)),
    ]


def _interleave(a: Tensor, b: Tensor) -> Tensor:
    """[a₀, b₀, a₁, b₁, ...] along the last dim."""
    return torch.stack([a, b], dim=-1).flatten(-2)


def sparse_layout(sparse: list[bool], dense_ffn: dict) -> dict:
    """The per-layer keys for a stack whose layer i is a mixture of experts iff ``sparse[i]`` (the
    model's ``ffn`` is the MoE; dense layers are the type ``dense``): {} when every layer is
    sparse, a ``pattern`` when a period repeats whole, else ``layer_overrides`` for the dense
    layers (DeepSeek's first k, Qwen's ``mlp_only_layers``)."""
    if all(sparse):
        return {}
    kinds = ["moe" if s else "dense" for s in sparse]
    types = {"moe": {}, "dense": {"ffn": dense_ffn}}
    pattern = layer_pattern(kinds)
    if len(sparse) >= 2 * len(pattern) and len(sparse) % len(pattern) == 0:  # a period that repeats
        return {"layer_types": {k: types[k] for k in dict.fromkeys(pattern)}, "pattern": pattern}
    return {"layer_types": types, "pattern": ["moe"], "layer_overrides": {i: "dense" for i, s in enumerate(sparse)
                                                                           if not s}}


def without_layout(model: dict) -> dict:
    """A model section without its per-layer layout (layer types, pattern, overrides): the uniform
    copy a dense family's checks run on."""
    return {k: v for k, v in model.items() if k not in ("layer_types", "pattern", "layer_overrides")}


class MixtureOfExpertsFamily:
    """Mixed in before a dense LLaMA-layout converter (``class MixtralConverter(
    MixtureOfExpertsFamily, MistralConverter)``): the attention, norms and RoPE are the dense
    family's; the FFN of the sparse layers is a ``moe`` whose experts are the family's dense FFN.
    A family writes ``moe_spec`` (config -> the moe ffn spec), ``moe_config`` (the spec -> its
    config keys), ``sparse_layers`` (which layers are sparse) and ``moe_problem``."""

    #: Where the router and experts sit under ``model.layers.i.``, and an expert's projections.
    mlp: str = "mlp."
    expert_names: tuple[str, str, str] = PROJ

    def moe_spec(self, c: dict) -> dict:
        raise NotImplementedError(f"{type(self).__name__} must write moe_spec(config): the family's moe ffn spec")

    def moe_config(self, spec: dict, sparse: list[bool]) -> dict:
        raise NotImplementedError(f"{type(self).__name__} must write moe_config(spec, sparse): the spec's HF "
                                  f"config keys")

    def moe_problem(self, spec: dict) -> str | None:
        return None

    def sparse_layers(self, c: dict) -> list[bool]:
        return [True] * c["num_hidden_layers"]

    def sparse_problem(self, sparse: list[bool]) -> str | None:
        """Why this set of sparse layers has no config form, or None."""
        return None if all(sparse) else f"model.layer_types: every {self.model_type} layer is a mixture of experts"

    # -- the converter interface over the dense family's -------------------------------------------
    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        recipe = super().recipe(config, names)
        c = self.config(config)
        m = recipe["model"]
        dense = m["ffn"]
        m["ffn"] = self.moe_spec(c)
        m.update(sparse_layout(self.sparse_layers(c), dense))
        return recipe

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        plans = layer_plan(recipe["model"])
        sparse = {f"decoder.blocks.{i}.ffn." for i, p in enumerate(plans) if p.ffn["kind"] == "moe"}
        rules = [r for r in super().rules(config, recipe) if not any(t.startswith(tuple(sparse)) for t in r.targets)]
        for i, plan in enumerate(plans):
            if plan.ffn["kind"] == "moe":
                rules += self.layer_moe_rules(f"decoder.blocks.{i}.ffn.", f"model.layers.{i}.{self.mlp}", plan.ffn)
        return rules

    def layer_moe_rules(self, ours: str, theirs: str, spec: dict) -> list[Rule]:
        """The router and the experts of one sparse layer (families add their shared experts)."""
        return [Rule(ours + "router.weight", (theirs + "gate.weight",))] + expert_rules(
            ours, theirs, spec["experts"], self.expert_names)

    def export_view(self, recipe: dict) -> dict:
        m = recipe["model"]
        plans = layer_plan(m)
        moe = next((p.ffn for p in plans if p.ffn is not None and p.ffn["kind"] == "moe"), None)
        dense = next((p.ffn for p in plans if p.ffn is not None and p.ffn["kind"] != "moe"), None)
        view = without_layout(m)
        view["ffn"] = dense or (moe or {}).get("expert") or m["ffn"]
        return {**recipe, "model": view}

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        moes = [p.ffn for p in plans if p.ffn is not None and p.ffn["kind"] == "moe"]
        alike = [replace(p, type=None, ffn=None) for p in plans]
        problem = first_problem(
            (bool(moes), f"model.ffn is {kind_of(m['ffn'])}; {self.model_type} has mixtures of experts"),
            (all(f == moes[0] for f in moes), "model.layer_types: the mixtures of experts differ between layers"),
            (all(p == alike[0] for p in alike), f"model.layer_types: {self.model_type}'s layers differ only in "
                                                f"their FFN (dense or experts)"),
        )
        return (problem or self.sparse_problem([p.ffn is not None and p.ffn["kind"] == "moe" for p in plans])
                or self.moe_problem(moes[0]) or super().accepts(recipe))

    def hf_config(self, model: nn.Module) -> dict:
        plans = layer_plan(model.recipe["model"])
        sparse = [p.ffn["kind"] == "moe" for p in plans]
        spec = next(p.ffn for p in plans if p.ffn["kind"] == "moe")
        return {**super().hf_config(model), **self.moe_config(spec, sparse)}


def softmax_moe(experts: int, top_k: int, expert: dict, *, normalize: bool, balance: float, **extra) -> dict:
    """A ``moe`` spec routed by softmax top-k (Mixtral, Qwen-MoE, OLMoE)."""
    return {"kind": "moe", "experts": experts, "top_k": top_k, "expert": expert,
            "router": {"kind": "softmax_topk", "normalize": normalize, "bias": False}, "balance_loss": balance,
            **extra}


def softmax_moe_problem(spec: dict, family: str, *, normalize: bool | None = None,
                        shared: bool = False) -> str | None:
    """Why a ``moe`` spec is not a softmax top-k mixture of gated FFNs without biases (normalised or
    not as ``normalize`` says, when it says; with a shared expert iff ``shared``), or None."""
    router, expert = spec["router"], spec["expert"]
    return first_problem(
        ((spec["shared"] is not None) == shared,
         f"model.ffn.shared: {family} has {'a' if shared else 'no'} shared expert"),
        (kind_of(router) == "softmax_topk" and not router.get("bias"),
         f"model.ffn.router is {kind_of(router)}; {family} routes by softmax top-k without a bias"),
        (normalize is None or router.get("normalize") == normalize,
         f"model.ffn.router.normalize must be {normalize} for {family}"),
        (kind_of(expert) in ("swiglu", "geglu", "glu") and not expert.get("bias"),
         f"model.ffn.expert is {kind_of(expert)}; {family}'s experts are gated FFNs without biases"),
        (spec["capacity_factor"] is None, f"model.ffn.capacity_factor is set; {family} drops no token"),
        (spec["routed_scale"] == 1.0, f"model.ffn.routed_scale is {spec['routed_scale']}; {family} has none"),
    )
