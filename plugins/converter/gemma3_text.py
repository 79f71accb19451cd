"""Gemma 3, text only (Gemma Team, 2025; ``Gemma3ForCausalLM``, model_type ``gemma3_text``) <->
``decoder_lm``: Gemma 2's block with

- five local layers to one global (layer i is global when (i + 1) % sliding_window_pattern == 0,
  pattern 6, unless config.json lists ``layer_types``);
- a RoPE per layer type: transformers 5's ``rope_parameters`` keyed by ``sliding_attention`` /
  ``full_attention``, or the older ``rope_theta`` (global, 1e6) + ``rope_local_base_freq`` (local,
  1e4) + ``rope_scaling`` (global layers only, e.g. linear with factor 8);
- QK-norm: a (1 + w) RMSNorm over each head's D features of q and of k, before RoPE
  (``attention.qk_norm`` with ``qk_norm_scope: head``);
- no softcaps by default. ``final_logit_softcapping`` is applied when set; transformers' Gemma 3
  attention never applies ``attn_logit_softcapping``, so neither does the imported model.
"""
from __future__ import annotations

import copy

from seqzoo.errors import CheckpointError
from seqzoo.io.hf.decoder import DecoderFamily
from seqzoo.io.hf.rope import rope_parameters, rope_spec
from seqzoo.registry import builtin

from ._gemma import GEMMA2_DEFAULTS, NORMS, TYPES, GemmaConverter


@builtin("Hugging Face Gemma 3 text <-> decoder_lm (5:1 local/global, RoPE per layer type, (1+w) QK-norm)")
class Gemma3TextConverter(GemmaConverter):
    """Gemma 2's keys (softcaps null by default) plus rope_parameters per layer type (or rope_theta,
    rope_local_base_freq and rope_scaling) and sliding_window_pattern (6)."""

    family = DecoderFamily(
        "gemma3_text", "Gemma3ForCausalLM", "Gemma 3", placement="sandwich", norms=NORMS, qk_norm_scope="head",
        defaults={**GEMMA2_DEFAULTS, "vocab_size": 262208, "max_position_embeddings": 131072,
                  "final_logit_softcapping": None, "attn_logit_softcapping": None,
                  "use_bidirectional_attention": False})
    rope_per_type = True
    attention_softcap = False
    period_key = "sliding_window_pattern"

    def ropes(self, config: dict, c: dict) -> dict[str, dict]:
        # As Gemma3TextConfig.convert_rope_params_to_dict: a legacy rope_scaling joins the global
        # layers' parameters only; each type's base defaults to its own legacy key.
        params = copy.deepcopy(config.get("rope_parameters") or {})
        full = params.get("full_attention") or {"rope_type": "default"}
        full.update(config.get("rope_scaling") or {})
        full.setdefault("rope_theta", config.get("rope_theta", 1e6))
        local = params.get("sliding_attention") or {"rope_type": "default"}
        local.setdefault("rope_theta", config.get("rope_local_base_freq", 1e4))
        specs = {}
        for kind, found in (("sliding_attention", local), ("full_attention", full)):
            try:
                specs[kind] = rope_spec({"rope_parameters": found}, c["head_dim"], c["max_position_embeddings"])
            except CheckpointError as error:
                raise CheckpointError(str(error).replace("config.json:", f"config.json: rope_parameters.{kind}:",
                                                         1)) from None
        return specs

    def rope_keys(self, positions: dict[str, dict], max_seq_len: int) -> dict:
        """Nested ``rope_parameters`` (transformers 5), and the older keys transformers 4 reads."""
        nested = {kind: rope_parameters(positions[kind], max_seq_len) for kind in TYPES if kind in positions}
        full = nested.get("full_attention") or nested["sliding_attention"]
        local = nested.get("sliding_attention") or full
        scaling = {k: v for k, v in full.items() if k != "rope_theta"}
        return {"rope_parameters": nested, "rope_theta": full["rope_theta"],
                "rope_local_base_freq": local["rope_theta"],
                "rope_scaling": scaling if scaling["rope_type"] != "default" else None}
