"""What the Gemma converters share (``gemma2``, ``gemma3_text``): Gemma 2's block, which Gemma 3
keeps with a RoPE per layer type and a QK-norm. The block's notes (local and global layers,
softcaps, sandwich norms, the (1 + w) RMSNorm, the score scale) are ``gemma2``'s docstring."""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import ClassVar

from torch import nn

from seqzoo.builder import LayerPlan, layer_plan
from seqzoo.errors import CheckpointError
from seqzoo.io.gguf.arch import layer_types
from seqzoo.io.hf import ffn_activation, first_problem, glu_ffn, kind_of, layer_pattern, special_ids
from seqzoo.io.hf.decoder import LLAMA_DEFAULTS, DecoderConverter
from seqzoo.io.hf.rope import rope_config, rope_problem, rope_spec

#: Gemma 2's four norms per layer: seqzoo name -> HF name under ``model.layers.i.``.
NORMS = {"mixer_norm": "input_layernorm", "mixer_out_norm": "post_attention_layernorm",
         "ffn_norm": "pre_feedforward_layernorm", "ffn_out_norm": "post_feedforward_layernorm"}
#: config.json's layer types and the names the recipe gives them.
TYPES = {"sliding_attention": "local", "full_attention": "global"}
TANH = "gelu_pytorch_tanh"
#: Gemma2Config's defaults.
GEMMA2_DEFAULTS = {**LLAMA_DEFAULTS, "vocab_size": 256000, "hidden_size": 2304,
                   "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
                   "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": TANH,
                   "max_position_embeddings": 8192, "tie_word_embeddings": True, "query_pre_attn_scalar": 256,
                   "sliding_window": 4096, "layer_types": None, "final_logit_softcapping": 30.0,
                   "attn_logit_softcapping": 50.0, "use_bidirectional_attention": None}




def difference(base: dict, spec: dict) -> dict:
    """The keys of ``spec`` whose values differ from ``base`` (a key one lacks counts as null)."""
    return {k: spec.get(k) for k in {**base, **spec} if spec.get(k) != base.get(k)}


def query_pre_attn_scalar(scale: float | None, head_dim: int) -> int | None:
    """The integer q with q^(-1/2) == scale exactly (transformers types it int), head_dim for the
    default scale, or None when there is no such q."""
    if scale is None:
        return head_dim
    q = round(scale ** -2)
    return q if q >= 1 and q ** -0.5 == scale else None


def _alike(plan: LayerPlan) -> LayerPlan:
    """A layer's plan without what may differ between Gemma's layer types (window, RoPE)."""
    return replace(plan, type=None, position={}, attention=replace(plan.attention, window=None))


class GemmaConverter(DecoderConverter):
    """Gemma's block; a family sets ``family`` (its defaults, its QK-norm) and these:"""

    ignored = (r"rotary_emb\.\w*inv_freq$",)
    #: One RoPE per layer type (Gemma 3), or one for all (Gemma 2).
    rope_per_type: ClassVar[bool] = False
    #: Whether config.json's attn_logit_softcapping is applied (Gemma 3's attention never does).
    attention_softcap: ClassVar[bool] = True
    #: Every n-th layer is global by default (Gemma 2: 2; Gemma 3: sliding_window_pattern, 6).
    period_key: ClassVar[str | None] = None

    # -- config.json -> recipe -----------------------------------------------------------------------
    def config(self, config: dict) -> dict:
        c = super().config(config)
        if c["use_bidirectional_attention"]:
            raise CheckpointError(f"config.json: use_bidirectional_attention={c['use_bidirectional_attention']} "
                                  f"is not supported (seqzoo's decoder_lm is causal)")
        return c

    def default_layer_types(self, c: dict) -> list[str]:
        period = (c.get(self.period_key) if self.period_key else None) or (6 if self.period_key else 2)
        return ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(c["num_hidden_layers"])]

    def hf_layer_types(self, c: dict) -> list[str]:
        types = c["layer_types"] or self.default_layer_types(c)
        n = c["num_hidden_layers"]
        if len(types) != n:
            raise CheckpointError(f"config.json: layer_types has {len(types)} entries for num_hidden_layers={n}")
        for kind in types:
            if kind not in TYPES:
                raise CheckpointError(f"config.json: layer_types entry {kind!r} is not supported; "
                                      f"{self.model_type} layers are {' or '.join(TYPES)}")
        return types

    def ropes(self, config: dict, c: dict) -> dict[str, dict]:
        """The rope spec of each HF layer type (Gemma 2: one for all)."""
        spec = rope_spec(config, c["head_dim"], c["max_position_embeddings"])
        return {kind: spec for kind in TYPES}

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        types = self.hf_layer_types(c)
        ropes = self.ropes(config, c)
        dim, heads, head_dim = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
        scalar = c["query_pre_attn_scalar"]
        attention = {"heads": heads, "kv_heads": c["num_key_value_heads"],
                     "score": "scaled_dot" if scalar == head_dim else {"kind": "scaled_dot", "scale": scalar ** -0.5},
                     "bias": c["attention_bias"], "out_bias": c["attention_bias"], "window": None,
                     "dropout": c["attention_dropout"],
                     "softcap": c["attn_logit_softcapping"] if self.attention_softcap else None}
        if head_dim * heads != dim:
            attention["head_dim"] = head_dim
        if self.family.qk_norm_scope is not None:
            attention.update(qk_norm={"kind": "gemma_rmsnorm", "eps": c["rms_norm_eps"]},
                             qk_norm_scope=self.family.qk_norm_scope)
        # The model's own parts are the global layers'; the local type says what differs.
        position = ropes["full_attention" if "full_attention" in types else "sliding_attention"]
        layer_types = {}
        for kind in sorted(set(types), key=list(TYPES).index):
            override = {}
            if kind == "sliding_attention" and c["sliding_window"] is not None:
                override["attention"] = {"window": c["sliding_window"]}
            if position != ropes[kind]:
                override["position"] = difference(position, ropes[kind])
            layer_types[TYPES[kind]] = override
        model = {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim,
            "layers": c["num_hidden_layers"], "max_seq_len": c["max_position_embeddings"], "position": position,
            "norm": {"kind": "gemma_rmsnorm", "eps": c["rms_norm_eps"]}, "placement": self.family.placement,
            "attention": attention, "ffn": glu_ffn(c["hidden_activation"], c["intermediate_size"], False),
            "tie_embeddings": c["tie_word_embeddings"], "scale_embeddings": True,
            "final_softcap": c["final_logit_softcapping"], "layer_types": layer_types,
            "pattern": layer_pattern([TYPES[kind] for kind in types]),
        }
        model["init_std"] = c["initializer_range"]
        return {"model": model}

    # -- model -> config.json ------------------------------------------------------------------------
    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        if plans[0].attention is None:
            return "model.attention is null; Gemma's attention layers need its settings"
        first, attn = plans[0], plans[0].attention
        act = ffn_activation(first.ffn, TANH)
        head_dim = attn.head_dim or m["dim"] // attn.heads
        scale = attn.score.get("scale") if isinstance(attn.score, dict) else None
        windows = {p.attention.window for p in plans} - {None}
        scope = self.family.qk_norm_scope
        problem = first_problem(
            (all(_alike(p) == _alike(first) for p in plans),
             f"model.layer_types: {self.model_type}'s layers differ only in their window"
             + (" and RoPE" if self.rope_per_type else "")),
            (first.mixer["kind"] == "attention", f"model.mixer is {first.mixer['kind']}; Gemma attends"),
            (first.residual == "sequential", f"model.residual is {first.residual}; Gemma's is sequential"),
            (first.placement == "sandwich", f"model.placement is {first.placement}, needs sandwich"),
            (kind_of(first.norm) == "gemma_rmsnorm", f"model.norm is {kind_of(first.norm)}, needs gemma_rmsnorm"),
            (m["embed_norm"] is None, "model.embed_norm is set; Gemma has none"),
            (m["scale_embeddings"], "model.scale_embeddings is false; Gemma scales embeddings by √C"),
            (act is not None and act[1], "model.ffn must be gated with a Hugging Face activation (GeGLU)"),
            (not (first.ffn or {}).get("bias"), "model.ffn: Gemma's MLP has no biases"),
            (attn.out_bias in (None, attn.bias), "model.attention: Gemma has q/k/v and output biases alike"),
            (not attn.sinks, "model.attention.sinks is set; Gemma has none"),
            (not attn.output_gate, "model.attention.output_gate is set; Gemma has none"),
            (m["dim"] % attn.heads == 0,
             f"model.attention.heads={attn.heads} must divide model.dim={m['dim']} (transformers' Gemma config)"),
            (kind_of(attn.score) == "scaled_dot" and query_pre_attn_scalar(scale, head_dim) is not None,
             "model.attention.score must be scaled_dot with a scale of q^(-1/2) for an integer "
             "query_pre_attn_scalar q"),
            (self.attention_softcap or attn.softcap is None,
             f"model.attention.softcap is set; {self.model_type} has none"),
            (len(windows) <= 1, f"model.layer_types: local layers have windows {sorted(windows)}; Gemma has one"),
            (scope is None or (kind_of(attn.qk_norm) == "gemma_rmsnorm" and attn.qk_norm_scope == "head"
                               and attn.qk_norm.get("eps") == first.norm["eps"]),
             "model.attention.qk_norm must be a gemma_rmsnorm over each head with model.norm's eps"),
            (scope is not None or attn.qk_norm is None,
             f"model.attention.qk_norm is set; {self.model_type} has none"),
        )
        if problem:
            return problem
        for window in (None, *windows):
            positions = [p.position for p in plans if p.attention.window == window]
            if positions and any(p != positions[0] for p in positions):
                return "model.layer_types: layers with the same window use different positions"
            if positions and kind_of(positions[0]) != "rope":
                return f"model.position is {kind_of(positions[0])}, needs rope"
            problem = positions and rope_problem(positions[0], m["max_seq_len"], head_dim)
            if problem:
                return problem
        if not self.rope_per_type and any(p.position != first.position for p in plans):
            return f"model.layer_types: {self.model_type} has one RoPE for all layers"
        return None

    def rope_keys(self, positions: dict[str, dict], max_seq_len: int) -> dict:
        """config.json's rope keys for the position of each HF layer type."""
        return rope_config(next(iter(positions.values())), max_seq_len)

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        plans = layer_plan(m)
        attn, ffn = plans[0].attention, model.decoder.blocks[0].ffn
        block = model.decoder.blocks[0].mixer
        kinds = ["full_attention" if p.attention.window is None else "sliding_attention" for p in plans]
        positions = {kind: p.position for kind, p in zip(kinds, plans, strict=True)}
        scale = attn.score.get("scale") if isinstance(attn.score, dict) else None
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "intermediate_size": ffn.hidden,
                "num_hidden_layers": m["layers"], "num_attention_heads": block.heads,
                "num_key_value_heads": block.kv_heads, "head_dim": block.head_dim,
                "hidden_activation": ffn_activation(plans[0].ffn, TANH)[0],
                "max_position_embeddings": m["max_seq_len"], "rms_norm_eps": plans[0].norm["eps"],
                **self.rope_keys(positions, m["max_seq_len"]), "tie_word_embeddings": m["tie_embeddings"],
                "attention_bias": attn.bias, "attention_dropout": attn.dropout,
                "query_pre_attn_scalar": query_pre_attn_scalar(scale, block.head_dim),
                "sliding_window": max((p.attention.window or 0 for p in plans), default=0) or None,
                "layer_types": kinds, "attn_logit_softcapping": attn.softcap,
                "final_logit_softcapping": m["final_softcap"], "initializer_range": m["init_std"],
                **special_ids(model)}


# -- llama.cpp's gemma2 / gemma3 (GGUF) -----------------------------------------------------------
def gguf_scale_problem(config, wide_layers: int) -> str | None:
    """llama.cpp scales Gemma's logits by head_dim^(-1/2), or (C / H)^(-1/2) for the one release
    with ``wide_layers`` layers; it never reads query_pre_attn_scalar."""
    c = config["hidden_size"] // config["num_attention_heads"]
    scalar = c if config["num_hidden_layers"] == wide_layers else config["head_dim"]
    if config["query_pre_attn_scalar"] != scalar:
        return (f"llama.cpp scales this architecture's attention logits by {scalar}^(-1/2) (from its shape); this "
                f"model's query_pre_attn_scalar is {config['query_pre_attn_scalar']}")
    if config.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        return f"llama.cpp's Gemma uses the tanh GELU; this model's is {config['hidden_activation']}"
    return None


def gguf_gemma_config(get, wide_layers: int, default_period: int) -> dict:
    """The config.json keys of a Gemma GGUF that are not plain metadata keys."""
    layers, heads, dim = get("block_count"), get("attention.head_count"), get("embedding_length")
    head_dim = get("attention.key_length", dim // heads)
    flags = get("attention.sliding_window_pattern")
    if flags is None or not isinstance(flags, list):  # a period: every period-th layer global
        period = flags or default_period
        flags = [(i + 1) % period != 0 for i in range(layers)]
    return {"layer_types": layer_types(flags), "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": dim // heads if layers == wide_layers else head_dim}
