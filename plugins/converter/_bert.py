"""What the BERT-layout converters share (``bert``, ``roberta``): embeddings with token types,
post-norm blocks, the pooler and the masked-LM head. The family's notes are ``bert``'s docstring."""
from __future__ import annotations

from collections.abc import Collection
from typing import ClassVar

from torch import Tensor, nn

from seqzoo.errors import CheckpointError
from seqzoo.io.hf import (
    HFConverter,
    Rule,
    activation_name,
    activation_spec,
    copy,
    ffn_activation,
    first_problem,
    fused,
    kind_of,
    linear,
    mlp_ffn,
    norm,
    plain_attention_problem,
    renamed,
    special_ids,
    uniform_problem,
)
from seqzoo.io.hf.config import HFConfig

DEFAULTS = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
            "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
            "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02,
            "layer_norm_eps": 1e-12, "position_embedding_type": "absolute", "pad_token_id": 0,
            "tie_word_embeddings": True}

#: TensorFlow-era LayerNorm names and today's (transformers' "legacy" renaming).
LEGACY_NAMES = (("LayerNorm.gamma", "LayerNorm.weight"), ("LayerNorm.beta", "LayerNorm.bias"))


class BertLayout(HFConverter):
    """config.json keys: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
    hidden_act, max_position_embeddings, type_vocab_size, layer_norm_eps, *_dropout_prob,
    tie_word_embeddings (true with a masked-LM head). The pooler and the masked-LM head are
    imported when the checkpoint has them."""

    model_type = "bert"
    architecture = "BertModel"
    #: The task class written for a model with ``mlm_head``.
    masked_lm: ClassVar[str] = "BertForMaskedLM"
    #: Where task models keep the encoder.
    prefix: ClassVar[str] = "bert."
    #: The masked-LM head's tensors: its dense layer, norm, output bias and (tied) decoder.
    head: ClassVar[dict[str, str]] = {"dense": "cls.predictions.transform.dense",
                                      "norm": "cls.predictions.transform.LayerNorm",
                                      "bias": "cls.predictions.bias", "decoder": "cls.predictions.decoder"}
    defaults: ClassVar[dict] = DEFAULTS
    #: Whether positions count from the padding id (RoBERTa: ``model.padding_idx``) or from 0.
    offset_positions: ClassVar[bool] = False
    ignored = (r"embeddings\.position_ids$",)
    dropped = {r"^cls\.seq_relationship\.": "the next-sentence head"}

    # -- what differs between BERT and RoBERTa ----------------------------------------------------
    def padding_idx(self, c: dict) -> int | None:
        """The position offset (``model.padding_idx``): config.json's pad id, or None."""
        if not self.offset_positions:
            return None
        if c["pad_token_id"] is None:
            raise CheckpointError(f"config.json: {self.model_type} pad_token_id: null is not supported "
                                  f"(its positions are numbered after the padding id)")
        return c["pad_token_id"]

    def head_activation(self, c: dict) -> str | dict:
        """The masked-LM transform's activation: BERT's is ``hidden_act``."""
        return activation_spec(c["hidden_act"])

    def head_problem(self, m: dict) -> str | None:
        """Why the model's ``mlm_head`` is not this family's, or None."""
        head = m["mlm_head"]
        return first_problem(
            (activation_name(head["activation"]) == ffn_activation(m["ffn"], "gelu_new")[0],
             "model.mlm_head.activation must be model.ffn's (BERT's head uses hidden_act)"),
        )

    # -- the converter interface --------------------------------------------------------------------
    def config(self, config: dict) -> dict:
        return HFConfig(config, self.defaults)

    def canonical_names(self, names: Collection[str]) -> dict[str, str]:
        """Task models keep the encoder under ``prefix``; BertModel has no prefix. Checkpoints
        converted from TensorFlow (bert-base-uncased's model.safetensors) name LayerNorm weights
        gamma and beta, which transformers renames on load; so does this."""
        strip = any(n.startswith(self.prefix) for n in names)
        canonical = {}
        for name in names:
            key = name.removeprefix(self.prefix) if strip else name
            for old, new in LEGACY_NAMES:
                if key.endswith(old):
                    key = key[: -len(old)] + new
            canonical[key] = name
        return canonical

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        family = self.model_type
        for key, bad in (("is_decoder", True), ("add_cross_attention", True)):
            if c.get(key) == bad:
                raise CheckpointError(f"config.json: {family} {key}: true is not supported (seqzoo's "
                                      f"encoder is bidirectional)")
        if c["position_embedding_type"] != "absolute":
            raise CheckpointError(f"config.json: {family} position_embedding_type "
                                  f"{c['position_embedding_type']!r} is not supported; only 'absolute'")
        has_head = f"{self.head['dense']}.weight" in names
        if has_head and not c["tie_word_embeddings"]:
            raise CheckpointError(f"config.json: {family} tie_word_embeddings: false is not supported with "
                                  f"the masked-LM head (seqzoo's decoder is the word embedding)")
        ln = {"kind": "layernorm", "eps": c["layer_norm_eps"]}
        model = {
            "kind": "encoder", "vocab_size": c["vocab_size"], "dim": c["hidden_size"],
            "layers": c["num_hidden_layers"], "max_seq_len": c["max_position_embeddings"],
            "position": "learned", "norm": ln, "embed_norm": ln, "placement": "post",
            "attention": {"heads": c["num_attention_heads"], "score": "scaled_dot", "bias": True,
                          "dropout": c["attention_probs_dropout_prob"]},
            "ffn": mlp_ffn(c["hidden_act"], c["intermediate_size"], True),
            "type_vocab_size": c["type_vocab_size"], "pooler": "pooler.dense.weight" in names,
            "dropout": c["hidden_dropout_prob"], "init_std": c["initializer_range"],
        }
        if has_head:
            model["mlm_head"] = {"activation": self.head_activation(c)}
        padding_idx = self.padding_idx(c)
        if padding_idx is not None:
            model["padding_idx"] = padding_idx
        return {"model": model}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        c = self.config(config)
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
                rules.append(fused(f"{b}mixer.qkv_proj.{part}", sources, (dim, dim, dim)))
            rules += renamed(b, h, {"mixer.out_proj": "attention.output.dense",
                                    "mixer_norm": "attention.output.LayerNorm", "ffn.up": "intermediate.dense",
                                    "ffn.down": "output.dense", "ffn_norm": "output.LayerNorm"}, True)
        if recipe["model"]["pooler"]:
            rules += linear("pooler", "pooler.dense", True)
        if recipe["model"].get("mlm_head") is not None:
            rules += linear("mlm_head.dense", self.head["dense"], True)
            rules += norm("mlm_head.norm", self.head["norm"])
            rules.append(copy("mlm_head.bias", self.head["bias"]))
        return rules

    def aliases(self, config: dict, recipe: dict) -> dict[str, str]:
        """The head's decoder, stored by older checkpoints: the word embedding and the head's bias."""
        if recipe["model"].get("mlm_head") is None:
            return {}
        decoder = self.head["decoder"]
        return {f"{decoder}.weight": "embeddings.word_embeddings.weight", f"{decoder}.bias": self.head["bias"]}

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "encoder":
            return f"model.kind is {m['kind']}, needs encoder"
        problem = uniform_problem(m)
        if problem:
            return problem
        attn, act, head = m["attention"], ffn_activation(m["ffn"], "gelu_new"), m.get("mlm_head")
        offset = m.get("padding_idx") is not None
        why = "numbers positions after the padding id" if self.offset_positions else "numbers positions from 0"
        return first_problem(
            (kind_of(m["position"]) == "learned", "model.position must be learned"),
            (offset == self.offset_positions,
             f"model.padding_idx must be {'set' if self.offset_positions else 'null'} ({self.model_type} {why})"),
            (kind_of(m["norm"]) == "layernorm" and m["norm"]["bias"], "model.norm must be a layernorm with bias"),
            (m["embed_norm"] == m["norm"], "model.embed_norm must equal model.norm (BERT's embeddings LayerNorm)"),
            (m["placement"] == "post", "model.placement must be post"),
            (act is not None and not act[1], "model.ffn must be an ungated MLP with a named activation"),
            (m["ffn"].get("bias", False), "model.ffn must have biases"),
            (attn["score"] == {"kind": "scaled_dot", "scale": None}, "model.attention.score must be scaled_dot"),
            (head is None or (head["bias"] and head["decoder_bias"]),
             "model.mlm_head: BERT's head has a dense bias and an output bias (bias, decoder_bias: true)"),
            (head is None or head["norm"] in (None, m["norm"]),
             "model.mlm_head.norm must be null (the model's norm, as BERT's head LayerNorm)"),
        ) or plain_attention_problem(m, "BERT", biases=True) or (head is not None and self.head_problem(m)) or None

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        act, _ = ffn_activation(m["ffn"], "gelu_new")
        has_head = m.get("mlm_head") is not None
        config = {"vocab_size": m["vocab_size"], "hidden_size": m["dim"], "num_hidden_layers": m["layers"],
                  "num_attention_heads": m["attention"]["heads"],
                  "intermediate_size": model.encoder.blocks[0].ffn.hidden, "hidden_act": act,
                  "max_position_embeddings": m["max_seq_len"], "type_vocab_size": m["type_vocab_size"],
                  "layer_norm_eps": m["norm"]["eps"], "hidden_dropout_prob": m["dropout"],
                  "attention_probs_dropout_prob": m["attention"]["dropout"],
                  "initializer_range": m["init_std"], **special_ids(model),
                  # to_hf writes this over the converter's ``architecture``: the head decides the class
                  "architectures": [self.masked_lm if has_head else self.architecture]}
        if has_head:
            config["tie_word_embeddings"] = True
        return config

    def to_hf(self, model: nn.Module) -> tuple[dict, dict[str, Tensor]]:
        """As ``BertModel``, or with a head as the task model: the encoder under ``prefix``, the
        head at the top level (a pooler, if any, stays under ``prefix``: the task class ignores it,
        ``AutoModel`` reads it)."""
        config, tensors = super().to_hf(model)
        if model.recipe["model"].get("mlm_head") is None:
            return config, tensors
        root = self.head["bias"].split(".", 1)[0] + "."
        return config, {n if n.startswith(root) else self.prefix + n: t for n, t in tensors.items()}
