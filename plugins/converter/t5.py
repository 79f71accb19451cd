"""T5 (Raffel et al., 2020) <-> ``encoder_decoder``: relative position buckets, unscaled dot
scores, RMS-style norm, pre-norm blocks, ReLU (v1.0) or tanh-GEGLU (v1.1 "gated-gelu") FFN.

The bucket table lives in the first layer of each stack (``block.0 ... relative_attention_bias``)
and serves every layer: seqzoo's ``t5`` position scheme, one per stack (bidirectional in the
encoder, causal in the decoder). v1.0 ties the head to the embedding and scales the decoder output
by d_model^-1/2 first (``rescale_tied_head``); v1.1 has its own head and no scaling. A checkpoint
with its own ``lm_head.weight`` is imported untied; if its config still asks for the d_model^-1/2
scaling, the scale is folded into the head's weight.
"""
from __future__ import annotations

from collections.abc import Collection

from torch import nn

from seqzoo.io.gguf import GGUFArch, Key
from seqzoo.io.hf import (
    HFConverter,
    Rule,
    copy,
    ffn_activation,
    first_problem,
    fused,
    glu_ffn,
    kind_of,
    mlp_ffn,
    norm,
    plain_attention_problem,
    special_ids,
    uniform_problem,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.registry import builtin

DEFAULTS = {"vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6,
            "num_decoder_layers": None, "num_heads": 8, "relative_attention_num_buckets": 32,
            "relative_attention_max_distance": 128, "dropout_rate": 0.1, "layer_norm_epsilon": 1e-6,
            "feed_forward_proj": "relu", "pad_token_id": 0, "n_positions": 512}


def _config(config: dict) -> dict:
    c = HFConfig(config, DEFAULTS)
    c["num_decoder_layers"] = c["num_decoder_layers"] or c["num_layers"]
    parts = c["feed_forward_proj"].split("-")
    c["gated"] = len(parts) == 2 and parts[0] == "gated"
    c["act"] = "gelu_new" if c["feed_forward_proj"] == "gated-gelu" else parts[-1]  # as HF does
    scale = config.get("scale_decoder_outputs")
    # Before transformers 5, tie_word_embeddings: false (v1.1) was what turned the scaling off.
    c["scale"] = scale if scale is not None else config.get("tie_word_embeddings", True) is not False
    return c


#: llama.cpp's t5 keys (no max distance: its T5 hard-codes 128, see ``t5_gguf_problem``); without
#: ``decoder_block_count`` the decoder is as deep as the encoder.
T5_KEYS = (Key("block_count", "num_layers"), Key("decoder_block_count", "num_decoder_layers", optional=True),
           Key("context_length", "n_positions"), Key("embedding_length", "d_model"),
           Key("feed_forward_length", "d_ff"), Key("attention.head_count", "num_heads"),
           Key("attention.key_length", "d_kv"), Key("attention.value_length", "d_kv"),
           Key("attention.layer_norm_rms_epsilon", "layer_norm_epsilon", "f32"),
           Key("attention.layer_norm_epsilon", "layer_norm_epsilon", "f32"),  # llama.cpp's converter writes both
           Key("attention.relative_buckets_count", "relative_attention_num_buckets"),
           Key("decoder_start_token_id", "decoder_start_token_id", optional=True))


def t5_gguf_problem(config: dict) -> str | None:
    """What llama.cpp's t5 hard-codes: buckets up to a distance of 128, and the feed-forward by
    whether it has a gate (ReLU without one, tanh-GELU with one)."""
    if config["relative_attention_max_distance"] != 128:
        return (f"llama.cpp's t5 buckets relative positions up to a distance of 128; this model's max_distance is "
                f"{config['relative_attention_max_distance']}")
    if config["feed_forward_proj"] not in ("relu", "gated-gelu"):
        return (f"llama.cpp's t5 runs a ReLU feed-forward, or a tanh-GELU gated one; this model's is "
                f"{config['feed_forward_proj']}")
    return None


@builtin("Hugging Face T5 v1.0/v1.1 <-> encoder_decoder (relative buckets)")
class T5Converter(HFConverter):
    """config.json keys: d_model, d_kv, d_ff, num_layers, num_decoder_layers, num_heads,
    relative_attention_num_buckets, relative_attention_max_distance, feed_forward_proj,
    layer_norm_epsilon, dropout_rate, scale_decoder_outputs (or, older, tie_word_embeddings),
    decoder_start_token_id (default: pad_token_id)."""

    model_type = "t5"
    architecture = "T5ForConditionalGeneration"
    gguf = GGUFArch("t5", keys=T5_KEYS, rope=False, problem=t5_gguf_problem, scaled_head="scale_decoder_outputs",
                    config=lambda get: {"relative_attention_max_distance": 128, "is_encoder_decoder": True},
                    from_tensors=lambda names: {
                        "feed_forward_proj": "gated-gelu" if "enc.blk.0.ffn_gate.weight" in names else "relu"})

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = _config(config)
        # a checkpoint's tensors say whether its head is tied (transformers' T5 configs may not);
        # without them (a GGUF file's config, read by seqzoo), the config says
        tied = "lm_head.weight" not in names if names else config.get("tie_word_embeddings", True) is not False
        make = glu_ffn if c["gated"] else mlp_ffn
        start = config.get("decoder_start_token_id")
        return {"model": {
            "kind": "encoder_decoder", "vocab_size": c["vocab_size"], "dim": c["d_model"],
            "encoder_layers": c["num_layers"], "decoder_layers": c["num_decoder_layers"],
            "max_seq_len": c["n_positions"],
            "position": {"kind": "t5", "num_buckets": c["relative_attention_num_buckets"],
                         "max_distance": c["relative_attention_max_distance"]},
            "norm": {"kind": "rmsnorm", "eps": c["layer_norm_epsilon"]}, "placement": "pre",
            "attention": {"heads": c["num_heads"], "head_dim": c["d_kv"],
                          "score": {"kind": "dot", "scale": 1.0}, "bias": False,
                          "dropout": c["dropout_rate"]},
            "ffn": make(c["act"], c["d_ff"], False, "config.json feed_forward_proj"),
            "tie_embeddings": tied, "rescale_tied_head": tied and c["scale"],
            "decoder_start_id": start if isinstance(start, int) else c["pad_token_id"] or 0,
            "dropout": c["dropout_rate"],
        }}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        c = _config(config)
        inner = c["num_heads"] * c["d_kv"]
        rules = [copy("embed.weight", "shared.weight")]
        for stack, layers in (("encoder", c["num_layers"]), ("decoder", c["num_decoder_layers"])):
            rules.append(copy(f"{stack}.position.table.weight",
                              f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"))
            for i in range(layers):
                h, b = f"{stack}.block.{i}.layer.", f"{stack}.blocks.{i}."
                qkv = tuple(f"{h}0.SelfAttention.{x}.weight" for x in "qkv")
                rules.append(fused(b + "mixer.qkv_proj.weight", qkv, (inner, inner, inner)))
                rules.append(copy(b + "mixer.out_proj.weight", h + "0.SelfAttention.o.weight"))
                rules += norm(b + "mixer_norm", h + "0.layer_norm", bias=False)
                ff = 1
                if stack == "decoder":
                    rules.append(copy(b + "cross_attn.q_proj.weight", h + "1.EncDecAttention.q.weight"))
                    kv = (h + "1.EncDecAttention.k.weight", h + "1.EncDecAttention.v.weight")
                    rules.append(fused(b + "cross_attn.kv_proj.weight", kv, (inner, inner)))
                    rules.append(copy(b + "cross_attn.out_proj.weight", h + "1.EncDecAttention.o.weight"))
                    rules += norm(b + "cross_norm", h + "1.layer_norm", bias=False)
                    ff = 2
                dense = f"{h}{ff}.DenseReluDense."
                if c["gated"]:
                    rules += [copy(b + "ffn.gate.weight", dense + "wi_0.weight"),
                              copy(b + "ffn.up.weight", dense + "wi_1.weight")]
                else:
                    rules.append(copy(b + "ffn.up.weight", dense + "wi.weight"))
                rules.append(copy(b + "ffn.down.weight", dense + "wo.weight"))
                rules += norm(b + "ffn_norm", f"{h}{ff}.layer_norm", bias=False)
            rules += norm(f"{stack}.final_norm", f"{stack}.final_layer_norm", bias=False)
        if not recipe["model"]["tie_embeddings"]:
            if c["scale"]:  # an untied head with v1.0's output scaling: fold the scale into it
                s = c["d_model"] ** -0.5
                rules.append(Rule("lm_head.weight", ("lm_head.weight",), lambda w: w * s, lambda w: (w / s,)))
            else:
                rules.append(copy("lm_head.weight", "lm_head.weight"))
        return rules

    def aliases(self, config: dict, recipe: dict) -> dict[str, str]:
        return {"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"}

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "encoder_decoder":
            return f"model.kind is {m['kind']}, needs encoder_decoder"
        problem = uniform_problem(m)
        if problem:
            return problem
        score, act = m["attention"]["score"], ffn_activation(m["ffn"], "gelu_new")
        return first_problem(
            (kind_of(m["position"]) == "t5", "model.position must be t5"),
            (kind_of(m["norm"]) == "rmsnorm", "model.norm must be rmsnorm"),
            (m["placement"] == "pre", "model.placement must be pre"),
            (kind_of(score) in ("dot", "scaled_dot") and score.get("scale") == 1.0,
             "model.attention.score must be unscaled ({kind: dot, scale: 1.0})"),
            (act is not None, f"model.ffn {kind_of(m['ffn'])} has no Hugging Face activation name"),
            (not m["ffn"].get("bias", False), "model.ffn: T5's feed-forward has no biases"),
            (not m["scale_embeddings"], "model.scale_embeddings: T5 does not scale embeddings"),
        ) or plain_attention_problem(m, "T5", biases=False, any_head_dim=True)

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        act, gated = ffn_activation(m["ffn"], "gelu_new")
        if gated:  # HF reads "gated-gelu" as tanh-GELU; exact GELU is ACT2FN's gelu_python
            act = {"gelu_new": "gelu", "gelu": "gelu_python"}.get(act, act)
        position, attn = m["position"], model.decoder.blocks[0].mixer
        tied = m["tie_embeddings"]
        return {"vocab_size": m["vocab_size"], "d_model": m["dim"], "d_kv": attn.head_dim,
                "d_ff": model.encoder.blocks[0].ffn.hidden, "num_layers": m["encoder_layers"],
                "num_decoder_layers": m["decoder_layers"], "num_heads": attn.heads,
                "relative_attention_num_buckets": position["num_buckets"],
                "relative_attention_max_distance": position["max_distance"],
                "feed_forward_proj": f"gated-{act}" if gated else act,
                "layer_norm_epsilon": m["norm"]["eps"], "dropout_rate": m["dropout"],
                "tie_word_embeddings": tied, "scale_decoder_outputs": tied and m["rescale_tied_head"],
                "decoder_start_token_id": m["decoder_start_id"], "is_encoder_decoder": True,
                "n_positions": m["max_seq_len"], **special_ids(model)}
