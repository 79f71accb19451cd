"""What the converters of hybrid stacks share (not a family of its own; ``lfm2``, ``lfm2_moe``,
``recurrent_gemma``, and the attention rules of ``bamba`` and ``granitemoehybrid``): a per-layer
list of kinds as layer types in the shortest repeating pattern, with the model's mixer in all but
the attention layers, and those attention layers' tensors as checkpoints store them (separate
q/k/v projections, seqzoo's fused ``qkv_proj``)."""
from __future__ import annotations

from seqzoo.builder import LayerPlan
from seqzoo.io.hf import Rule, fused, layer_pattern, linear
from seqzoo.nn.attention import AttentionConfig


def mixer_layout(kinds: list[str]) -> dict:
    """The model-section keys for layers of ``kinds`` (``attention`` or the name of the model's
    mixer): a layer type per kind, the attending one ``{mixer: attention}``, in the shortest
    ``pattern`` that repeats into the list; {} when every layer is of one kind."""
    if len(set(kinds)) < 2:
        return {}
    return {"layer_types": {k: {"mixer": "attention"} if k == "attention" else {} for k in dict.fromkeys(kinds)},
            "pattern": layer_pattern(kinds)}


def parts(plans: list[LayerPlan], mixer: str) -> tuple[dict | None, AttentionConfig | None]:
    """(the spec of the first layer whose mixer is ``mixer``, or None; the attention section of the
    first attending layer, or the first layer's when none attends): what a hybrid family's config
    describes once for all its layers."""
    spec = next((p.mixer for p in plans if p.mixer["kind"] == mixer), None)
    return spec, next((p.attention for p in plans if p.mixer["kind"] == "attention"), plans[0].attention)


def attention_rules(ours: str, theirs: str, attn: AttentionConfig, dim: int, *, out: str, out_bias: bool) -> list[Rule]:
    """One attention layer's projections: seqzoo's ``qkv_proj`` (with a bias when ``attn.bias``) from
    ``{q,k,v}_proj`` under ``theirs``, ``out_proj`` from ``out`` (with a bias when ``out_bias``)."""
    kv_heads, head_dim = attn.kv_heads or attn.heads, attn.head_dim or dim // attn.heads
    sizes = (attn.heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)
    rules = [fused(f"{ours}mixer.qkv_proj.{part}", tuple(f"{theirs}{x}_proj.{part}" for x in "qkv"), sizes)
             for part in (("weight", "bias") if attn.bias else ("weight",))]
    return rules + linear(ours + "mixer.out_proj", theirs + out, out_bias)
