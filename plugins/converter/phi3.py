"""Phi-3 (Abdin et al., 2024, "Phi-3 Technical Report"; also Phi-3.5-mini and Phi-4-mini) <->
``decoder_lm``: LLaMA's pre-norm RMSNorm stack with fused projections, no biases, an optional
sliding window, partial rotary and LongRoPE.

- ``qkv_proj`` rows are [q (H·D) | k (K·D) | v (K·D)], seqzoo's own fused ``qkv_proj``: copied.
- ``gate_up_proj`` rows are [gate (F) | up (F)], the gate activated: split into the gated FFN's
  ``gate`` and ``up`` on import, concatenated again on export.
- ``partial_rotary_factor`` p (Phi-4-mini: 0.75) rotates halves of the first int(p·D) dims of each
  head and passes the rest: ``rope.rotary_dim``.
- ``rope_scaling`` of type ``longrope`` (the old names ``su`` and ``yarn`` read as longrope, as
  transformers does) is ``rope_scaling: longrope``. L is the top-level
  ``original_max_position_embeddings`` (4096 when absent): transformers' Phi3Config writes it over
  the one inside the rope parameters. Its ``generate`` drops the KV cache when the sequence first
  passes L; seqzoo's does the same (see ``plugins/rope_scaling/longrope.py``).
- ``sliding_window`` W: query i sees keys i − W + 1 … i, ``attention.window``.
"""
from __future__ import annotations

from collections.abc import Collection

from torch import nn

from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import GGUFArch
from seqzoo.io.gguf.arch import first, heads_fill_width, window_within_context
from seqzoo.io.hf import Rule, copy, first_problem, renamed, split
from seqzoo.io.hf.decoder import LLAMA_DEFAULTS, DecoderConverter, DecoderFamily
from seqzoo.registry import builtin

#: Phi-3's L when config.json has none (transformers' Phi3Config default).
ORIGINAL = 4096


def phi3_rotary_dims(config) -> int:
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    return int(config.get("partial_rotary_factor", 1.0) * head_dim)



@builtin("Hugging Face Phi-3 <-> decoder_lm (fused qkv/gate_up, partial rotary, LongRoPE)")
class Phi3Converter(DecoderConverter):
    """LLaMA's keys (without attention_bias / mlp_bias) plus original_max_position_embeddings,
    partial_rotary_factor, sliding_window, resid_pdrop (0) and embd_pdrop (unused by transformers)."""

    # Without LongRoPE or partial rotary a Phi-3 is a LLaMA (or, with a window, a Mistral): export
    # picks phi3 by itself only for what the others cannot hold (named_only).
    family = DecoderFamily(
        "phi3", "Phi3ForCausalLM", "Phi-3", qkv_bias=False, out_bias=False, window="sliding_window",
        scalings=("default", "longrope"), partial_rotary=True, named_only=True,
        defaults={**LLAMA_DEFAULTS, "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192,
                  "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "sliding_window": None, "resid_pdrop": 0.0})
    # llama.cpp's phi3: the fused projections as they are, partial RoPE by its dimension count,
    # LongRoPE's factors as tensors, no window (its graph turns Phi's off).
    gguf = GGUFArch("phi3", problem=first(heads_fill_width, window_within_context),
                    export=lambda c: {"rope.dimension_count": phi3_rotary_dims(c)},
                    config=lambda get: {"partial_rotary_factor": get("rope.dimension_count")
                                        / (get("embedding_length") // get("attention.head_count")),
                                        "original_max_position_embeddings":
                                            get("rope.scaling.original_context_length", get("context_length")),
                                        "sliding_window": None})

    def rope_view(self, config: dict) -> dict:
        """config.json with its rope as Phi3Config reads it: rope_scaling before rope_parameters,
        su and yarn renamed longrope, L the top-level original_max_position_embeddings."""
        params = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
        kind = params.get("rope_type", params.get("type"))
        original = config.get("original_max_position_embeddings", ORIGINAL)
        inner = params.get("original_max_position_embeddings")
        if kind == "su" and inner != original:  # su keeps its own L for the factors, not the cache
            raise CheckpointError(
                f"config.json: rope_scaling type 'su' switches its factors at its own "
                f"original_max_position_embeddings {inner} but drops the cache at the top-level {original}; "
                f"seqzoo does both at one L (make them equal)")
        if kind in ("su", "yarn"):
            params["rope_type"] = "longrope"
        return {**config, "rope_parameters": params, "rope_scaling": None,
                "original_max_position_embeddings": original}

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        dropout = config.get("resid_pdrop") or 0.0
        if dropout:
            raise CheckpointError(f"config.json: resid_pdrop {dropout} is not supported (seqzoo's model "
                                  f"dropout also drops the embeddings, which Phi-3 does not); set it to 0")
        return super().recipe(self.rope_view(config), names)

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        c = self.config(config)
        hidden = c["intermediate_size"]
        rules = []
        for i in range(c["num_hidden_layers"]):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            rules += renamed(b, h, {"mixer_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                                    "mixer.out_proj": "self_attn.o_proj", "ffn.down": "mlp.down_proj"}, False)
            rules += [copy(f"{b}mixer.qkv_proj.weight", f"{h}self_attn.qkv_proj.weight"),
                      split((f"{b}ffn.gate.weight", f"{b}ffn.up.weight"), f"{h}mlp.gate_up_proj.weight",
                            (hidden, hidden))]
        return rules + self.ends(recipe, "model.norm", False)

    def attention_problem(self, m: dict) -> str | None:
        attn, scaling = m["attention"], m["position"].get("scaling")
        return super().attention_problem(m) or first_problem(
            # transformers checks the factor lists against hidden_size / heads, not head_dim
            (scaling is None or attn["head_dim"] in (None, m["dim"] // attn["heads"]),
             "model.attention.head_dim: Phi-3's longrope needs head_dim = dim / heads"),
        )

    def family_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        scaling = m["position"]["scaling"]
        original = scaling["original_max_seq_len"] if scaling is not None else m["max_seq_len"]
        return {**super().family_config(model), "original_max_position_embeddings": original}

    def hf_config(self, model: nn.Module) -> dict:
        config = super().hf_config(model)
        rotary = model.recipe["model"]["position"]["rotary_dim"]
        if rotary not in (None, config["head_dim"]):  # rope_problem checked that this is exact
            config["partial_rotary_factor"] = config["rope_parameters"]["partial_rotary_factor"] = \
                rotary / config["head_dim"]
        return config
