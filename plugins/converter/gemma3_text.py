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
from seqzoo.io.gguf import LLAMA_KEYS, GGUFArch, Key
from seqzoo.io.gguf.arch import GEMMA_NORMS, sliding_flags
from seqzoo.io.hf.decoder import DecoderFamily
from seqzoo.io.hf.rope import rope_parameters, rope_spec
from seqzoo.registry import builtin

from ._gemma import GEMMA2_DEFAULTS, NORMS, TYPES, GemmaConverter, gguf_gemma_config, gguf_scale_problem


def gemma3_gguf_problem(config) -> str | None:
    rope = config["rope_parameters"]
    if config.get("attn_logit_softcapping") is not None:
        return "llama.cpp's gemma3 does not softcap attention logits; this model does"
    if rope["sliding_attention"].get("rope_type", "default") != "default":
        return "llama.cpp's gemma3 scales RoPE on the global layers only; this model scales its local layers' too"
    if rope["full_attention"].get("rope_type", "default") not in ("default", "linear"):
        return (f"llama.cpp's gemma3 reads linear RoPE scaling only; this model's is "
                f"{rope['full_attention']['rope_type']}")
    return gguf_scale_problem(config, wide_layers=62)


def gemma3_gguf_metadata(config) -> dict:
    full, local = config["rope_parameters"]["full_attention"], config["rope_parameters"]["sliding_attention"]
    out = {"rope.freq_base": float(full["rope_theta"]), "rope.freq_base_swa": float(local["rope_theta"]),
           "attention.sliding_window_pattern": sliding_flags(config)}
    if full.get("rope_type") == "linear":
        out.update({"rope.scaling.type": "linear", "rope.scaling.factor": float(full["factor"])})
    return out


def gemma3_gguf_config(get) -> dict:
    full = {"rope_type": "default", "rope_theta": float(get("rope.freq_base", 10000.0))}
    if get("rope.scaling.type") == "linear":
        full.update(rope_type="linear", factor=float(get("rope.scaling.factor")))
    local = {"rope_type": "default", "rope_theta": float(get("rope.freq_base_swa", 10000.0))}
    return {**gguf_gemma_config(get, wide_layers=62, default_period=6), "attn_logit_softcapping": None,
            "rope_parameters": {"full_attention": full, "sliding_attention": local}}

@builtin("Hugging Face Gemma 3 text <-> decoder_lm (5:1 local/global, RoPE per layer type, (1+w) QK-norm)")
class Gemma3TextConverter(GemmaConverter):
    """Gemma 2's keys (softcaps null by default) plus rope_parameters per layer type (or rope_theta,
    rope_local_base_freq and rope_scaling) and sliding_window_pattern (6)."""

    family = DecoderFamily(
        "gemma3_text", "Gemma3ForCausalLM", "Gemma 3", placement="sandwich", norms=NORMS, qk_norm_scope="head",
        defaults={**GEMMA2_DEFAULTS, "vocab_size": 262208, "max_position_embeddings": 131072,
                  "final_logit_softcapping": None, "attn_logit_softcapping": None,
                  "use_bidirectional_attention": False})
    # llama.cpp's gemma3: one RoPE base per layer type, linear scaling on the global layers only,
    # no attention softcap, a final one only when the key is there.
    gguf = GGUFArch("gemma3", keys=LLAMA_KEYS + (Key("final_logit_softcapping", "final_logit_softcapping", "f32",
                                                     optional=True), Key("attention.sliding_window", "sliding_window")),
                    transforms=GEMMA_NORMS, rope=False, export=gemma3_gguf_metadata,
                    config=gemma3_gguf_config, problem=gemma3_gguf_problem)
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
