"""RecurrentGemma (Google, 2024; the Griffin architecture of De et al., 2024) <-> ``decoder_lm``:
recurrent (RG-LRU) layers and local-attention layers, each followed by a GeGLU MLP, pre-norm with
Gemma's (1 + w) RMSNorm: x + T(n₁(x)), then + MLP(n₂(·)).

- Layers: ``block_types`` (recurrent, recurrent, attention) cycled over ``num_hidden_layers``, as
  layer types in the shortest repeating ``pattern``; the recipe's mixer is ``rg_lru``.
- Recurrent layers (``temporal_block``): ``linear_x`` and ``linear_y`` stacked into seqzoo's
  ``in_proj`` rows [u | y], ``conv_1d`` (kernel ``conv1d_width``), the RG-LRU gates (blocks of
  ``lru_width`` / ``num_attention_heads``), ``recurrent_param``, ``linear_out``; biases everywhere.
  See docs/formulas.md §15.10.
- Attention layers (``temporal_block``): MQA/GQA over ``num_key_value_heads``, heads C / H wide (a
  stored ``head_dim`` must agree), a window of ``attention_window_size`` keys, q/k/v biases with
  ``attention_bias`` and always one on ``o_proj``, RoPE rotating the first half of each head
  (``partial_rotary_factor``, 0.5 unless ``rope_parameters`` names another; default RoPE only).
- MLP (``mlp_block``): ``gate_proj`` / ``up_proj`` / ``down_proj`` with biases, ``intermediate_size``
  / 2 wide; ``hidden_activation`` (a GELU) is also the recurrent blocks' gate activation.
- ``temporal_pre_norm`` / ``channel_pre_norm`` / ``final_norm``: (1 + w) RMSNorm, ``rms_norm_eps``;
  the tied head's logits are soft-capped at ``logits_soft_cap``.
- Embeddings times √C, where transformers holds √C as a bfloat16 tensor (``normalizer``) whatever
  the model's dtype: √2560 = 50.596 is 50.5. seqzoo's ``scale_embeddings`` multiplies by √C in the
  weights' dtype, which is the same only in bfloat16; so the recipe says ``embedding_multiplier:
  50.5`` (√C rounded to bfloat16) with ``scale_embeddings: false``, and matches in every dtype.

transformers sets no length limit (local attention and a fixed state); the recipe's
``max_seq_len`` is 8192, the length RecurrentGemma was trained on, and exports leave it out.
Padding: transformers feeds padded positions into the recurrent blocks' conv (only the reset at
``position_ids == 0`` cuts the recurrence), seqzoo zeroes them (§15.10): unpadded rows agree, and a
left-padded row in seqzoo equals the row alone.
"""
from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import replace

import torch
from torch import nn

from seqzoo.builder import layer_plan
from seqzoo.errors import CheckpointError
from seqzoo.io.hf import (
    ACTIVATIONS,
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
    renamed,
    special_ids,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.io.hf.rope import partial_factor, rope_problem, rope_spec
from seqzoo.registry import builtin

from ._hybrid import attention_rules, mixer_layout, parts

#: RecurrentGemmaConfig's defaults.
DEFAULTS = {"vocab_size": 256000, "hidden_size": 2560, "intermediate_size": 7680, "num_hidden_layers": 26,
            "num_attention_heads": 10, "num_key_value_heads": None, "lru_width": None, "attention_window_size": 2048,
            "conv1d_width": 4, "logits_soft_cap": 30.0, "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
            "block_types": ["recurrent", "recurrent", "attention"], "attention_dropout": 0.0,
            "attention_bias": False, "tie_word_embeddings": True, "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
KINDS = ("recurrent", "attention")
MAX_SEQ_LEN = 8192  # RecurrentGemma's training length; transformers has no max_position_embeddings
#: Each layer's norms and the MLP: seqzoo name -> HF name under ``model.layers.i.``.
NORMS = {"mixer_norm": "temporal_pre_norm", "ffn_norm": "channel_pre_norm"}
MLP = {"ffn.gate": "mlp_block.gate_proj", "ffn.up": "mlp_block.up_proj", "ffn.down": "mlp_block.down_proj"}
GATES = ("input_gate_weight", "input_gate_bias", "recurrent_gate_weight", "recurrent_gate_bias", "recurrent_param")


def embedding_scale(dim: int) -> float:
    """√C as transformers applies it: rounded to bfloat16 (its ``normalizer`` buffer)."""
    return torch.tensor(math.sqrt(dim), dtype=torch.bfloat16).item()


@builtin("Hugging Face RecurrentGemma <-> decoder_lm (RG-LRU and local-attention layers, GeGLU, (1+w) norms, "
         "logit softcap)")
class RecurrentGemmaConverter(CausalLMConverter):
    """config.json keys: vocab_size, hidden_size, intermediate_size, num_hidden_layers,
    block_types, num_attention_heads, num_key_value_heads, lru_width, attention_window_size,
    conv1d_width, logits_soft_cap, rms_norm_eps, hidden_activation, rope_parameters (or rope_theta
    and partial_rotary_factor), attention_bias, attention_dropout, tie_word_embeddings; head_dim,
    final_w_init_variance_scale and layers_block_type are derived; w_init_variance_scale and
    embeddings_scale_by_sqrt_dim change nothing transformers computes."""

    model_type = "recurrent_gemma"
    architecture = "RecurrentGemmaForCausalLM"
    base_prefix = "model."
    embedding = "model.embed_tokens.weight"
    ignored = (r"rotary_emb\.\w*inv_freq$", r"model\.normalizer$")

    def config(self, config: dict) -> HFConfig:
        c = HFConfig(config, DEFAULTS)
        dim, heads = c.positive_int("hidden_size"), c.positive_int("num_attention_heads")
        c["num_key_value_heads"] = c["num_key_value_heads"] or heads
        c["lru_width"] = c["lru_width"] or dim
        if c.positive_int("lru_width") % heads:
            raise c.refuse("lru_width", f"it must be divisible by num_attention_heads = {heads} (the RG-LRU gates "
                                        f"are that many blocks)")
        if config.get("head_dim", dim // heads) != dim // heads:
            raise c.refuse("head_dim", f"transformers makes it hidden_size / num_attention_heads = {dim // heads}")
        kind = ACTIVATIONS.get(c["hidden_activation"], (None,))[0]
        if kind != "gelu":
            raise c.refuse("hidden_activation", "the recurrent blocks gate with it and seqzoo's rg_lru gates with a "
                                                "GELU (gelu or gelu_pytorch_tanh)")
        c.positive_int("attention_window_size")
        c.positive_number("logits_soft_cap")
        return c

    def layer_kinds(self, c: HFConfig) -> list[str]:
        """``recurrent`` or ``attention`` for each layer: ``block_types`` cycled."""
        types = c["block_types"]
        if not isinstance(types, list | tuple) or not types or any(t not in KINDS for t in types):
            raise c.refuse("block_types", f"it must list {' or '.join(KINDS)} entries")
        old = c.get("_block_types")  # transformers 4's name, which transformers 5 no longer reads
        if old is not None and list(old) != list(types):
            raise CheckpointError(f"config.json: _block_types {old!r} (transformers 4's key) disagrees with "
                                  f"block_types {list(types)!r}, which transformers 5 builds; write block_types")
        return [types[i % len(types)] for i in range(c.positive_int("num_hidden_layers"))]

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        kinds = self.layer_kinds(c)
        dim, heads, eps = c["hidden_size"], c["num_attention_heads"], c["rms_norm_eps"]
        head_dim = dim // heads
        params = dict(config.get("rope_parameters") or {})
        params.setdefault("rope_theta", c["rope_theta"])
        params.setdefault("partial_rotary_factor", c["partial_rotary_factor"])
        position = rope_spec({**config, "rope_parameters": params, "rope_scaling": None}, head_dim, MAX_SEQ_LEN,
                             scalings=("default",), partial=True)
        act = c["hidden_activation"]
        attention = {"heads": heads, "kv_heads": c["num_key_value_heads"], "score": "scaled_dot",
                     "bias": c.flag("attention_bias"), "out_bias": True, "window": c["attention_window_size"],
                     "dropout": c["attention_dropout"]}
        if head_dim * heads != dim:
            attention["head_dim"] = head_dim
        mixer = {"kind": "rg_lru", "heads": heads, "conv": c.positive_int("conv1d_width"),
                 "approximate": ACTIVATIONS[act][1]}
        if c["lru_width"] != dim:
            mixer["width"] = c["lru_width"]
        model = {"kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": len(kinds),
                 "max_seq_len": MAX_SEQ_LEN, "position": position, "norm": {"kind": "gemma_rmsnorm", "eps": eps},
                 "placement": "pre", "attention": attention, "mixer": mixer,
                 "ffn": glu_ffn(act, c.positive_int("intermediate_size") // 2, True),
                 "tie_embeddings": c.flag("tie_word_embeddings"), "scale_embeddings": False,
                 "embedding_multiplier": embedding_scale(dim), "final_softcap": float(c["logits_soft_cap"])}
        model.update(mixer_layout(kinds))
        return {"model": model}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        m = recipe["model"]
        rules = []
        for i, plan in enumerate(layer_plan(m)):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}.temporal_block."
            rules += renamed(b, f"model.layers.{i}.", NORMS, False)
            if plan.mixer["kind"] == "rg_lru":
                width = plan.mixer["width"] or m["dim"]
                rules += [fused(f"{b}mixer.in_proj.{part}", (f"{h}linear_x.{part}", f"{h}linear_y.{part}"),
                                (width, width)) for part in ("weight", "bias")]
                rules += linear(b + "mixer.conv1d", h + "conv_1d", True)
                rules += [copy(b + "mixer." + name, h + "rg_lru." + name) for name in GATES]
                rules += linear(b + "mixer.out_proj", h + "linear_out", True)
            else:
                rules += attention_rules(b, h, plan.attention, m["dim"], out="o_proj", out_bias=True)
            rules += renamed(b, f"model.layers.{i}.", MLP, True)
        return rules + self.ends(recipe, "model.final_norm", False)

    # -- model -> config.json ------------------------------------------------------------------------
    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        first = plans[0]
        lru, attn = parts(plans, "rg_lru")
        kinds = {p.mixer["kind"] for p in plans}
        alike = [replace(p, type=None, mixer={}) for p in plans]  # what must not differ between layers
        if attn is None or first.ffn is None:
            return "model: RecurrentGemma's config describes an attention section and an MLP in every layer"
        act = ffn_activation(first.ffn, "gelu_pytorch_tanh")
        scale = embedding_scale(m["dim"])
        return first_problem(
            (kinds <= {"rg_lru", "attention"}, f"model.mixer: layers use {sorted(kinds)}; RecurrentGemma's are "
                                               f"rg_lru or attention"),
            (all(p.mixer == lru for p in plans if p.mixer["kind"] == "rg_lru"),
             "model.layer_types: the rg_lru layers differ; RecurrentGemma has one set of options"),
            (all(p == alike[0] for p in alike),
             "model.layer_types: RecurrentGemma's layers differ only in their mixer (rg_lru or attention)"),
            (act is not None and act[1] and kind_of(first.ffn) == "geglu" and first.ffn["bias"],
             "model.ffn must be a geglu with biases (RecurrentGemma's MLP)"),
            (lru is None or (lru["heads"] == attn.heads and lru["c"] == 8.0 and lru["conv_bias"] and lru["bias"]
                             and lru["approximate"] == first.ffn.get("approximate")),
             "model.mixer: RecurrentGemma's rg_lru has as many heads as the attention, c = 8, biases everywhere "
             "and the MLP's GELU"),
            (kind_of(first.norm) == "gemma_rmsnorm", f"model.norm is {kind_of(first.norm)}, needs gemma_rmsnorm"),
            (first.placement == "pre" and first.residual == "sequential" and first.mixer_norm
             and first.residual_multiplier == 1.0,
             "model: RecurrentGemma is pre-norm, its sublayers added in sequence, a norm before every mixer"),
            (kind_of(first.position) == "rope", f"model.position is {kind_of(first.position)}, needs rope"),
            (kind_of(attn.score) == "scaled_dot" and attn.score.get("scale") is None,
             "model.attention.score must be scaled_dot with the default scale"),
            (attn.head_dim in (None, m["dim"] // attn.heads), "model.attention.head_dim must be dim / heads"),
            (attn.out_bias or (attn.out_bias is None and attn.bias),
             "model.attention.out_bias is false; RecurrentGemma's o_proj always has a bias"),
            (attn.window is not None, "model.attention.window is null; RecurrentGemma's attention is local"),
            (attn.qk_norm is None and attn.softcap is None and not attn.sinks and not attn.output_gate,
             "model.attention: RecurrentGemma's has no QK-norm, softcap, sinks or output gate"),
            (m["embed_norm"] is None and m["final_softcap"] is not None and m["logits_multiplier"] == 1.0,
             "model: RecurrentGemma has no embedding norm or logits multiplier, and soft-caps its logits"),
            ((not m["scale_embeddings"] and m["embedding_multiplier"] == scale)
             or (m["scale_embeddings"] and m["embedding_multiplier"] == 1.0 and math.sqrt(m["dim"]) == scale),
             f"model.embedding_multiplier must be {scale} (√{m['dim']} in bfloat16, as transformers scales) with "
             f"scale_embeddings false"),
        ) or rope_problem(first.position, m["max_seq_len"], m["dim"] // attn.heads, scalings=("default",),
                          partial=True)

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        plans = layer_plan(m)
        lru, attn = parts(plans, "rg_lru")
        first = plans[0]
        head_dim = m["dim"] // attn.heads
        factor = partial_factor(first.position.get("rotary_dim") or head_dim, head_dim)
        kinds = ["recurrent" if p.mixer["kind"] == "rg_lru" else "attention" for p in plans]
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "num_hidden_layers": m["layers"],
                "intermediate_size": 2 * model.decoder.blocks[0].ffn.hidden, "block_types": layer_pattern(kinds),
                "num_attention_heads": attn.heads, "num_key_value_heads": attn.kv_heads or attn.heads,
                "lru_width": (lru["width"] if lru else None) or m["dim"], "attention_window_size": attn.window,
                "conv1d_width": lru["conv"] if lru else DEFAULTS["conv1d_width"],
                "logits_soft_cap": m["final_softcap"], "rms_norm_eps": first.norm["eps"],
                "hidden_activation": ffn_activation(first.ffn, "gelu_pytorch_tanh")[0],
                "rope_parameters": {"rope_type": "default", "rope_theta": first.position["base"],
                                    "partial_rotary_factor": factor},
                "rope_theta": first.position["base"], "partial_rotary_factor": factor,
                "attention_bias": attn.bias, "attention_dropout": attn.dropout,
                "tie_word_embeddings": m["tie_embeddings"], **special_ids(model)}
