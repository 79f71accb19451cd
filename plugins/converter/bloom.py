"""BLOOM (BigScience, 2022) <-> ``decoder_lm``: ALiBi, a LayerNorm right after the word embeddings
(``embed_norm``), tanh-GELU MLP, tied head.

BLOOM fuses q/k/v per head: the output of ``query_key_value`` is laid out [H, 3, D] (head-major),
while seqzoo's ``qkv_proj`` is [3, H, D] ([q | k | v]). The rows are reordered both ways. ALiBi
slopes and the key-position form of the bias (m_h·j instead of −m_h·(i − j)) give the same softmax.
"""
from __future__ import annotations

from collections.abc import Collection

from torch import nn

from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import GGUFArch, Key, Transform
from seqzoo.io.gguf.arch import interleaved_qkv
from seqzoo.io.hf import (
    CausalLMConverter,
    Rule,
    decoder_problem,
    first_problem,
    fused_per_head,
    kind_of,
    norm,
    plain_attention_problem,
    renamed,
    special_ids,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.registry import builtin

DEFAULTS = {"vocab_size": 250880, "hidden_size": 64, "n_layer": 2, "n_head": 8,
            "layer_norm_epsilon": 1e-5, "initializer_range": 0.02, "hidden_dropout": 0.0,
            "attention_dropout": 0.0, "apply_residual_connection_post_layernorm": False,
            "tie_word_embeddings": True, "seq_length": 2048}


def _config(config: dict) -> dict:
    c = HFConfig(config, DEFAULTS)
    c["hidden_size"] = c.get("n_embed") or c["hidden_size"]  # old configs say n_embed
    c["n_layer"] = config.get("num_hidden_layers", c["n_layer"])
    c["n_head"] = config.get("num_attention_heads", c["n_head"])
    return c


@builtin("Hugging Face BLOOM <-> decoder_lm (ALiBi, per-head fused qkv)")
class BloomConverter(CausalLMConverter):
    """config.json keys: hidden_size (or n_embed), n_layer, n_head, layer_norm_epsilon,
    hidden_dropout, attention_dropout, tie_word_embeddings. The MLP is 4·hidden_size wide."""

    model_type = "bloom"
    architecture = "BloomForCausalLM"
    base_prefix = "transformer."
    embedding = "transformer.word_embeddings.weight"
    # llama.cpp's bloom: ALiBi (max bias 8), q/k/v rows regrouped per projection, a 4·C MLP.
    gguf = GGUFArch("bloom", keys=(Key("block_count", "n_layer"), Key("context_length", "seq_length"),
                                   Key("embedding_length", "hidden_size"), Key("attention.head_count", "n_head"),
                                   Key("attention.head_count_kv", "n_head"),
                                   Key("attention.layer_norm_epsilon", "layer_norm_epsilon", "f32")),
                    rope=False, renames={r"^transformer\.": ""},
                    transforms=(Transform(r"query_key_value\.", interleaved_qkv("n_head")),),
                    export=lambda c: {"feed_forward_length": 4 * c["hidden_size"]},
                    config=lambda get: {"seq_length": get("context_length")})

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = _config(config)
        if c["apply_residual_connection_post_layernorm"]:
            raise CheckpointError("config.json: bloom apply_residual_connection_post_layernorm: true "
                                  "is not supported")
        dim, ln = c["hidden_size"], {"kind": "layernorm", "eps": c["layer_norm_epsilon"]}
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": c["n_layer"],
            "max_seq_len": c["seq_length"], "position": "alibi", "norm": ln, "embed_norm": ln,
            "placement": "pre",
            "attention": {"heads": c["n_head"], "score": "scaled_dot", "bias": True,
                          "dropout": c["attention_dropout"]},
            "ffn": {"kind": "gelu", "hidden": 4 * dim, "bias": True, "approximate": "tanh"},
            "tie_embeddings": c["tie_word_embeddings"], "dropout": c["hidden_dropout"],
            "init_std": c["initializer_range"],
        }}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        heads = recipe["model"]["attention"]["heads"]
        rules = norm("decoder.embed_norm", "transformer.word_embeddings_layernorm")
        for i in range(recipe["model"]["layers"]):
            b, h = f"decoder.blocks.{i}.", f"transformer.h.{i}."
            rules += renamed(b, h, {"mixer_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                                    "mixer.out_proj": "self_attention.dense", "ffn.up": "mlp.dense_h_to_4h",
                                    "ffn.down": "mlp.dense_4h_to_h"}, True)
            rules += [fused_per_head(f"{b}mixer.qkv_proj.{part}", f"{h}self_attention.query_key_value.{part}", heads)
                      for part in ("weight", "bias")]
        return rules + self.ends(recipe, "transformer.ln_f", True)

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        problem = decoder_problem(m, position="alibi", norm="layernorm", ffn_gated=False,
                                  tanh_name="gelu_new")
        if problem:
            return problem
        ffn = m["ffn"]
        return plain_attention_problem(m, "BLOOM", biases=True) or first_problem(
            (m["norm"]["bias"], "model.norm has no bias; BLOOM's LayerNorm has one"),
            (kind_of(m["embed_norm"]) == "layernorm", "model.embed_norm must be a layernorm (BLOOM)"),
            (m["embed_norm"] == m["norm"], "model.embed_norm must equal model.norm (BLOOM shares the eps)"),
            (m["attention"]["score"] == {"kind": "scaled_dot", "scale": None},
             "model.attention.score must be scaled_dot"),
            (ffn["kind"] == "gelu" and ffn["approximate"] == "tanh" and ffn["bias"],
             "model.ffn must be {kind: gelu, approximate: tanh} with biases (BLOOM's GELU)"),
            (ffn["hidden"] in (None, 4 * m["dim"]), "model.ffn.hidden must be 4·dim (BLOOM)"),
        )

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "n_layer": m["layers"],
                "n_head": m["attention"]["heads"], "layer_norm_epsilon": m["norm"]["eps"],
                "seq_length": m["max_seq_len"], "hidden_dropout": m["dropout"],
                "attention_dropout": m["attention"]["dropout"], "tie_word_embeddings": m["tie_embeddings"],
                "apply_residual_connection_post_layernorm": False, "pretraining_tp": 1,
                "slow_but_exact": False, "initializer_range": m["init_std"], **special_ids(model)}
