"""RoBERTa (Liu et al., 2019) and XLM-RoBERTa (Conneau et al., 2020) <-> ``encoder``: BERT's
layout with positions numbered after the padding id.

RoBERTa numbers real tokens padding_idx + 1, padding_idx + 2, ... (fairseq's ``make_positions``,
transformers' ``create_position_ids_from_input_ids``), counting only tokens that are not the pad
id, and gives padding tokens padding_idx: ``model.padding_idx`` = config.json's pad_token_id. Its
learned table therefore has max_position_embeddings = 514 rows for 512 tokens (``max_seq_len``);
token types are a single row (type_vocab_size 1). The masked-LM head is ``lm_head`` (dense, exact
GELU whatever ``hidden_act`` says, layer_norm, a decoder tied to the word embedding, bias).
XLM-RoBERTa is the same model under another name; a seqzoo model exports as xlm-roberta only when
asked (``--model-type xlm-roberta``), as roberta otherwise.
"""
from __future__ import annotations

from seqzoo.io.hf import activation_name, first_problem
from seqzoo.registry import builtin

from ._bert import DEFAULTS, BertLayout

ROBERTA = {**DEFAULTS, "vocab_size": 50265, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}


@builtin("Hugging Face RoBERTa <-> encoder (positions after the pad id, MLM head)")
class RobertaConverter(BertLayout):
    """BERT's config.json keys; pad_token_id (1) is also the position offset."""

    model_type = "roberta"
    architecture = "RobertaModel"
    masked_lm = "RobertaForMaskedLM"
    prefix = "roberta."
    head = {"dense": "lm_head.dense", "norm": "lm_head.layer_norm", "bias": "lm_head.bias",
            "decoder": "lm_head.decoder"}
    defaults = ROBERTA
    offset_positions = True
    dropped = {}

    def head_activation(self, c: dict) -> str | dict:
        return {"kind": "gelu", "approximate": "none"}  # RobertaLMHead calls gelu, not hidden_act

    def head_problem(self, m: dict) -> str | None:
        return first_problem((activation_name(m["mlm_head"]["activation"]) == "gelu",
                              "model.mlm_head.activation must be the exact gelu (RoBERTa's head)"))

    def hf_config(self, model) -> dict:
        # The position offset is the pad id: it must be config.json's, whatever the tokenizer says.
        return {**super().hf_config(model), "pad_token_id": model.recipe["model"]["padding_idx"]}


@builtin("Hugging Face XLM-RoBERTa <-> encoder (RoBERTa's layout)", name="xlm-roberta")
class XLMRobertaConverter(RobertaConverter):
    """RoBERTa's keys (its transformers config defaults to vocab_size 30522)."""

    model_type = "xlm-roberta"
    architecture = "XLMRobertaModel"
    masked_lm = "XLMRobertaForMaskedLM"
    defaults = {**ROBERTA, "vocab_size": 30522}
    named_only = True
