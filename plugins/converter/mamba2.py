"""Mamba-2 (Dao & Gu, 2024) <-> ``decoder_lm``: a stack of state-space-dual mixers with no FFN,
pre-norm RMSNorm, no position scheme (the scan orders the tokens).

Each HF ``Mamba2Block`` is x + mixer(RMSNorm(x)), seqzoo's ``mamba2`` mixer with ``ffn: null``. The
mixer's tensors keep their names and shapes: ``in_proj`` rows are [z (E) | xBC (E + 2GN) | Δ (H)]
in both, ``conv1d`` is the same depthwise Conv1d, and the gated norm normalises groups of E / G
(``MambaRMSNormGated(group_size = intermediate / n_groups)``). One ε, ``layer_norm_epsilon``, serves
the block norms, ``norm_f`` and the gated norm. ``time_step_limit`` other than (0, ∞) becomes
``dt_limit``; ``chunk_size`` becomes ``chunk`` (it only moves speed in exact arithmetic).

Two places where seqzoo knowingly differs from transformers' PyTorch path, both outside float32
parity of the plain forward:

- a finite ``time_step_limit`` clamps Δ in seqzoo's decode step too; transformers clamps it in the
  chunked scan only (``mamba2_selective_state_update`` ignores it, as mamba_ssm's step does), so its
  cached decoding disagrees with its own full forward, and seqzoo follows the full forward;
- with ``use_bias``, transformers zeroes padding *before* ``in_proj``, so a pad position's conv input
  is the bias, which its convolution carries into the first real tokens; seqzoo zeroes the conv input
  itself, so a left-padded row equals the row alone (without biases the two agree).

``residual_in_fp32`` (the residual stream in float32 under half precision) is read and ignored:
seqzoo keeps the residual in the run's dtype, the same thing in float32; exports write false.
"""
from __future__ import annotations

from collections.abc import Collection

from torch import nn

from seqzoo.builder import layer_plan
from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import GGUFArch, Key, Transform
from seqzoo.io.gguf.arch import grouped_norm
from seqzoo.io.hf import CausalLMConverter, Rule, first_problem, kind_of, norm, special_ids
from seqzoo.io.hf.config import HFConfig
from seqzoo.registry import builtin

from ._mamba2 import (
    GGUF_CONV,
    GGUF_PER_HEAD,
    GGUF_RENAMES,
    NAMES,
    NO_LIMIT,
    mixer_config,
    mixer_problem,
    mixer_rules,
    mixer_spec,
)

#: llama.cpp's mamba2 metadata: the SSM's heads are its "time step rank".
MAMBA2_KEYS = (Key("block_count", "num_hidden_layers"), Key("embedding_length", "hidden_size"),
               Key("ssm.conv_kernel", "conv_kernel"), Key("ssm.state_size", "state_size"),
               Key("ssm.group_count", "n_groups"), Key("ssm.time_step_rank", "num_heads"),
               Key("attention.layer_norm_rms_epsilon", "layer_norm_epsilon", "f32"))


#: transformers 5 writes ±inf and NaN in config.json as {"__float__": "Infinity"}.
@builtin("Hugging Face Mamba-2 <-> decoder_lm (SSD mixers, grouped B/C, gated norm)")
class Mamba2Converter(CausalLMConverter):
    """config.json keys: hidden_size, num_hidden_layers, num_heads, head_dim, state_size, n_groups,
    conv_kernel, expand, use_bias, use_conv_bias, hidden_act (silu), layer_norm_epsilon,
    time_step_limit, time_step_min/max (initial Δ), chunk_size, tie_word_embeddings,
    initializer_range; residual_in_fp32, rescale_prenorm_residual, time_step_floor and
    time_step_rank change nothing seqzoo computes."""

    model_type = "mamba2"
    architecture = "Mamba2ForCausalLM"
    base_prefix = "backbone."
    embedding = "backbone.embeddings.weight"
    defaults = {"vocab_size": 32768, "hidden_size": 4096, "num_hidden_layers": 64, "num_heads": 128,
                "head_dim": 64, "state_size": 128, "n_groups": 8, "conv_kernel": 4, "expand": 2,
                "use_bias": False, "use_conv_bias": True, "hidden_act": "silu", "layer_norm_epsilon": 1e-5,
                "time_step_limit": NO_LIMIT, "time_step_min": 0.001, "time_step_max": 0.1, "chunk_size": 256,
                "tie_word_embeddings": False, "initializer_range": 0.1}
    #: seqzoo has no position table; the state takes any length.
    max_seq_len = 1048576
    # llama.cpp's mamba2: A and D per head as columns, the gated norm per group, dt_bias as
    # dt_proj's bias, the conv kernel squeezed.
    gguf = GGUFArch("mamba2", keys=MAMBA2_KEYS, rope=False, renames=GGUF_RENAMES,
                    transforms=(GGUF_PER_HEAD, GGUF_CONV, Transform(r"mixer\.norm\.weight$", grouped_norm("n_groups"))),
                    fixed={"context_length": 1 << 20, "feed_forward_length": 0, "attention.head_count": 0},
                    export=lambda c: {"ssm.inner_size": c["num_heads"] * c["head_dim"]},
                    config=lambda get: {"head_dim": get("ssm.inner_size") // get("ssm.time_step_rank"),
                                        "expand": get("ssm.inner_size") // get("embedding_length"),
                                        "use_bias": False, "use_conv_bias": True},
                    problem=lambda c: None if not c.get("use_bias") and c.get("use_conv_bias", True) else
                    "llama.cpp's mamba2 has projections without biases and a conv with one; this model differs")

    def config(self, config: dict) -> dict:
        c = HFConfig(config, self.defaults)
        if c["hidden_act"] != "silu":
            raise CheckpointError(f"config.json: hidden_act {c['hidden_act']!r} is not supported for mamba2; "
                                  f"seqzoo's Mamba-2 mixer uses silu")
        return c

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        dim, eps = c["hidden_size"], c["layer_norm_epsilon"]
        mixer = mixer_spec(c, NAMES, dim, eps)
        mixer.update(dt_min=c["time_step_min"], dt_max=c["time_step_max"])
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": c["num_hidden_layers"],
            "max_seq_len": self.max_seq_len, "position": "none", "norm": {"kind": "rmsnorm", "eps": eps},
            "placement": "pre", "attention": {"heads": 1},  # unused: every layer is a Mamba-2 mixer
            "mixer": mixer, "ffn": None, "tie_embeddings": c["tie_word_embeddings"],
            "init_std": c["initializer_range"],
        }}

    def canonical_names(self, names: Collection[str]) -> dict[str, str]:
        # Mamba2Model's load hook reads older checkpoints' ``embedding.weight`` as ``embeddings.weight``.
        out = super().canonical_names(names)
        return {k.replace(".embedding.", ".embeddings.") if k.endswith("embedding.weight") else k: v
                for k, v in out.items()}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        spec = recipe["model"]["mixer"]
        rules = []
        for i in range(recipe["model"]["layers"]):
            b, h = f"decoder.blocks.{i}.", f"backbone.layers.{i}."
            rules += norm(b + "mixer_norm", h + "norm", False) + mixer_rules(b + "mixer.", h + "mixer.", spec)
        return rules + self.ends(recipe, "backbone.norm_f", False)

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "decoder_lm":
            return f"model.kind is {m['kind']}, needs decoder_lm"
        plans = layer_plan(m)
        first = plans[0]
        return first_problem(
            (all(p == first for p in plans), "model.pattern: layers differ; Mamba-2's layers are all alike"),
            (first.mixer["kind"] == "mamba2", f"model.mixer is {first.mixer['kind']}, needs mamba2"),
            (first.ffn is None, "model.ffn is set; a Mamba-2 layer has no FFN (ffn: null)"),
            (kind_of(first.position) == "none", f"model.position is {kind_of(first.position)}, needs none"),
            (kind_of(first.norm) == "rmsnorm", f"model.norm is {kind_of(first.norm)}, needs rmsnorm"),
            (first.placement == "pre", f"model.placement is {first.placement}, needs pre"),
            (first.residual == "sequential", f"model.residual is {first.residual}, needs sequential"),
            (first.mixer_norm, "model.layer_types: mixer_norm false; every Mamba-2 block has its norm"),
            (m["embed_norm"] is None, "model.embed_norm is set; Mamba-2 has none"),
            (not m["scale_embeddings"], "model.scale_embeddings is true; Mamba-2 has none"),
            (m["final_softcap"] is None, "model.final_softcap is set; Mamba-2 has none"),
        ) or mixer_problem(first.mixer, first.norm["eps"], "Mamba-2")

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        spec = layer_plan(m)[0].mixer
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "num_hidden_layers": m["layers"],
                **mixer_config(spec, NAMES, m["dim"]), "hidden_act": "silu", "layer_norm_epsilon": m["norm"]["eps"],
                "time_step_min": spec["dt_min"], "time_step_max": spec["dt_max"],
                "residual_in_fp32": False, "tie_word_embeddings": m["tie_embeddings"],
                "initializer_range": m["init_std"], **special_ids(model)}
