"""The LLaMA-like decoder families as data: ``DecoderFamily`` says what one family's config.json
and weights look like (name maps, flags, config keys); ``DecoderConverter`` does the rest.

LLaMA's layout — RoPE, RMSNorm, a SwiGLU MLP, separate q/k/v/o projections, GQA — is the one most
2023–2026 decoders share. A family that differs only in data is a short declarative file:

    @builtin("Hugging Face Mistral <-> decoder_lm (sliding window)")
    class MistralConverter(DecoderConverter):
        family = DecoderFamily(
            "mistral", "MistralForCausalLM", "Mistral",
            defaults={**LLAMA_DEFAULTS, "intermediate_size": 14336, "sliding_window": 4096},
            window="sliding_window", window_required=True)

Code stays only for what really differs (Qwen2's per-layer window rule, Phi-3's fused
projections, Gemma's layer types): override a method of ``DecoderConverter``.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import nn

from .activations import ffn_activation, glu_ffn, kind_of
from .checks import decoder_problem, first_problem
from .config import HFConfig
from .converter import CausalLMConverter, special_ids
from .rope import SCALINGS, rope_config, rope_problem, rope_spec
from .rules import Rule, fused, linear, renamed

#: LlamaConfig's defaults: the base most families' defaults extend.
LLAMA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "mlp_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02}
#: Each layer's norms before the attention and the MLP: seqzoo name -> HF name under ``model.layers.i.``.
PRE_NORMS = {"mixer_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
#: The MLP's projections: seqzoo name -> HF name.
MLP = {"ffn.gate": "mlp.gate_proj", "ffn.up": "mlp.up_proj", "ffn.down": "mlp.down_proj"}


@dataclass(frozen=True)
class DecoderFamily:
    """One LLaMA-like family, as data.

    A bias is ``True``/``False`` when the family fixes it, or the config key that holds it
    (LLaMA's ``attention_bias`` serves q/k/v and o alike). ``window``: the config key of one
    sliding window for every layer (Mistral's ``sliding_window``), or None for none;
    ``window_required``: a model without a window is another family. ``placement`` and ``norms``:
    where each layer's norms sit and their HF names; ``qk_norm_scope``: ``head`` (Qwen3) or
    ``projection`` (OLMo 2) for a family with a QK RMSNorm. ``scalings``: the rope_types the
    family's transformers class reads; ``partial_rotary``: it may rotate part of each head.
    ``export_keys``: constant keys its exported config.json carries (LLaMA's pretraining_tp).
    ``named_only``: exported only when named, or when no other family fits.
    """

    model_type: str
    architecture: str
    name: str  # in messages: "LLaMA", "Qwen2"
    defaults: Mapping[str, Any] = field(default_factory=lambda: LLAMA_DEFAULTS)
    qkv_bias: bool | str = "attention_bias"
    out_bias: bool | str = "attention_bias"
    mlp_bias: bool | str = False
    window: str | None = None
    window_required: bool = False
    placement: str = "pre"
    norms: Mapping[str, str] = field(default_factory=lambda: PRE_NORMS)
    qk_norm_scope: str | None = None
    scalings: tuple[str, ...] = SCALINGS
    partial_rotary: bool = False
    export_keys: Mapping[str, Any] = field(default_factory=dict)
    named_only: bool = False


class DecoderConverter(CausalLMConverter):
    """A LLaMA-like family's converter, driven by its ``family``. Subclasses set ``family`` and
    override only what their data cannot say."""

    family: ClassVar[DecoderFamily]
    base_prefix = "model."
    embedding = "model.embed_tokens.weight"
    ignored = (r"rotary_emb\.inv_freq$",)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "family" in cls.__dict__:  # the registry and export read these class attributes
            cls.model_type, cls.architecture = cls.family.model_type, cls.family.architecture
            cls.named_only = cls.family.named_only

    # -- what the data says -------------------------------------------------------------------------
    def config(self, config: dict) -> HFConfig:
        c = HFConfig(config, self.family.defaults)
        c["num_key_value_heads"] = c["num_key_value_heads"] or c["num_attention_heads"]
        c["head_dim"] = c["head_dim"] or c["hidden_size"] // c["num_attention_heads"]
        return c

    def biases(self, c: Mapping) -> tuple[bool, bool, bool]:
        """(q/k/v bias, o_proj bias, MLP bias) of a config."""
        f = self.family
        return tuple(value if isinstance(value, bool) else bool(c[value])
                     for value in (f.qkv_bias, f.out_bias, f.mlp_bias))

    def window(self, c: Mapping) -> int | None:
        """The sliding window every layer has, or None."""
        return c[self.family.window] if self.family.window is not None else None

    def attention_problem(self, m: dict) -> str | None:
        """Why the model's attention, MLP biases and window are not this family's, or None."""
        f, attn = self.family, m["attention"]
        out = attn["bias"] if attn["out_bias"] is None else attn["out_bias"]
        if f.window is None:
            window = (attn["window"] is None, f"model.attention.window: {f.name} has no sliding window")
        else:
            window = (attn["window"] is not None or not f.window_required,
                      "model.attention.window is null; a family without one fits that model")
        return first_problem(
            window,
            (_fits(f.qkv_bias, attn["bias"]) and _fits(f.out_bias, out)
             and (f.out_bias != f.qkv_bias or isinstance(f.qkv_bias, bool) or out == attn["bias"]),
             f"model.attention: {f.name} has {_bias_words(f)}"),
            (_fits(f.mlp_bias, m["ffn"]["bias"]), f"model.ffn: {f.name}'s MLP has "
                                                  f"{'biases' if f.mlp_bias is True else 'no biases'}"),
        )

    def family_config(self, model: nn.Module) -> dict:
        """The config.json keys the family's data adds: biases and the window under their keys."""
        f, m = self.family, self.export_view(model.recipe)["model"]
        attn = m["attention"]
        written = {f.qkv_bias: attn["bias"], f.out_bias: attn["bias"] if attn["out_bias"] is None
                   else attn["out_bias"], f.mlp_bias: m["ffn"]["bias"]}
        keys = {key: value for key, value in written.items() if isinstance(key, str)}
        if f.window is not None:
            keys[f.window] = attn["window"]
        return {**keys, **f.export_keys}

    def export_view(self, recipe: dict) -> dict:
        """The recipe the family's checks and config read: the model's own. (A mixture-of-experts
        family shows a uniform stack whose FFN is the dense one its layers are built from.)"""
        return recipe

    # -- the converter interface -------------------------------------------------------------------
    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        f, c = self.family, self.config(config)
        dim, heads = c["hidden_size"], c["num_attention_heads"]
        qkv_bias, out_bias, mlp_bias = self.biases(c)
        attention = {"heads": heads, "kv_heads": c["num_key_value_heads"], "score": "scaled_dot",
                     "bias": qkv_bias, "out_bias": out_bias, "window": self.window(c),
                     "dropout": c["attention_dropout"]}
        if c["head_dim"] * heads != dim:
            attention["head_dim"] = c["head_dim"]
        if f.qk_norm_scope is not None:
            attention.update(qk_norm={"kind": "rmsnorm", "eps": c["rms_norm_eps"]}, qk_norm_scope=f.qk_norm_scope)
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim,
            "layers": c["num_hidden_layers"], "max_seq_len": c["max_position_embeddings"],
            "position": rope_spec(config, c["head_dim"], c["max_position_embeddings"],
                                  scalings=f.scalings, partial=f.partial_rotary),
            "norm": {"kind": "rmsnorm", "eps": c["rms_norm_eps"]}, "placement": f.placement,
            "attention": attention, "ffn": glu_ffn(c["hidden_act"], c["intermediate_size"], mlp_bias),
            "tie_embeddings": c["tie_word_embeddings"], "init_std": c["initializer_range"],
        }}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        f, c = self.family, self.config(config)
        qkv_bias, out_bias, mlp_bias = self.biases(c)
        q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
        rules = []
        for i in range(c["num_hidden_layers"]):
            b, h = f"decoder.blocks.{i}.", f"model.layers.{i}."
            rules += renamed(b, h, f.norms, False)
            if f.qk_norm_scope is not None:
                rules += renamed(b, h, {"mixer.q_norm": "self_attn.q_norm", "mixer.k_norm": "self_attn.k_norm"}, False)
            for part in ("weight", "bias") if qkv_bias else ("weight",):
                sources = tuple(f"{h}self_attn.{x}_proj.{part}" for x in "qkv")
                rules.append(fused(f"{b}mixer.qkv_proj.{part}", sources, (q, kv, kv)))
            rules += linear(b + "mixer.out_proj", h + "self_attn.o_proj", out_bias)
            rules += self.mlp_rules(b, h, mlp_bias)
        return rules + self.ends(recipe, "model.norm", False)

    def mlp_rules(self, ours: str, theirs: str, bias: bool) -> list[Rule]:
        """One layer's MLP (``ours``/``theirs``: the layer's prefixes)."""
        return renamed(ours, theirs, MLP, bias)

    def accepts(self, recipe: dict) -> str | None:
        f, m = self.family, self.export_view(recipe)["model"]
        scope = f.qk_norm_scope
        problem = decoder_problem(m, position="rope", norm="rmsnorm", ffn_gated=True,
                                  tanh_name="gelu_pytorch_tanh", qk_norm=scope is not None, placement=f.placement)
        if problem:
            return problem
        attn = m["attention"]
        head_dim = attn["head_dim"] or m["dim"] // attn["heads"]
        return first_problem(
            (kind_of(attn["score"]) == "scaled_dot" and attn["score"].get("scale") is None,
             "model.attention.score must be scaled_dot with the default scale"),
            (m["embed_norm"] is None, f"model.embed_norm is set; {f.model_type} has none"),
            (scope is None or (kind_of(attn["qk_norm"]) == "rmsnorm" and attn["qk_norm_scope"] == scope
                               and attn["qk_norm"].get("eps") == m["norm"]["eps"]),
             f"model.attention.qk_norm must be an rmsnorm over each {scope} with model.norm's eps"),
        ) or rope_problem(m["position"], m["max_seq_len"], head_dim, scalings=f.scalings,
                          partial=f.partial_rotary) or self.attention_problem(m)

    def hf_config(self, model: nn.Module) -> dict:
        m = self.export_view(model.recipe)["model"]
        attn = model.decoder.blocks[0].mixer
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


def _fits(fixed: bool | str, value: bool) -> bool:
    """A model's bias fits a family's: any value when the family reads it from a key."""
    return not isinstance(fixed, bool) or fixed == value


def _bias_words(f: DecoderFamily) -> str:
    """What a family's projection biases are, in words."""
    if isinstance(f.qkv_bias, bool) and isinstance(f.out_bias, bool):
        if f.qkv_bias == f.out_bias:
            return "biases on q/k/v and o" if f.qkv_bias else "no biases"
        return f"{'' if f.qkv_bias else 'no '}q/k/v biases and {'an' if f.out_bias else 'no'} output bias"
    return "q/k/v and output biases alike" if f.out_bias == f.qkv_bias else "q/k/v biases"
