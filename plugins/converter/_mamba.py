"""What the Mamba-1 converters share (``mamba``, ``falcon_mamba``): the checkpoint's layout, its
config reader and its export. The family's notes (what is read, refused and ignored, and padding)
are ``mamba``'s docstring."""
from __future__ import annotations

import math
from collections.abc import Collection
from typing import ClassVar

from torch import nn

from seqzoo.errors import CheckpointError
from seqzoo.io.hf import CausalLMConverter, Rule, copy, first_problem, kind_of, linear, norm, special_ids
from seqzoo.io.hf.config import HFConfig

# MambaConfig's defaults (transformers 5).
DEFAULTS = {"vocab_size": 50280, "hidden_size": 768, "state_size": 16, "num_hidden_layers": 32,
            "layer_norm_epsilon": 1e-5, "expand": 2, "conv_kernel": 4, "use_bias": False, "use_conv_bias": True,
            "hidden_act": "silu", "initializer_range": 0.1, "time_step_rank": "auto", "time_step_min": 0.001,
            "time_step_max": 0.1, "tie_word_embeddings": True}
#: No position table limits the length; the number only names a length for tools that want one.
MAX_SEQ_LEN = 1 << 20


class MambaLayout(CausalLMConverter):
    """config.json keys: hidden_size, intermediate_size (or expand), state_size, conv_kernel,
    time_step_rank, use_bias, use_conv_bias, hidden_act (silu), layer_norm_epsilon,
    num_hidden_layers, tie_word_embeddings, time_step_min/max."""

    model_type = "mamba"
    architecture = "MambaForCausalLM"
    base_prefix = "backbone."
    embedding = "backbone.embeddings.weight"
    defaults: ClassVar[dict] = DEFAULTS
    #: The config key of the weightless RMS norm of Δ, B and C (the mixer's ``bcdt_norm_eps``), or
    #: None for a family without it.
    mixer_norm: ClassVar[str | None] = None

    def config(self, config: dict) -> dict:
        """The config with defaults, E as ``intermediate_size`` and R as ``time_step_rank``, checked."""
        c = HFConfig(config, self.defaults)
        hidden = c.positive_int("hidden_size")
        if c["hidden_act"] not in ("silu", "swish"):
            raise CheckpointError(f"config.json: hidden_act {c['hidden_act']!r} is not supported; seqzoo's mamba "
                                  f"mixer applies SiLU after the conv (silu)")
        if c.get("intermediate_size") is None:
            c["intermediate_size"] = int(c.positive_int("expand") * hidden)
        inner = c.positive_int("intermediate_size")
        if inner % hidden:
            raise CheckpointError(f"config.json: intermediate_size {inner} is not supported; seqzoo's mamba mixer "
                                  f"is a whole multiple (expand) of hidden_size {hidden} wide")
        if c["time_step_rank"] == "auto":
            c["time_step_rank"] = math.ceil(hidden / 16)
        for key in ("state_size", "conv_kernel", "time_step_rank", "num_hidden_layers", "vocab_size"):
            c.positive_int(key)
        for key in ("use_bias", "use_conv_bias", "tie_word_embeddings"):
            c.flag(key)
        if self.mixer_norm is not None:
            c.positive_number(self.mixer_norm)
        return c

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        dim = c["hidden_size"]
        mixer = {"kind": "mamba", "state": c["state_size"], "conv": c["conv_kernel"],
                 "expand": c["intermediate_size"] // dim, "dt_rank": c["time_step_rank"], "bias": c["use_bias"],
                 "conv_bias": c["use_conv_bias"], "dt_min": c["time_step_min"], "dt_max": c["time_step_max"]}
        if self.mixer_norm is not None:
            mixer["bcdt_norm_eps"] = c[self.mixer_norm]
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": c["num_hidden_layers"],
            "max_seq_len": MAX_SEQ_LEN, "position": "none",
            "norm": {"kind": "rmsnorm", "eps": c["layer_norm_epsilon"]}, "placement": "pre",
            "attention": {"heads": 1},  # unused: no layer attends
            "mixer": mixer, "ffn": None,
            "tie_embeddings": c["tie_word_embeddings"], "init_std": c["initializer_range"],
        }}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        c = self.config(config)
        rules = []
        for i in range(c["num_hidden_layers"]):
            b, h = f"decoder.blocks.{i}.", f"backbone.layers.{i}."
            rules += norm(b + "mixer_norm", h + "norm", False)
            rules += [copy(f"{b}mixer.{p}", f"{h}mixer.{p}") for p in ("A_log", "D")]
            for part, bias in (("in_proj", c["use_bias"]), ("conv1d", c["use_conv_bias"]), ("x_proj", False),
                               ("dt_proj", True), ("out_proj", c["use_bias"])):
                rules += linear(f"{b}mixer.{part}", f"{h}mixer.{part}", bias)
        return rules + self.ends(recipe, "backbone.norm_f", False)

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        mixer = m.get("mixer") or {}
        eps = mixer.get("bcdt_norm_eps")
        return first_problem(
            (m.get("pattern") is None and not m.get("layer_overrides"),
             f"model.pattern: layers differ; {self.model_type}'s layers are all alike"),
            (kind_of(mixer) == "mamba", f"model.mixer is {kind_of(mixer)}, needs mamba"),
            (self.mixer_norm is not None or eps is None,
             "model.mixer.bcdt_norm_eps is set; Mamba has no norm of Δ, B and C (Falcon-Mamba has)"),
            (self.mixer_norm is None or eps is not None,
             f"model.mixer.bcdt_norm_eps is null; {self.model_type} normalises Δ, B and C (that is Mamba)"),
            (m["ffn"] is None, f"model.ffn is {kind_of(m['ffn'])}; {self.model_type}'s layers have no FFN"),
            (kind_of(m["position"]) == "none", f"model.position is {kind_of(m['position'])}, needs none"),
            (kind_of(m["norm"]) == "rmsnorm", f"model.norm is {kind_of(m['norm'])}, needs rmsnorm"),
            (m["placement"] == "pre", f"model.placement is {m['placement']}, needs pre"),
            (m.get("residual", "sequential") == "sequential",
             f"model.residual is {m.get('residual')}, needs sequential"),
            (m["embed_norm"] is None, f"model.embed_norm is set; {self.model_type} has none"),
            (not m["scale_embeddings"], f"model.scale_embeddings is true; {self.model_type} has none"),
            (m.get("final_softcap") is None, f"model.final_softcap is set; {self.model_type} has none"),
        )

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        spec, mixer = m["mixer"], model.decoder.blocks[0].mixer
        config = {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "num_hidden_layers": m["layers"],
                  "state_size": spec["state"], "expand": spec["expand"], "intermediate_size": mixer.inner,
                  "conv_kernel": spec["conv"], "time_step_rank": mixer.dt_rank, "use_bias": spec["bias"],
                  "use_conv_bias": spec["conv_bias"], "hidden_act": "silu", "layer_norm_epsilon": m["norm"]["eps"],
                  "residual_in_fp32": True, "time_step_min": spec["dt_min"], "time_step_max": spec["dt_max"],
                  "tie_word_embeddings": m["tie_embeddings"], "initializer_range": m["init_std"],
                  "use_mambapy": False, **special_ids(model)}
        if self.mixer_norm is not None:
            config[self.mixer_norm] = spec["bcdt_norm_eps"]
        return config


def mamba_gguf(dt_b_c_rms: bool):
    """llama.cpp's mamba: A as −exp(A_log), the conv kernel squeezed, an expansion of 2, no
    in/out projection biases; ``dt_b_c_rms`` tells Falcon-Mamba's file from Mamba's."""
    from seqzoo.io.gguf import GGUFArch, Key, Transform
    from seqzoo.io.gguf.arch import a_from_log, conv_squeezed

    def problem(config) -> str | None:
        if config["intermediate_size"] != 2 * config["hidden_size"]:
            return (f"llama.cpp's mamba needs an inner width of 2 × hidden size; this model's is "
                    f"{config['intermediate_size']}")
        if config.get("use_bias") or not config.get("use_conv_bias", True):
            return "llama.cpp's mamba has projections without biases and a conv with one; this model differs"
        if dt_b_c_rms and config.get("mixer_rms_eps") != config["layer_norm_epsilon"]:
            return (f"llama.cpp normalises Δ, B and C with the layers' eps {config['layer_norm_epsilon']}; "
                    f"this model's "
                    f"mixer_rms_eps is {config.get('mixer_rms_eps')}")
        return None

    keys = (Key("block_count", "num_hidden_layers"), Key("embedding_length", "hidden_size"),
            Key("ssm.conv_kernel", "conv_kernel"), Key("ssm.inner_size", "intermediate_size"),
            Key("ssm.state_size", "state_size"), Key("ssm.time_step_rank", "time_step_rank"),
            Key("attention.layer_norm_rms_epsilon", "layer_norm_epsilon", "f32"))
    return GGUFArch("mamba", keys=keys, rope=False, problem=problem,
                    transforms=(Transform(r"A_log$", a_from_log), Transform(r"conv1d\.weight$", conv_squeezed)),
                    fixed={"context_length": 1 << 20, "feed_forward_length": 0, "attention.head_count": 0,
                           "ssm.dt_b_c_rms": dt_b_c_rms},
                    config=lambda get: {"use_bias": False, "use_conv_bias": True,
                                        "expand": get("ssm.inner_size") // get("embedding_length"),
                                        **({"mixer_rms_eps": get("attention.layer_norm_rms_epsilon")}
                                           if dt_b_c_rms else {})},
                    imports=lambda get: bool(get("ssm.dt_b_c_rms")) == dt_b_c_rms)
