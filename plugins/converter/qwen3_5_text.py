"""Qwen3.5 (Qwen team, 2026), its language model (``qwen3_5_text``) <-> ``decoder_lm``: Qwen3-Next's
layers (see ``qwen3_next``: gated delta and gated attention, three to one, (1 + w) RMSNorm, partial
RoPE) with a dense SwiGLU of ``intermediate_size`` in every layer and the gated-delta projections
split by kind: ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a`` (``_gated_delta``'s
``split`` layout).

Qwen3.5's checkpoints are vision-language models (``qwen3_5``) whose text model this is: its
config.json is their ``text_config``, and transformers' ``Qwen3_5ForCausalLM`` reads their language
model's weights, ``model.language_model.*``, as ``model.*``; so does this converter, and it drops
the vision tower (``model.visual.*``) and the multi-token-prediction layer (``mtp.*``) with a
warning. The RoPE of the text model is multimodal (``mrope_section``), but a text's three position
streams are one and the same, so it is the plain partial RoPE seqzoo has.
"""
from __future__ import annotations

from typing import ClassVar

from seqzoo.io.hf.config import HFConfig
from seqzoo.registry import builtin

from ._delta_gguf import QWEN35
from ._qwen_next import QWEN3_5_DEFAULTS, Qwen3_5Family


@builtin("Hugging Face Qwen3.5 text model <-> decoder_lm (Qwen3-Next's layers with a dense SwiGLU, projections "
         "split by kind)")
class Qwen3_5TextConverter(Qwen3_5Family):
    """Qwen3-Next's keys without the experts'."""

    model_type = "qwen3_5_text"
    architecture = "Qwen3_5ForCausalLM"
    gguf = QWEN35
    defaults: ClassVar[dict] = QWEN3_5_DEFAULTS
    name: ClassVar[str] = "Qwen3.5"

    def sparse_layers(self, c: HFConfig) -> list[bool]:
        return [False] * c["num_hidden_layers"]

    def ffn_problem(self, sparse: list[bool], moe: dict | None) -> str | None:
        return "model.ffn is moe; Qwen3.5's layers have a dense SwiGLU (qwen3_5_moe_text has experts)" if moe else None

    def ffn_config(self, sparse: list[bool], moe: dict | None, widths: dict) -> dict:
        return {"intermediate_size": widths["intermediate_size"]}
