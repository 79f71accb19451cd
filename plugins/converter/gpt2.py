"""GPT-2 (Radford et al., 2019) <-> ``decoder_lm``: learned positions, pre-norm LayerNorm, GELU MLP,
tied head.

GPT-2 keeps its projections in ``Conv1D`` layers whose weights are stored [in, out], the transpose
of ``nn.Linear``: every matrix is transposed on the way in and out. ``c_attn`` is already the fused
[q | k | v] projection seqzoo uses.
"""
from __future__ import annotations

from collections.abc import Collection

from torch import nn

from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import GGUFArch, Key, Transform
from seqzoo.io.gguf.arch import transposed
from seqzoo.io.hf import (
    CausalLMConverter,
    Rule,
    copy,
    decoder_problem,
    ffn_activation,
    first_problem,
    kind_of,
    mlp_ffn,
    plain_attention_problem,
    renamed,
    special_ids,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.registry import builtin

DEFAULTS = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
            "n_inner": None, "activation_function": "gelu_new", "resid_pdrop": 0.1, "attn_pdrop": 0.1,
            "layer_norm_epsilon": 1e-5, "initializer_range": 0.02, "scale_attn_weights": True,
            "tie_word_embeddings": True}


#: The activations llama.cpp's GELU computes: the tanh form exactly, the erf form within 3e-4.
GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu")


@builtin("Hugging Face GPT-2 <-> decoder_lm (Conv1D weights transposed)")
class GPT2Converter(CausalLMConverter):
    """config.json keys: n_embd, n_layer, n_head, n_positions, n_inner, activation_function,
    layer_norm_epsilon, scale_attn_weights, tie_word_embeddings, *_pdrop."""

    model_type = "gpt2"
    architecture = "GPT2LMHeadModel"
    base_prefix = "transformer."
    embedding = "transformer.wte.weight"
    ignored = (r"\.attn\.bias$", r"\.attn\.masked_bias$")  # causal-mask buffers of old checkpoints
    # llama.cpp's gpt2: Conv1D weights as linears ([out, in]), a GELU (computed with the tanh
    # approximation, within 3e-4 of the exact one; which one the model has is kept in a key
    # llama.cpp ignores), a position table.
    gguf = GGUFArch("gpt2", keys=(Key("block_count", "n_layer"), Key("context_length", "n_positions"),
                                  Key("embedding_length", "n_embd"), Key("attention.head_count", "n_head"),
                                  Key("attention.layer_norm_epsilon", "layer_norm_epsilon", "f32"),
                                  Key("activation_function", "activation_function", "str", "gelu_new")),
                    rope=False, transforms=(Transform(r"\.(c_attn|c_proj|c_fc)\.weight$", transposed),),
                    export=lambda c: {"feed_forward_length": c.get("n_inner") or 4 * c["n_embd"]},
                    config=lambda get: {"n_inner": get("feed_forward_length")},
                    problem=lambda c: None if c.get("activation_function", "gelu_new") in GELUS
                    else f"llama.cpp's gpt2 uses a GELU; this model's activation is {c['activation_function']}")

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = HFConfig(config, DEFAULTS)
        for key in ("add_cross_attention", "scale_attn_by_inverse_layer_idx"):
            if c.get(key):
                raise CheckpointError(f"config.json: gpt2 {key}: true is not supported")
        dim = c["n_embd"]
        score = "scaled_dot" if c["scale_attn_weights"] else {"kind": "scaled_dot", "scale": 1.0}
        return {"model": {
            "kind": "decoder_lm", "vocab_size": c["vocab_size"], "dim": dim, "layers": c["n_layer"],
            "max_seq_len": c["n_positions"], "position": "learned",
            "norm": {"kind": "layernorm", "eps": c["layer_norm_epsilon"]}, "placement": "pre",
            "attention": {"heads": c["n_head"], "score": score, "bias": True, "dropout": c["attn_pdrop"]},
            "ffn": mlp_ffn(c["activation_function"], c["n_inner"] or 4 * dim, True),
            "tie_embeddings": c["tie_word_embeddings"], "dropout": c["resid_pdrop"],
            "init_std": c["initializer_range"],
        }}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        rules = [copy("decoder.position.table.weight", "transformer.wpe.weight")]
        for i in range(recipe["model"]["layers"]):
            b, h = f"decoder.blocks.{i}.", f"transformer.h.{i}."
            rules += renamed(b, h, {"mixer_norm": "ln_1", "ffn_norm": "ln_2"}, True)
            rules += renamed(b, h, {"mixer.qkv_proj": "attn.c_attn", "mixer.out_proj": "attn.c_proj",
                                    "ffn.up": "mlp.c_fc", "ffn.down": "mlp.c_proj"}, True, transpose=True)
        return rules + self.ends(recipe, "transformer.ln_f", True)

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        problem = decoder_problem(m, position="learned", norm="layernorm", ffn_gated=False,
                                  tanh_name="gelu_new")
        if problem:
            return problem
        score = m["attention"]["score"]
        return plain_attention_problem(m, "GPT-2", biases=True) or first_problem(
            (m["norm"].get("bias", True), "model.norm has no bias; GPT-2's LayerNorm has one"),
            (kind_of(score) == "scaled_dot" and score.get("scale") in (None, 1.0),
             "model.attention.score must be scaled_dot (scale null or 1.0)"),
            (m["ffn"].get("bias", True), "model.ffn has no bias; GPT-2's MLP has biases"),
            (m["embed_norm"] is None, "model.embed_norm is set; GPT-2 has none"),
        )

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        act, _ = ffn_activation(m["ffn"], "gelu_new")
        return {"vocab_size": m["vocab_size"], "n_embd": m["dim"], "n_layer": m["layers"],
                "n_head": m["attention"]["heads"], "n_positions": m["max_seq_len"],
                "n_inner": model.decoder.blocks[0].ffn.hidden, "activation_function": act,
                "layer_norm_epsilon": m["norm"]["eps"],
                "scale_attn_weights": m["attention"]["score"].get("scale") is None,
                "tie_word_embeddings": m["tie_embeddings"], "attn_pdrop": m["attention"]["dropout"],
                "resid_pdrop": m["dropout"], "embd_pdrop": m["dropout"],
                "initializer_range": m["init_std"], **special_ids(model)}
