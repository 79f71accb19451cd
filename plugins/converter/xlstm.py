"""xLSTM-7B (Beck et al., 2025, "xLSTM 7B: A Recurrent LLM for Fast and Efficient Inference") <->
``decoder_lm``: a stack of mLSTM blocks, transformers' ``xLSTMBlock``, with no position scheme (the
recurrence orders the tokens):

    h ← h + mLSTM(RMSNorm(h));  h ← h + SwiGLU(RMSNorm(h))     every block
    logits = cap · tanh(W · RMSNorm(h) / cap)                  cap = ``output_logit_soft_cap``

- mLSTM (``mixer: mlstm``, docs/formulas.md §15.8): ``num_heads`` heads, q/k heads int(C ·
  ``qk_dim_factor``) / H wide, v and output-gate heads int(C · ``v_dim_factor``) / H; gates soft-capped
  at ``gate_soft_cap``; a LayerNorm per head with ``norm_eps``; ε = ``eps``; chunk = ``chunk_size``.
  ``weight_mode: single`` stores ``q``, ``k``, ``v``, ``ogate_preact`` (stacked into ``qkvo_proj``)
  and ``igate_preact``, ``fgate_preact`` (into ``if_proj``); ``fused`` stores them stacked already
  (``qkv_opreact``, ``ifgate_preact``).
- FFN: SwiGLU ``proj_down``(SiLU(``proj_up_gate`` x) ⊙ ``proj_up`` x) of width C · ``ffn_proj_factor``
  rounded up to a multiple of ``ffn_round_up_to_multiple_of``; ``fused`` stores [gate | up] as
  ``proj_up_gate_z``.
- Norms: ``norm_mlstm``, ``norm_ffn`` and ``out_norm``, RMSNorm with ``norm_eps``, reduced in
  float32 (``norm_reduction_force_float32``, as seqzoo's always are).

What transformers' class does whatever its config says, and seqzoo follows: ``out_norm`` is always
there (``add_out_norm: false`` is refused); ``lm_head`` is never tied to the embeddings (the import
reads ``lm_head``; a tied seqzoo model is not exported); ``attention_mask`` is ignored, so a padded
position writes into the state like a token — seqzoo's padding leaves the state as it was, so a
left-padded row equals the row alone and differs from transformers'. ``mode``, the kernels and the
dtypes of its backend only move speed and rounding.

Exports write ``weight_mode: single`` and ``mode: inference``, and ``use_cache: false`` when
transformers' ``xLSTMCache`` would be mis-shaped: it sizes each state by ``qk_dim`` / ``v_dim``
rounded up to a multiple of 64, while the layers are int(C · factor) wide (xLSTM-7B's agree).
"""
from __future__ import annotations

import math
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
    linear,
    renamed,
    special_ids,
    split,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.registry import builtin

#: transformers' ``xLSTMConfig.qk_dim`` / ``v_dim`` and its cache round the widths up to this.
CACHE_MULTIPLE = 64
#: xLSTM-7B's FFN width rule (``ffn_proj_factor``, ``ffn_round_up_to_multiple_of``).
FFN_RULE = (2.667, 64)
FFN = {"ffn.gate": "ffn.proj_up_gate", "ffn.up": "ffn.proj_up", "ffn.down": "ffn.proj_down"}


def round_up(x: float, multiple: int) -> int:
    """transformers' ``round_up_to_next_multiple_of`` (x a float: floor division first)."""
    return int(((x + multiple - 1) // multiple) * multiple)


def factor_of(width: int, dim: int) -> float:
    """The float f with int(dim · f) == width, as transformers sizes a layer from a factor: width /
    dim, nudged up where the product rounds just below."""
    factor = width / dim
    while int(dim * factor) < width:
        factor = math.nextafter(factor, math.inf)
    return factor


def ffn_rule(hidden: int, dim: int) -> tuple[float, int]:
    """(ffn_proj_factor, ffn_round_up_to_multiple_of) that make transformers size the FFN
    ``hidden`` wide: xLSTM-7B's rule when it gives it, else hidden / C exactly."""
    for factor, multiple in (FFN_RULE, (hidden / dim, 64), (factor_of(hidden, dim), 1)):
        if round_up(dim * factor, multiple) == hidden:
            return factor, multiple
    raise AssertionError(f"no FFN rule gives {hidden} from {dim}")  # unreachable: the last one does


@builtin("Hugging Face xLSTM <-> decoder_lm (xLSTM-7B: mLSTM blocks with SwiGLU FFNs, soft-capped logits)")
class XLSTMConverter(CausalLMConverter):
    """config.json keys: vocab_size, hidden_size (= embedding_dim), num_hidden_layers (= num_blocks),
    num_heads, qk_dim_factor, v_dim_factor, gate_soft_cap, output_logit_soft_cap, norm_eps, eps,
    chunk_size, ffn_proj_factor, ffn_round_up_to_multiple_of, weight_mode, use_bias (false),
    add_out_norm (true), norm_reduction_force_float32 (true), tie_word_embeddings (read as
    transformers does: never tied); mode, the kernel names, autocast_kernel_dtype,
    inference_state_dtype, max_inference_chunksize and return_last_states change nothing seqzoo
    computes."""

    model_type = "xlstm"
    architecture = "xLSTMForCausalLM"
    base_prefix = "backbone."
    embedding = "backbone.embeddings.weight"
    defaults = {"vocab_size": 50304, "hidden_size": 4096, "embedding_dim": None, "num_hidden_layers": 32,
                "num_blocks": None, "num_heads": 8, "use_bias": False, "norm_reduction_force_float32": True,
                "add_out_norm": True, "norm_eps": 1e-6, "qk_dim_factor": 0.5, "v_dim_factor": 1.0,
                "chunk_size": 64, "eps": 1e-6, "ffn_proj_factor": 2.667, "ffn_round_up_to_multiple_of": 64,
                "gate_soft_cap": 15.0, "output_logit_soft_cap": 30.0, "weight_mode": "single"}
    #: seqzoo has no position table; the state takes any length.
    max_seq_len = 1 << 20

    def config(self, config: dict) -> dict:
        c = HFConfig(config, self.defaults)
        for key, other in (("hidden_size", "embedding_dim"), ("num_hidden_layers", "num_blocks")):
            c[key] = c[other] if c[key] is None else c[key]  # xLSTMConfig fills a null one from the other
            c[other] = c[key] if c[other] is None else c[other]
            if c[key] != c[other]:
                raise c.refuse(other, f"transformers' xLSTM needs it equal to {key} {c[key]}")
        dim, heads = c.positive_int("hidden_size"), c.positive_int("num_heads")
        c.positive_int("num_blocks")
        if c["weight_mode"] not in ("single", "fused"):
            raise c.refuse("weight_mode", "it must be single or fused")
        if c["use_bias"]:
            raise c.refuse("use_bias", "xLSTM's block RMSNorms then carry biases, which seqzoo's rmsnorm has not")
        if not c["add_out_norm"]:
            raise c.refuse("add_out_norm", "transformers' xLSTMModel applies out_norm whatever it says")
        if not c["norm_reduction_force_float32"]:
            raise c.refuse("norm_reduction_force_float32", "seqzoo's norms reduce in float32 (set it to true: "
                                                           "float32 models compute the same)")
        for key in ("qk_dim_factor", "v_dim_factor"):
            width = int(dim * c.positive_number(key))
            if width < heads or width % heads:
                raise c.refuse(key, f"int(hidden_size · {key}) = {width} must be a positive multiple of "
                                    f"num_heads {heads}")
        c["ffn_hidden"] = round_up(dim * c.positive_number("ffn_proj_factor"),
                                   c.positive_int("ffn_round_up_to_multiple_of"))
        return c

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        dim, heads, eps = c["hidden_size"], c["num_heads"], c["norm_eps"]
        mixer = {"kind": "mlstm", "heads": heads, "head_dim": int(dim * c["qk_dim_factor"]) // heads,
                 "value_head_dim": int(dim * c["v_dim_factor"]) // heads, "gate_soft_cap": c["gate_soft_cap"],
                 "norm": "layernorm", "norm_eps": eps, "eps": c["eps"], "bias": False, "chunk": c["chunk_size"]}
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": c["num_blocks"],
            "max_seq_len": self.max_seq_len, "position": "none", "norm": {"kind": "rmsnorm", "eps": eps},
            "placement": "pre", "attention": {"heads": 1},  # unused, as mamba2's: no layer attends
            "mixer": mixer, "ffn": glu_ffn("silu", c["ffn_hidden"], False),
            "final_softcap": c["output_logit_soft_cap"], "tie_embeddings": False,
        }}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        c = self.config(config)
        m, dim = recipe["model"], c["hidden_size"]
        heads, hidden = c["num_heads"], c["ffn_hidden"]
        keys, values = int(dim * c["qk_dim_factor"]), int(dim * c["v_dim_factor"])  # as xLSTMLayer sizes them
        rules = []
        for i in range(m["layers"]):
            b, h = f"decoder.blocks.{i}.", f"backbone.blocks.{i}."
            x = h + "mlstm_layer."
            rules += renamed(b, h, {"mixer_norm": "norm_mlstm", "ffn_norm": "norm_ffn"}, False)
            if c["weight_mode"] == "single":
                rules.append(fused(b + "mixer.qkvo_proj.weight", tuple(f"{x}{p}.weight" for p in
                                                                       ("q", "k", "v", "ogate_preact")),
                                   (keys, keys, values, values)))
                rules += [fused(f"{b}mixer.if_proj.{part}", (f"{x}igate_preact.{part}", f"{x}fgate_preact.{part}"),
                                (heads, heads)) for part in ("weight", "bias")]
                rules += renamed(b, h, {k: v for k, v in FFN.items() if k != "ffn.down"}, False)
            else:
                rules += [copy(b + "mixer.qkvo_proj.weight", x + "qkv_opreact.weight")]
                rules += linear(b + "mixer.if_proj", x + "ifgate_preact", True)
                rules.append(split((b + "ffn.gate.weight", b + "ffn.up.weight"), h + "ffn.proj_up_gate_z.weight",
                                   (hidden, hidden)))
            rules += linear(b + "ffn.down", h + "ffn.proj_down", False)
            rules += renamed(b + "mixer.", x, {"norm": "multihead_norm", "out_proj": "out_proj"}, False)
        return rules + self.ends(recipe, "backbone.out_norm", False)

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        first = plans[0]
        spec, ffn = first.mixer, first.ffn
        return first_problem(
            (all(replace(p, type=None) == replace(first, type=None) for p in plans),
             "model.pattern: layers differ; xLSTM's blocks are all alike"),
            (spec["kind"] == "mlstm", f"model.mixer is {spec['kind']}, needs mlstm"),
            (spec["kind"] != "mlstm" or (spec["norm"] == "layernorm" and not spec["bias"]),
             "model.mixer: xLSTM's mLSTM has a LayerNorm per head and no biases"),
            (spec.get("norm_eps") == first.norm.get("eps"), "model.mixer.norm_eps must equal model.norm.eps "
                                                            "(xLSTM has one norm_eps)"),
            (spec.get("gate_soft_cap") is not None, "model.mixer.gate_soft_cap is null; transformers' xLSTMConfig "
                                                    "needs a number"),
            (ffn is not None and ffn_activation(ffn) == ("silu", True) and not ffn["bias"],
             f"model.ffn is {kind_of(ffn)}, needs swiglu without biases"),
            (kind_of(first.position) == "none", f"model.position is {kind_of(first.position)}, needs none"),
            (kind_of(first.norm) == "rmsnorm", f"model.norm is {kind_of(first.norm)}, needs rmsnorm"),
            (first.placement == "pre", f"model.placement is {first.placement}, needs pre"),
            (first.residual == "sequential", f"model.residual is {first.residual}, needs sequential"),
            (first.mixer_norm and first.residual_multiplier == 1.0,
             "model.layer_types: every xLSTM block has norm_mlstm and adds its sublayers unscaled"),
            (not m["tie_embeddings"], "model.tie_embeddings is true; transformers' xLSTM never ties its head"),
            (m["final_softcap"] is not None, "model.final_softcap is null; xLSTM soft-caps its logits "
                                             "(output_logit_soft_cap)"),
            (m["embed_norm"] is None and not m["scale_embeddings"] and m["embedding_multiplier"] == 1.0
             and m["logits_multiplier"] == 1.0,
             "model: xLSTM has no embedding norm, embedding scale or multipliers"),
        )

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        dim = m["dim"]
        spec = layer_plan(m)[0].mixer
        mixer = model.decoder.blocks[0].mixer
        keys, values = mixer.heads * mixer.head_dim, mixer.heads * mixer.value_head_dim
        factor, multiple = ffn_rule(model.decoder.blocks[0].ffn.hidden, dim)
        cache_fits = all(round_up(w, CACHE_MULTIPLE) == w for w in (keys, values))
        return {"vocab_size": m["vocab_size"], "hidden_size": dim, "embedding_dim": dim,
                "num_hidden_layers": m["layers"], "num_blocks": m["layers"], "num_heads": mixer.heads,
                "qk_dim_factor": factor_of(keys, dim), "v_dim_factor": factor_of(values, dim),
                "gate_soft_cap": float(spec["gate_soft_cap"]), "output_logit_soft_cap": float(m["final_softcap"]),
                "norm_eps": float(m["norm"]["eps"]), "eps": float(spec["eps"]), "chunk_size": spec["chunk"],
                "ffn_proj_factor": float(factor), "ffn_round_up_to_multiple_of": multiple, "use_bias": False,
                "add_out_norm": True, "norm_reduction_force_float32": True, "weight_mode": "single",
                "mode": "inference", "use_cache": cache_fits, "tie_word_embeddings": False, **special_ids(model)}
