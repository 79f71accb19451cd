"""BERT (Devlin et al., 2019) <-> ``encoder``: word + position + token-type embeddings, their
LayerNorm (``embed_norm``), post-norm blocks, and the pooler tanh(W h_[CLS] + b).

Checkpoints of ``BertModel`` are read as they are; those of task models (``BertForMaskedLM``, ...)
store the encoder under ``bert.``, and their heads have no place in seqzoo's encoder, so they are
reported as unexpected tensors rather than dropped.
"""
from __future__ import annotations

from collections.abc import Collection

from torch import nn

import seqzoo
from seqzoo.errors import CheckpointError
from seqzoo.io.hf import (
    HFConverter,
    Rule,
    copy,
    ffn_activation,
    first_problem,
    fused,
    kind_of,
    linear,
    mlp_ffn,
    norm,
    special_ids,
    uniform_problem,
)

DEFAULTS = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
            "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
            "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02,
            "layer_norm_eps": 1e-12, "position_embedding_type": "absolute"}


class BertConverter(HFConverter):
    """config.json keys: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
    hidden_act, max_position_embeddings, type_vocab_size, layer_norm_eps, *_dropout_prob. The
    pooler is imported when the checkpoint has one."""

    model_type = "bert"
    architecture = "BertModel"
    ignored = (r"embeddings\.position_ids$",)

    def canonical_names(self, names: Collection[str]) -> dict[str, str]:
        """Task models keep the encoder under ``bert.``; BertModel has no prefix."""
        if any(n.startswith("bert.") for n in names):
            return {n.removeprefix("bert."): n for n in names}
        return {n: n for n in names}

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = {**DEFAULTS, **config}
        for key, bad in (("is_decoder", True), ("add_cross_attention", True)):
            if c.get(key) == bad:
                raise CheckpointError(f"config.json: bert {key}: true is not supported (seqzoo's "
                                      f"encoder is bidirectional)")
        if c["position_embedding_type"] != "absolute":
            raise CheckpointError(f"config.json: bert position_embedding_type "
                                  f"{c['position_embedding_type']!r} is not supported; only 'absolute'")
        ln = {"kind": "layernorm", "eps": c["layer_norm_eps"]}
        return {"model": {
            "kind": "encoder", "vocab_size": c["vocab_size"], "dim": c["hidden_size"],
            "layers": c["num_hidden_layers"], "max_seq_len": c["max_position_embeddings"],
            "position": "learned", "norm": ln, "embed_norm": ln, "placement": "post",
            "attention": {"heads": c["num_attention_heads"], "score": "scaled_dot", "bias": True,
                          "dropout": c["attention_probs_dropout_prob"]},
            "ffn": mlp_ffn(c["hidden_act"], c["intermediate_size"], True),
            "type_vocab_size": c["type_vocab_size"], "pooler": "pooler.dense.weight" in names,
            "dropout": c["hidden_dropout_prob"], "init_std": c["initializer_range"],
        }}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        c = {**DEFAULTS, **config}
        dim = c["hidden_size"]
        rules = [copy("embed.weight", "embeddings.word_embeddings.weight"),
                 copy("encoder.position.table.weight", "embeddings.position_embeddings.weight")]
        if c["type_vocab_size"]:
            rules.append(copy("token_type.weight", "embeddings.token_type_embeddings.weight"))
        rules += norm("encoder.embed_norm", "embeddings.LayerNorm")
        for i in range(c["num_hidden_layers"]):
            h, b = f"encoder.layer.{i}.", f"encoder.blocks.{i}."
            for part in ("weight", "bias"):
                sources = tuple(f"{h}attention.self.{x}.{part}" for x in ("query", "key", "value"))
                rules.append(fused(f"{b}attn.qkv_proj.{part}", sources, (dim, dim, dim)))
            rules += linear(b + "attn.out_proj", h + "attention.output.dense", True)
            rules += norm(b + "attn_norm", h + "attention.output.LayerNorm")
            rules += linear(b + "ffn.up", h + "intermediate.dense", True)
            rules += linear(b + "ffn.down", h + "output.dense", True)
            rules += norm(b + "ffn_norm", h + "output.LayerNorm")
        if recipe["model"]["pooler"]:
            rules += linear("pooler", "pooler.dense", True)
        return rules

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "encoder":
            return f"model.kind is {m['kind']}, needs encoder"
        problem = uniform_problem(m)
        if problem:
            return problem
        attn, act = m["attention"], ffn_activation(m["ffn"], "gelu_new")
        return first_problem(
            (kind_of(m["position"]) == "learned", "model.position must be learned"),
            (kind_of(m["norm"]) == "layernorm" and m["norm"]["bias"], "model.norm must be a layernorm with bias"),
            (m["embed_norm"] == m["norm"], "model.embed_norm must equal model.norm (BERT's embeddings LayerNorm)"),
            (m["placement"] == "post", "model.placement must be post"),
            (act is not None and not act[1], "model.ffn must be an ungated MLP with a named activation"),
            (m["ffn"].get("bias", False), "model.ffn must have biases"),
            (attn["kv_heads"] in (None, attn["heads"]), "model.attention.kv_heads: BERT has no GQA"),
            (attn["head_dim"] in (None, m["dim"] // attn["heads"]),
             "model.attention.head_dim must be dim / heads"),
            (attn["bias"] and attn["out_bias"] in (None, True), "model.attention: BERT has biases everywhere"),
            (attn["window"] is None and attn["qk_norm"] is None, "model.attention: no window or qk_norm in BERT"),
            (attn["score"] == {"kind": "scaled_dot", "scale": None}, "model.attention.score must be scaled_dot"),
        )

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        act, _ = ffn_activation(m["ffn"], "gelu_new")
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "num_hidden_layers": m["layers"],
                "num_attention_heads": m["attention"]["heads"],
                "intermediate_size": model.encoder.blocks[0].ffn.hidden, "hidden_act": act,
                "max_position_embeddings": m["max_seq_len"], "type_vocab_size": m["type_vocab_size"],
                "layer_norm_eps": m["norm"]["eps"], "hidden_dropout_prob": m["dropout"],
                "attention_probs_dropout_prob": m["attention"]["dropout"],
                "initializer_range": m["init_std"], **special_ids(model)}


@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("converter", "bert", BertConverter,
                             summary="Hugging Face BERT <-> encoder (token types, pooler, post-norm)")]
