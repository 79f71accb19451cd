"""Zamba2 (Zyphra; Glorioso et al., 2024) <-> ``decoder_lm``: a Mamba-2 backbone whose hybrid
layers first run a shared attention + MLP block (docs/formulas.md §14.13, ``shared_blocks``).

Every layer is x + Mamba2(RMSNorm(x + lift)); ``lift`` is zero in the plain layers and, in the hybrid
layers of ``layers_block_type`` (``hybrid``; the others are ``mamba`` / ``linear_attention``), the
site's ``linear`` (C -> C, no bias) of the shared block's output:

    S(u) = MLP(RMSNorm(Attn(RMSNorm(u)))),   u = [x; e] (2C: the layer's input beside the embeddings)

``num_mem_blocks`` blocks serve the hybrid layers round-robin (the j-th hybrid layer runs block
j mod n): a layer type per block in the recipe. The attention reads 2C: H = ``num_attention_heads``
heads of D = 2C / H (``attention_head_dim``) over ``num_key_value_heads``, no biases, o_proj 2C -> C,
RoPE of base ``rope_theta`` when ``use_mem_rope``, and the logit scale (D / 2)^-½ — not D^-½ — as
``score.scale``. The MLP is gated (``hidden_act`` on the first half of ``gate_up_proj``, split into
seqzoo's gate and up) with ``add_bias_linear``. Per hybrid layer, LoRA pairs of rank ``adapter_rank``
adapt the MLP's gate_up projection always and q, k, v with ``use_shared_attention_adapter``; transformers
keeps them in the shared block (``*_adapter_list.j``, j the hybrid layer's number), stored once, at
the block's first hybrid layer, as every shared tensor is (a copy stored at a later site must equal it).

The Mamba-2 mixers are Mamba-2's (``_mamba2``) under Zamba2's names, with biases by
``add_bias_linear``, a gated norm fixed at ε 1e-5 whatever ``rms_norm_eps`` says, and Δ clamped below
at ``time_step_min`` — in transformers' chunked scan only (its decode step skips the clamp, as
Mamba-2's does), so seqzoo's decoding, cached or not, follows transformers' full forward.
``use_long_context`` sets ``max_position_embeddings`` to 16384, as Zamba2Config does.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from torch import nn

from seqzoo.builder import layer_plan
from seqzoo.io.hf import (
    CausalLMConverter,
    Rule,
    copy,
    ffn_activation,
    first_problem,
    fused,
    glu_ffn,
    kind_of,
    layer_pattern,
    linear,
    norm,
    special_ids,
    split,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.io.hf.rope import rope_config, rope_problem, rope_spec
from seqzoo.registry import builtin

from ._mamba2 import mixer_config, mixer_problem, mixer_rules, mixer_spec

#: Zamba2Config's names of the Mamba-2 mixer's options, by seqzoo ``mamba2`` parameter.
NAMES = {"heads": "n_mamba_heads", "head_dim": "mamba_headdim", "state": "mamba_d_state", "groups": "mamba_ngroups",
         "conv": "mamba_d_conv", "expand": "mamba_expand", "bias": "add_bias_linear", "conv_bias": "use_conv_bias",
         "chunk": "chunk_size"}
KINDS = {"mamba": "mamba", "linear_attention": "mamba", "hybrid": "hybrid"}
GATED_EPS = 1e-5  # Zamba2RMSNormGated's ε
#: Δ's upper clamp: none in Zamba2, but a recipe holds finite numbers, so float16's largest (a clamp
#: every dtype can apply, which a softplus reaches only from an input beyond it).
UNBOUNDED = 65504.0
LONG_CONTEXT = 16384
#: The shared block's adapters as transformers names them (under ``shared_transformer.``).
ADAPTERS = {"q": "self_attn.linear_q_adapter_list", "k": "self_attn.linear_k_adapter_list",
            "v": "self_attn.linear_v_adapter_list", "ffn": "feed_forward.gate_up_proj_adapter_list"}
#: Zamba2Config's default layers (the 2.7B's 54).
DEFAULT_LAYERS = ["mamba"] + (["mamba"] * 5 + ["hybrid"]) * 7 + ["mamba"] * 4 + ["hybrid"] + ["mamba"] * 3 \
    + ["hybrid"] + ["mamba"] * 2


def site_blocks(hybrid: list[bool], blocks: int) -> list[int | None]:
    """Each layer's shared block: the j-th hybrid layer runs block j mod ``blocks``; None elsewhere."""
    sites = [i for i, h in enumerate(hybrid) if h]
    return [sites.index(i) % blocks if h else None for i, h in enumerate(hybrid)]


def type_name(block: int | None) -> str:
    return "mamba" if block is None else "hybrid" if block == 0 else f"hybrid_{block}"


@builtin("Hugging Face Zamba2 <-> decoder_lm (Mamba-2 layers, a shared attention + MLP block on [x; e] at the hybrid "
         "layers with per-layer LoRA adapters)")
class Zamba2Converter(CausalLMConverter):
    """config.json keys: hidden_size, layers_block_type, num_attention_heads, num_key_value_heads,
    intermediate_size, hidden_act, attention_dropout, num_mem_blocks, use_shared_attention_adapter,
    adapter_rank, use_mem_rope, rope_parameters (rope_theta), max_position_embeddings,
    use_long_context, rms_norm_eps, the Mamba-2 options above, add_bias_linear, time_step_min,
    tie_word_embeddings; num_logits_to_keep, use_mamba_kernels, use_mem_eff_path and the other
    time_step_* (initialisation) change nothing seqzoo computes."""

    model_type = "zamba2"
    architecture = "Zamba2ForCausalLM"
    base_prefix = "model."
    embedding = "model.embed_tokens.weight"
    ignored = (r"rotary_emb\.\w*inv_freq$",)
    defaults = {"vocab_size": 32000, "max_position_embeddings": 4096, "hidden_size": 2560, "layers_block_type": None,
                "mamba_d_state": 64, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_ngroups": 1, "time_step_min": 0.001,
                "n_mamba_heads": 8, "use_conv_bias": True, "chunk_size": 256, "add_bias_linear": False,
                "intermediate_size": None, "hidden_act": "gelu", "num_attention_heads": 32,
                "num_key_value_heads": None, "attention_dropout": 0.0, "num_mem_blocks": 1,
                "use_shared_attention_adapter": False, "adapter_rank": 128, "use_mem_rope": False,
                "initializer_range": 0.02, "rms_norm_eps": 1e-5, "use_long_context": False,
                "tie_word_embeddings": True}

    def config(self, config: dict) -> dict:
        c = HFConfig(config, self.defaults)
        for key in ("hidden_size", "num_attention_heads", "n_mamba_heads", "mamba_expand", "num_mem_blocks",
                    "adapter_rank"):
            c.positive_int(key)
        dim, heads = c["hidden_size"], c["num_attention_heads"]
        c["num_key_value_heads"] = c["num_key_value_heads"] or heads
        c["intermediate_size"] = c["intermediate_size"] or 4 * dim
        c["attention_head_dim"] = 2 * dim // heads  # Zamba2Config derives it: the attention reads [x; e]
        c["mamba_headdim"] = c["mamba_expand"] * dim // c["n_mamba_heads"]
        if c["use_long_context"]:
            c["max_position_embeddings"] = LONG_CONTEXT
        c["time_step_limit"] = (c.positive_number("time_step_min"), UNBOUNDED)
        if c["use_shared_attention_adapter"] and (c["num_key_value_heads"] != heads or 2 * dim % heads):
            raise c.refuse("use_shared_attention_adapter", "its q/k/v adapters write 2·hidden_size features, so "
                                                           "num_key_value_heads must equal num_attention_heads, which "
                                                           "must divide 2·hidden_size")
        return c

    def layer_kinds(self, c: dict) -> list[str]:
        """``mamba`` or ``hybrid`` for each layer, as Zamba2Config reads them."""
        kinds = c["layers_block_type"] or c.get("layer_types") or DEFAULT_LAYERS
        if not isinstance(kinds, list) or any(k not in KINDS for k in kinds):
            raise c.refuse("layers_block_type", f"each layer must be one of {', '.join(KINDS)}")
        return [KINDS[k] for k in kinds]

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        kinds = self.layer_kinds(c)
        dim, head_dim = c["hidden_size"], c["attention_head_dim"]
        blocks = site_blocks([k == "hybrid" for k in kinds], c["num_mem_blocks"])
        used = sorted({b for b in blocks if b is not None})
        attention = {"heads": c["num_attention_heads"], "kv_heads": c["num_key_value_heads"], "head_dim": head_dim,
                     "score": {"kind": "scaled_dot", "scale": (head_dim / 2) ** -0.5}, "bias": False,
                     "out_bias": False, "window": None, "dropout": c["attention_dropout"]}
        ffn = glu_ffn(c["hidden_act"], c["intermediate_size"], c["add_bias_linear"], "config.json: hidden_act")
        block = {"attention": attention, "concat_embeddings": True, "adapter_rank": c["adapter_rank"], "ffn": ffn,
                 "adapters": ["q", "k", "v", "ffn"] if c["use_shared_attention_adapter"] else ["ffn"],
                 "position": rope_spec(config, head_dim, c["max_position_embeddings"]) if c["use_mem_rope"] else None}
        types = [type_name(b) for b in blocks]
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": len(kinds),
            "max_seq_len": c["max_position_embeddings"], "position": "none",
            "norm": {"kind": "rmsnorm", "eps": c["rms_norm_eps"]}, "placement": "pre", "attention": None,
            "mixer": mixer_spec(c, NAMES, dim, GATED_EPS), "ffn": None, "shared_blocks": [block] * len(used),
            "layer_types": {name: {} if b is None else {"shared_block": b} for name, b in zip(types, blocks)},
            "pattern": layer_pattern(types), "tie_embeddings": c["tie_word_embeddings"],
            "init_std": c["initializer_range"]}}

    @staticmethod
    def homes(recipe: dict) -> dict[int, int]:
        """{shared block: the layer of its first site}, where transformers stores the block."""
        homes: dict[int, int] = {}
        for i, plan in enumerate(layer_plan(recipe["model"])):
            if plan.shared_block is not None:
                homes.setdefault(plan.shared_block, i)
        return homes

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        m = recipe["model"]
        specs, homes = m["shared_blocks"] or [], self.homes(recipe)
        rules = [rule for index, home in homes.items()
                 for rule in self.shared_rules(f"decoder.shared_blocks.{index}.",
                                               f"model.layers.{home}.shared_transformer.", specs[index])]
        site = 0
        for i, plan in enumerate(layer_plan(m)):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            if plan.shared_block is not None:
                home = f"model.layers.{homes[plan.shared_block]}.shared_transformer."
                rules.append(copy(b + "site.proj.weight", h + "linear.weight"))
                for name in specs[plan.shared_block]["adapters"]:
                    rules += [copy(f"{b}site.adapters.{name}.{part}.weight",
                                   f"{home}{ADAPTERS[name]}.{site}.{j}.weight")
                              for j, part in enumerate(("down", "up"))]
                h, site = h + "mamba_decoder.", site + 1
            rules += [*norm(b + "mixer_norm", h + "input_layernorm", False), *mixer_rules(b + "mixer.", h + "mamba.",
                                                                                          plan.mixer)]
        return rules + self.ends(recipe, "model.final_layernorm", False)

    @staticmethod
    def shared_rules(ours: str, theirs: str, spec: dict) -> list[Rule]:
        """A shared block's own tensors (its sites' adapters are the sites')."""
        attn, ffn = spec["attention"], spec["ffn"]
        heads, kv_heads, head_dim = attn["heads"], attn["kv_heads"] or attn["heads"], attn["head_dim"]
        rules = [*norm(ours + "in_norm", theirs + "input_layernorm", False),
                 *norm(ours + "ffn_norm", theirs + "pre_ff_layernorm", False),
                 fused(ours + "attention.qkv_proj.weight", tuple(f"{theirs}self_attn.{x}_proj.weight" for x in "qkv"),
                       (heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)),
                 *linear(ours + "attention.out_proj", theirs + "self_attn.o_proj", False),
                 *linear(ours + "ffn.down", theirs + "feed_forward.down_proj", ffn["bias"])]
        for part in ("weight", "bias") if ffn["bias"] else ("weight",):
            rules.append(split((f"{ours}ffn.gate.{part}", f"{ours}ffn.up.{part}"),
                               f"{theirs}feed_forward.gate_up_proj.{part}", (ffn["hidden"], ffn["hidden"])))
        return rules

    def aliases(self, config: dict, recipe: dict) -> dict[str, str]:
        """The copies of a shared block (adapters included) a checkpoint may store at its later
        sites, as transformers ties them to the first."""
        out, homes = dict(super().aliases(config, recipe)), self.homes(recipe)
        sources = [source for rule in self.rules(config, recipe) for source in rule.sources]
        for i, plan in enumerate(layer_plan(recipe["model"])):
            home = homes.get(plan.shared_block)
            if home is not None and home != i:
                there, at = f"model.layers.{home}.shared_transformer.", f"model.layers.{i}.shared_transformer."
                out.update({s.replace(there, at, 1): s for s in sources if s.startswith(there)})
        return out

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans, specs = layer_plan(m), m["shared_blocks"] or []
        first, spec = plans[0], specs[0] if specs else None
        sites = [p.shared_block for p in plans]
        hybrid = [b is not None for b in sites]
        problem = first_problem(
            (bool(specs), "model.shared_blocks: none; Zamba2's hybrid layers run a shared block"),
            (all(s == spec for s in specs), "model.shared_blocks differ; Zamba2's blocks share one configuration"),
            (sites == site_blocks(hybrid, len(specs)),
             f"model.layer_types: Zamba2 runs its {len(specs)} shared block(s) round-robin over the hybrid layers"),
            (all(p.mixer["kind"] == "mamba2" and p.mixer == first.mixer for p in plans),
             "model.mixer: every Zamba2 layer is the same mamba2 mixer"),
            (all(replace(p, type=None, shared_block=None) == replace(first, type=None, shared_block=None)
                 for p in plans), "model.layer_types: Zamba2's layers differ only in their shared block"),
            (first.ffn is None, "model.ffn is set; Zamba2's layers have no FFN of their own"),
            (kind_of(first.norm) == "rmsnorm" and first.placement == "pre" and first.residual == "sequential"
             and first.mixer_norm, "model.norm: Zamba2 is pre-norm RMSNorm with sequential residuals"),
            (kind_of(first.position) == "none", f"model.position is {kind_of(first.position)}; Zamba2's layers "
                                                f"have none (the shared attention has its own)"),
            (first.residual_multiplier == 1.0 and m["embedding_multiplier"] == 1.0 and m["logits_multiplier"] == 1.0,
             "model: Zamba2 has no μP multipliers"),
            (m["embed_norm"] is None and not m["scale_embeddings"] and m["final_softcap"] is None,
             "model: Zamba2 has no embedding norm, embedding scale or final softcap"),
        )
        return problem or self.block_problem(spec, m, first.norm) or first_problem(
            (first.mixer["norm_eps"] == GATED_EPS, f"model.mixer.norm_eps {first.mixer['norm_eps']} must be 1e-05 "
                                                   f"(Zamba2's gated norm)"),
            (first.mixer["dt_limit"] is not None and first.mixer["dt_limit"][0] > 0
             and first.mixer["dt_limit"][1] >= UNBOUNDED,
             f"model.mixer.dt_limit {first.mixer['dt_limit']}: Zamba2 clamps Δ below only, at time_step_min > 0 "
             f"(write [time_step_min, {UNBOUNDED}])"),
            (first.mixer["bias"] == spec["ffn"]["bias"],
             "model: the Mamba-2 and MLP biases differ; Zamba2 has one add_bias_linear"),
        ) or mixer_problem(first.mixer, GATED_EPS, "Zamba2")

    @staticmethod
    def block_problem(spec: dict, m: dict, layer_norm: dict) -> str | None:
        """Why a shared block is not Zamba2's, or None."""
        attn, ffn, adapters = spec["attention"], spec["ffn"], set(spec["adapters"])
        heads, width = attn["heads"], 2 * m["dim"]
        head_dim = attn["head_dim"] or width // heads
        position = spec["position"] or m["position"]
        act = ffn_activation(ffn)
        where = "model.shared_blocks.0"
        return first_problem(
            (spec["concat_embeddings"], f"{where}.concat_embeddings is false; Zamba2's block reads [x; e]"),
            (adapters in ({"ffn"}, {"q", "k", "v", "ffn"}),
             f"{where}.adapters {sorted(adapters)}: Zamba2 adapts the MLP, and q, k and v together or not at all"),
            (act is not None and act[1] and ffn["hidden"] is not None,
             f"{where}.ffn: Zamba2's MLP is gated, with a Hugging Face activation and hidden set"),
            (spec["norm"] in (None, layer_norm), f"{where}.norm: Zamba2's norms are the model's"),
            (head_dim == width // heads, f"{where}.attention.head_dim {head_dim}: Zamba2's is 2·dim / heads"),
            (not attn["bias"] and not attn["out_bias"], f"{where}.attention: Zamba2's projections have no biases"),
            (kind_of(attn["score"]) == "scaled_dot" and attn["score"]["scale"] == (head_dim / 2) ** -0.5,
             f"{where}.attention.score: Zamba2's is scaled_dot with scale (head_dim / 2)^-0.5"),
            (attn["window"] is None and attn["qk_norm"] is None and attn["softcap"] is None and not attn["sinks"]
             and not attn["output_gate"], f"{where}.attention: Zamba2's is plain attention"),
            ("q" not in adapters or ((attn["kv_heads"] or heads) == heads and heads * head_dim == width),
             f"{where}.adapters: transformers' q/k/v adapters need as many KV heads as heads over 2·dim"),
            (kind_of(position) in ("none", "rope"),
             f"{where}.position is {kind_of(position)}; Zamba2's is rope or none"),
        ) or (kind_of(position) == "rope" and rope_problem(position, m["max_seq_len"], head_dim)) or None

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        plans, spec = layer_plan(m), m["shared_blocks"][0]
        mamba, attn, position = plans[0].mixer, spec["attention"], spec["position"] or m["position"]
        mixer = {k: v for k, v in mixer_config(mamba, NAMES, m["dim"]).items() if k != "time_step_limit"}
        rope = rope_config(position, m["max_seq_len"]) if kind_of(position) == "rope" else {}
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "num_hidden_layers": m["layers"],
                "layers_block_type": ["mamba" if p.shared_block is None else "hybrid" for p in plans],
                "num_attention_heads": attn["heads"], "num_key_value_heads": attn["kv_heads"] or attn["heads"],
                "intermediate_size": spec["ffn"]["hidden"], "hidden_act": ffn_activation(spec["ffn"])[0],
                "attention_dropout": attn["dropout"], "num_mem_blocks": len(m["shared_blocks"]),
                "use_shared_attention_adapter": "q" in spec["adapters"], "adapter_rank": spec["adapter_rank"],
                "use_mem_rope": bool(rope), **rope, "max_position_embeddings": m["max_seq_len"],
                "use_long_context": False, "rms_norm_eps": plans[0].norm["eps"], **mixer,
                "time_step_min": mamba["dt_limit"][0], "tie_word_embeddings": m["tie_embeddings"],
                "initializer_range": m["init_std"], **special_ids(model)}
