"""Export checks: why a seqzoo recipe cannot be written as a family (``accepts`` returns the first
reason), shared by the converters."""
from __future__ import annotations

from .activations import ffn_activation, kind_of


def first_problem(*checks: tuple[bool, str]) -> str | None:
    """The message of the first failed (ok, message) check, or None: what ``accepts`` returns."""
    return next((message for ok, message in checks if not ok), None)


def uniform_problem(model: dict) -> str | None:
    """Why a model section is not a uniform stack of attention layers with the 2023 block options
    (a per-layer pattern, another mixer, a parallel residual, softcaps, sinks), or None. Families
    whose Hugging Face classes have none of these refuse such models rather than drop a part."""
    attn = model["attention"] or {}
    return first_problem(
        (model.get("pattern") is None and not model.get("layer_overrides"),
         "model.pattern: layers differ; this family's layers are all alike"),
        (model.get("mixer") is None, f"model.mixer is {kind_of(model.get('mixer'))}; this family attends"),
        (model.get("residual", "sequential") == "sequential",
         f"model.residual is {model.get('residual')}; this family adds its sublayers in sequence"),
        (model.get("final_softcap") is None, "model.final_softcap is set; this family has none"),
        (attn.get("softcap") is None, "model.attention.softcap is set; this family has none"),
        (not attn.get("sinks"), "model.attention.sinks is set; this family has none"),
        (not attn.get("output_gate"), "model.attention.output_gate is set; this family has none"),
    )


def decoder_problem(model: dict, *, position: str, norm: str, ffn_gated: bool, tanh_name: str,
                    qk_norm: bool = False, placement: str = "pre") -> str | None:
    """Checks shared by the decoder-only families (GPT-2, LLaMA, BLOOM); ``qk_norm``: the family
    normalises q and k (Qwen3, OLMo 2), which its converter checks further; ``placement``: where
    its norms sit (``output`` for OLMo 2)."""
    if model["kind"] != "decoder_lm":
        return f"model.kind is {model['kind']}, needs decoder_lm"
    problem = uniform_problem(model)
    if problem:
        return problem
    attn, act = model["attention"] or {}, ffn_activation(model["ffn"], tanh_name)
    return first_problem(
        (kind_of(model["position"]) == position,
         f"model.position is {kind_of(model['position'])}, needs {position}"),
        (kind_of(model["norm"]) == norm, f"model.norm is {kind_of(model['norm'])}, needs {norm}"),
        (model["placement"] == placement, f"model.placement is {model['placement']}, needs {placement}"),
        (act is not None, f"model.ffn {kind_of(model['ffn'])} has no Hugging Face activation name"),
        (act is None or act[1] == ffn_gated,
         f"model.ffn is {'gated' if act and act[1] else 'ungated'}, needs {'gated' if ffn_gated else 'ungated'}"),
        (qk_norm or attn.get("qk_norm") is None, "model.attention.qk_norm is set; this family has none"),
        (not qk_norm or attn.get("qk_norm") is not None, "model.attention.qk_norm is null; this family has one"),
        (not model["scale_embeddings"], "model.scale_embeddings is true; this family has none"),
    )



def layer_pattern(kinds: list) -> list:
    """The shortest ``pattern`` whose repetition (layer i takes pattern[i % len]) gives each layer's
    kind — how Hugging Face configs repeat their per-layer lists (``layer_types``,
    ``no_rope_layers``), a last period cut short included: Gemma 3 1B's 26 layers -> 6 entries."""
    return next(kinds[:p] for p in range(1, len(kinds) + 1)
                if all(kind == kinds[i % p] for i, kind in enumerate(kinds)))


def plain_attention_problem(model: dict, family: str, *, biases: bool, any_head_dim: bool = False) -> str | None:
    """Why ``model.attention`` is not the attention of the 2017–2022 families (GPT-2, BERT, BLOOM,
    T5, GPT-NeoX) — as many K/V heads as query heads, each C/H wide (any width: ``any_head_dim``,
    T5), no window, no QK-norm, and a bias on every projection (``biases``) or on none — or None."""
    attn = model["attention"]
    have = attn["bias"] and attn["out_bias"] in (None, True) if biases else not attn["bias"] and not attn["out_bias"]
    return first_problem(
        (attn["kv_heads"] in (None, attn["heads"]), f"model.attention.kv_heads: {family} has no GQA"),
        (any_head_dim or attn["head_dim"] in (None, model["dim"] // attn["heads"]),
         "model.attention.head_dim must be dim / heads"),
        (have, f"model.attention: {family} has {'biases everywhere' if biases else 'no biases'}"),
        (attn["window"] is None, f"model.attention.window: {family} has no sliding window"),
        (attn["qk_norm"] is None, f"model.attention.qk_norm: {family} has none"),
    )
