"""GPT-NeoX (Black et al., 2022; Pythia, Biderman et al., 2023) <-> ``decoder_lm``.

Each layer runs attention and the MLP side by side on the same input,
x + attn(LN₁(x)) + mlp(LN₂(x)) (``residual: parallel``), or one after the other when
``use_parallel_residual`` is false. RoPE rotates the first ``rotary_pct`` of each head's dims in
the rotate-half layout (pairs (k, k + d_r/2) within those d_r dims): seqzoo's ``rope`` with
``rotary_dim``. LayerNorms and the MLP have biases; the attention has them when ``attention_bias``.

``attention.query_key_value`` fuses q/k/v per head, its output rows laid out [H, 3, D] like
BLOOM's, reordered to seqzoo's [q | k | v]. The head is ``embed_out`` (untied unless
``tie_word_embeddings``). Old checkpoints carry ``attention.bias`` / ``masked_bias`` buffers (a
causal mask) and ``rotary_emb.inv_freq``; they hold no weights and are skipped.
"""
from __future__ import annotations

from collections.abc import Collection

from torch import nn

from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import GGUFArch, Key, Transform
from seqzoo.io.gguf.arch import interleaved_qkv
from seqzoo.io.hf import (
    HFConverter,
    Rule,
    copy,
    decoder_problem,
    ffn_activation,
    first_problem,
    fused_per_head,
    linear,
    mlp_ffn,
    norm,
    special_ids,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.io.hf.rope import partial_factor, rope_config, rope_problem, rope_spec
from seqzoo.registry import builtin

# GPTNeoXConfig's defaults (transformers 5); rotary_pct 0.25 and rotary_emb_base 10000 are read in
# ``rope_parameters`` below, as the config class reads them.
DEFAULTS = {"vocab_size": 50432, "hidden_size": 6144, "num_hidden_layers": 44, "num_attention_heads": 64,
            "intermediate_size": 24576, "hidden_act": "gelu", "attention_dropout": 0.0, "hidden_dropout": 0.0,
            "max_position_embeddings": 2048, "initializer_range": 0.02, "layer_norm_eps": 1e-5,
            "tie_word_embeddings": False, "use_parallel_residual": True, "attention_bias": True}


def _config(config: dict) -> dict:
    c = HFConfig(config, DEFAULTS)
    heads = c["num_attention_heads"]
    if c["hidden_size"] % heads:
        raise CheckpointError(f"config.json: hidden_size {c['hidden_size']} is not divisible by "
                              f"num_attention_heads {heads}")
    c["head_dim"] = c["hidden_size"] // heads
    if config.get("head_dim") not in (None, c["head_dim"]):  # the attention ignores it, the rotary reads it
        raise CheckpointError(f"config.json: head_dim {config['head_dim']} is not supported for gpt_neox "
                              f"(its heads are hidden_size / num_attention_heads = {c['head_dim']})")
    return c


def rope_parameters(config: dict) -> tuple[dict, float]:
    """(rope parameters without the partial factor, partial_rotary_factor), read as GPTNeoXConfig
    reads them: ``rope_scaling`` over ``rope_parameters``, and ``rotary_emb_base`` / ``rotary_pct``
    (default 0.25) only where those leave the theta / the factor out."""
    params = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    params.setdefault("rope_theta", config.get("rotary_emb_base", 10000.0))
    partial = params.pop("partial_rotary_factor", config.get("rotary_pct", 0.25))
    return params, partial


def rotary_dim(config: dict, head_dim: int) -> int:
    """d_r = int(head_dim · partial_rotary_factor), as transformers computes it."""
    _, partial = rope_parameters(config)
    partial = HFConfig(config).fraction("partial_rotary_factor (rotary_pct)", partial)
    dims = int(head_dim * partial)
    # An odd d_r makes transformers rotate d_r + 1 dims with frequencies over d_r: no rope has that.
    if dims == 0 or dims % 2:
        raise CheckpointError(f"config.json: partial_rotary_factor (rotary_pct) {partial} gives {dims} rotary "
                              f"dims of head_dim {head_dim}; seqzoo rotates an even number > 0")
    return dims


def neox_rotary_dims(config) -> int:
    """The rotated features of each head: rotary_pct of head_dim (rope_parameters' partial factor)."""
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    pct = (config.get("rope_parameters") or {}).get("partial_rotary_factor", config.get("rotary_pct", 1.0))
    return int(pct * head_dim)


@builtin("Hugging Face GPT-NeoX / Pythia <-> decoder_lm (parallel residual, partial rotary, per-head fused qkv)")
class GPTNeoXConverter(HFConverter):
    """config.json keys: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    hidden_act, max_position_embeddings, layer_norm_eps, use_parallel_residual, attention_bias,
    rope_parameters (or rotary_pct + rotary_emb_base + rope_scaling), hidden_dropout,
    attention_dropout, tie_word_embeddings."""

    model_type = "gpt_neox"
    architecture = "GPTNeoXForCausalLM"
    base_prefix = "gpt_neox."
    ignored = (r"attention\.bias$", r"attention\.masked_bias$", r"rotary_emb\.inv_freq$")
    # llama.cpp's gptneox: q/k/v rows regrouped from per head to per projection, partial RoPE by
    # its dimension count, an output head even when tied.
    gguf = GGUFArch("gptneox", keys=(Key("block_count", "num_hidden_layers"),
                                     Key("context_length", "max_position_embeddings"),
                                     Key("embedding_length", "hidden_size"),
                                     Key("feed_forward_length", "intermediate_size"),
                                     Key("attention.head_count", "num_attention_heads"),
                                     Key("attention.layer_norm_epsilon", "layer_norm_eps", "f32"),
                                     Key("use_parallel_residual", "use_parallel_residual", "bool"),
                                     Key("hidden_act", "hidden_act", "str", "gelu")),
                    output="required",
                    transforms=(Transform(r"query_key_value\.", interleaved_qkv("num_attention_heads")),),
                    export=lambda c: {"rope.dimension_count": neox_rotary_dims(c)},
                    config=lambda get: {"rotary_pct": get("rope.dimension_count") * get("attention.head_count")
                                        / get("embedding_length"), "attention_bias": True},
                    problem=lambda c: None if c.get("attention_bias", True) else
                    "llama.cpp's gptneox has q/k/v and output biases; this model has none")

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = _config(config)
        if not isinstance(c["use_parallel_residual"], bool):
            raise CheckpointError(f"config.json: use_parallel_residual {c['use_parallel_residual']!r} must be "
                                  f"true or false")
        params, _ = rope_parameters(config)
        # llama's rope_spec reads the (possibly scaled) frequencies; d_r is set here.
        position = rope_spec({**config, "rope_parameters": params, "rope_scaling": None, "partial_rotary_factor": None},
                             c["head_dim"], c["max_position_embeddings"])
        dims = rotary_dim(config, c["head_dim"])
        if dims != c["head_dim"]:
            position["rotary_dim"] = dims
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": c["hidden_size"],
            "layers": c["num_hidden_layers"], "max_seq_len": c["max_position_embeddings"], "position": position,
            "norm": {"kind": "layernorm", "eps": c["layer_norm_eps"]}, "placement": "pre",
            "residual": "parallel" if c["use_parallel_residual"] else "sequential",
            "attention": {"heads": c["num_attention_heads"], "score": "scaled_dot", "bias": c["attention_bias"],
                          "dropout": c["attention_dropout"]},
            "ffn": mlp_ffn(c["hidden_act"], c["intermediate_size"], True),
            "tie_embeddings": c["tie_word_embeddings"], "dropout": c["hidden_dropout"],
            "init_std": c["initializer_range"],
        }}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        c = _config(config)
        bias = c["attention_bias"]
        rules = [copy("embed.weight", "gpt_neox.embed_in.weight")]
        for i in range(c["num_hidden_layers"]):
            h, b = f"gpt_neox.layers.{i}.", f"decoder.blocks.{i}."
            rules += norm(b + "mixer_norm", h + "input_layernorm")
            for part in ("weight", "bias") if bias else ("weight",):
                rules.append(fused_per_head(f"{b}mixer.qkv_proj.{part}", f"{h}attention.query_key_value.{part}",
                                            c["num_attention_heads"]))
            rules += linear(b + "mixer.out_proj", h + "attention.dense", bias)
            rules += norm(b + "ffn_norm", h + "post_attention_layernorm")
            rules += linear(b + "ffn.up", h + "mlp.dense_h_to_4h", True)
            rules += linear(b + "ffn.down", h + "mlp.dense_4h_to_h", True)
        rules += norm("decoder.final_norm", "gpt_neox.final_layer_norm")
        if not recipe["model"]["tie_embeddings"]:
            rules.append(copy("lm_head.weight", "embed_out.weight"))
        return rules

    def aliases(self, config: dict, recipe: dict) -> dict[str, str]:
        # transformers 5 names the head lm_head in the model and writes embed_out; take either.
        if recipe["model"]["tie_embeddings"]:
            return {"embed_out.weight": "gpt_neox.embed_in.weight", "lm_head.weight": "gpt_neox.embed_in.weight"}
        return {"lm_head.weight": "embed_out.weight"}

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        # decoder_problem knows only sequential residuals; the residual is checked here.
        problem = decoder_problem({**m, "residual": "sequential"}, position="rope", norm="layernorm",
                                  ffn_gated=False, tanh_name="gelu_new")
        if problem:
            return problem
        attn, ffn = m["attention"], m["ffn"]
        head_dim = m["dim"] // attn["heads"]
        return first_problem(
            (m["residual"] in ("parallel", "sequential"),
             f"model.residual is {m['residual']}; GPT-NeoX has parallel (a norm for each branch) or sequential"),
            (m["norm"].get("bias", True), "model.norm has no bias; GPT-NeoX's LayerNorms have one"),
            (m["embed_norm"] is None, "model.embed_norm is set; GPT-NeoX has none"),
            (attn["kv_heads"] in (None, attn["heads"]), "model.attention.kv_heads: GPT-NeoX has no GQA"),
            (attn["head_dim"] in (None, head_dim) and m["dim"] % attn["heads"] == 0,
             "model.attention.head_dim must be dim / heads (GPT-NeoX)"),
            (attn["out_bias"] in (None, attn["bias"]),
             "model.attention: GPT-NeoX has q/k/v and output biases alike (attention_bias)"),
            (attn["window"] is None, "model.attention.window: GPT-NeoX has no sliding window"),
            (attn["score"] == {"kind": "scaled_dot", "scale": None},
             "model.attention.score must be scaled_dot with the default scale"),
            (ffn["bias"], "model.ffn: GPT-NeoX's MLP has biases"),
        ) or rope_problem({**m["position"], "rotary_dim": None}, m["max_seq_len"], head_dim)

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        attn, position = m["attention"], m["position"]
        head_dim = m["dim"] // attn["heads"]
        act, _ = ffn_activation(m["ffn"], "gelu_new")
        rope = rope_config(position, m["max_seq_len"])
        partial = partial_factor(position["rotary_dim"] or head_dim, head_dim)
        return {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "num_hidden_layers": m["layers"],
                "num_attention_heads": attn["heads"], "intermediate_size": model.decoder.blocks[0].ffn.hidden,
                "hidden_act": act, "max_position_embeddings": m["max_seq_len"], "layer_norm_eps": m["norm"]["eps"],
                "use_parallel_residual": m["residual"] == "parallel", "attention_bias": attn["bias"],
                # transformers 5 reads rope_parameters; 4 reads rotary_pct, rotary_emb_base, rope_scaling.
                "rope_parameters": {**rope["rope_parameters"], "partial_rotary_factor": partial},
                "rotary_pct": partial, "rotary_emb_base": rope["rope_theta"], "rope_scaling": rope["rope_scaling"],
                "hidden_dropout": m["dropout"], "attention_dropout": attn["dropout"],
                "tie_word_embeddings": m["tie_embeddings"], "initializer_range": m["init_std"],
                **special_ids(model)}
