"""LLaMA (Touvron et al., 2023) <-> ``decoder_lm``: RoPE (rotate-half), RMSNorm, SwiGLU, GQA.

HF's separate q/k/v projections are stacked into seqzoo's fused [q (H·D) | k (K·D) | v (K·D)];
its RoPE configuration is read and written by ``_rope``. Mistral, Qwen2/3, OLMo 2, SmolLM3, Phi-3
and Gemma subclass this converter and change what differs.
"""
from __future__ import annotations

from collections.abc import Collection

from torch import nn

from seqzoo.io.hf import (
    CausalLMConverter,
    Rule,
    decoder_problem,
    ffn_activation,
    first_problem,
    fused,
    glu_ffn,
    kind_of,
    linear,
    renamed,
    special_ids,
)
from seqzoo.registry import builtin

from ._rope import SCALINGS, rope_config, rope_problem, rope_spec


@builtin("Hugging Face LLaMA <-> decoder_lm (RoPE scalings, GQA, biases)")
class LlamaConverter(CausalLMConverter):
    """config.json keys: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    num_key_value_heads, head_dim, hidden_act, max_position_embeddings, rms_norm_eps,
    rope_parameters (or rope_theta + rope_scaling), tie_word_embeddings, attention_bias, mlp_bias."""

    model_type = "llama"
    architecture = "LlamaForCausalLM"
    base_prefix = "model."
    embedding = "model.embed_tokens.weight"
    ignored = (r"rotary_emb\.inv_freq$",)
    defaults = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
                "head_dim": None, "hidden_act": "silu", "max_position_embeddings": 2048,
                "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
                "mlp_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02}

    #: Where the family's norms sit (``placement``) and its QK-norm's scope, if it has one.
    placement: str = "pre"
    qk_norm_scope: str | None = None
    #: Each layer's norms, seqzoo name -> HF name under ``model.layers.i.`` (their places follow
    #: ``placement``); a QK-norm's ``self_attn.q_norm`` / ``k_norm`` come with ``qk_norm_scope``.
    norms: dict[str, str] = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    #: The rope_types the family reads, and whether it rotates part of each head (Phi-3).
    scalings: tuple[str, ...] = SCALINGS
    partial_rotary: bool = False

    # -- what differs between LLaMA, Mistral, Qwen2/3 and OLMo 2 ----------------------------------
    def biases(self, c: dict) -> tuple[bool, bool, bool]:
        """(q/k/v bias, o_proj bias, MLP bias)."""
        return c["attention_bias"], c["attention_bias"], c["mlp_bias"]

    def window(self, c: dict) -> int | None:
        return None

    def attention_problem(self, m: dict) -> str | None:
        attn = m["attention"]
        return first_problem(
            (attn["window"] is None, "model.attention.window: LLaMA has no sliding window (Mistral has)"),
            (attn["out_bias"] in (None, attn["bias"]),
             "model.attention: q/k/v and output biases differ (Qwen2 has that)"),
        )

    def family_config(self, model: nn.Module) -> dict:
        m = self.export_view(model.recipe)["model"]
        return {"attention_bias": m["attention"]["bias"], "mlp_bias": m["ffn"]["bias"],
                "pretraining_tp": 1}

    def export_view(self, recipe: dict) -> dict:
        """The recipe the family's checks and config read: the model's own. (A mixture-of-experts
        family shows a uniform stack whose FFN is the dense one its layers are built from.)"""
        return recipe

    # -- the converter interface -------------------------------------------------------------------
    def config(self, config: dict) -> dict:
        c = {**self.defaults, **config}
        c["num_key_value_heads"] = c["num_key_value_heads"] or c["num_attention_heads"]
        c["head_dim"] = c["head_dim"] or c["hidden_size"] // c["num_attention_heads"]
        return c

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        dim, heads = c["hidden_size"], c["num_attention_heads"]
        qkv_bias, out_bias, mlp_bias = self.biases(c)
        attention = {"heads": heads, "kv_heads": c["num_key_value_heads"], "score": "scaled_dot",
                     "bias": qkv_bias, "out_bias": out_bias, "window": self.window(c),
                     "dropout": c["attention_dropout"]}
        if c["head_dim"] * heads != dim:
            attention["head_dim"] = c["head_dim"]
        if self.qk_norm_scope is not None:
            attention.update(qk_norm={"kind": "rmsnorm", "eps": c["rms_norm_eps"]}, qk_norm_scope=self.qk_norm_scope)
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim,
            "layers": c["num_hidden_layers"], "max_seq_len": c["max_position_embeddings"],
            "position": rope_spec(config, c["head_dim"], c["max_position_embeddings"],
                                  scalings=self.scalings, partial=self.partial_rotary),
            "norm": {"kind": "rmsnorm", "eps": c["rms_norm_eps"]}, "placement": self.placement,
            "attention": attention, "ffn": glu_ffn(c["hidden_act"], c["intermediate_size"], mlp_bias),
            "tie_embeddings": c["tie_word_embeddings"], "init_std": c["initializer_range"],
        }}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        c = self.config(config)
        qkv_bias, out_bias, mlp_bias = self.biases(c)
        q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
        rules = []
        for i in range(c["num_hidden_layers"]):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            rules += renamed(b, h, self.norms, False)
            if self.qk_norm_scope is not None:
                rules += renamed(b, h, {"attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm"}, False)
            for part in ("weight", "bias") if qkv_bias else ("weight",):
                sources = tuple(f"{h}self_attn.{x}_proj.{part}" for x in "qkv")
                rules.append(fused(f"{b}attn.qkv_proj.{part}", sources, (q, kv, kv)))
            rules += linear(b + "attn.out_proj", h + "self_attn.o_proj", out_bias)
            rules += renamed(b, h, {"ffn.gate": "mlp.gate_proj", "ffn.up": "mlp.up_proj", "ffn.down": "mlp.down_proj"},
                             mlp_bias)
        return rules + self.ends(recipe, "model.norm", False)

    def accepts(self, recipe: dict) -> str | None:
        m = self.export_view(recipe)["model"]
        scope = self.qk_norm_scope
        problem = decoder_problem(m, position="rope", norm="rmsnorm", ffn_gated=True,
                                  tanh_name="gelu_pytorch_tanh", qk_norm=scope is not None,
                                  placement=self.placement)
        if problem:
            return problem
        attn = m["attention"]
        head_dim = attn["head_dim"] or m["dim"] // attn["heads"]
        return first_problem(
            (kind_of(attn["score"]) == "scaled_dot" and attn["score"].get("scale") is None,
             "model.attention.score must be scaled_dot with the default scale"),
            (m["embed_norm"] is None, f"model.embed_norm is set; {self.model_type} has none"),
            (scope is None or (kind_of(attn["qk_norm"]) == "rmsnorm" and attn["qk_norm_scope"] == scope
                               and attn["qk_norm"].get("eps") == m["norm"]["eps"]),
             f"model.attention.qk_norm must be an rmsnorm over each {scope} with model.norm's eps"),
        ) or rope_problem(m["position"], m["max_seq_len"], head_dim, scalings=self.scalings,
                          partial=self.partial_rotary) or self.attention_problem(m)

    def hf_config(self, model: nn.Module) -> dict:
        m = self.export_view(model.recipe)["model"]
        attn = model.decoder.blocks[0].attn
        act, _ = ffn_activation(m["ffn"], "gelu_pytorch_tanh")
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"],
                "intermediate_size": m["ffn"].get("hidden") or model.decoder.blocks[0].ffn.hidden,
                "num_hidden_layers": m["layers"], "num_attention_heads": attn.heads,
                "num_key_value_heads": attn.kv_heads, "head_dim": attn.head_dim, "hidden_act": act,
                "max_position_embeddings": m["max_seq_len"], "rms_norm_eps": m["norm"]["eps"],
                **rope_config(m["position"], m["max_seq_len"]),
                "tie_word_embeddings": m["tie_embeddings"],
                "attention_dropout": m["attention"]["dropout"], "initializer_range": m["init_std"],
                **self.family_config(model), **special_ids(model)}
