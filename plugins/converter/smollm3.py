"""SmolLM3 (Hugging Face, 2025) <-> ``decoder_lm``: LLaMA's layout (RMSNorm, SwiGLU, GQA, RoPE
base 2e6, tied head) with NoPE layers — layers that rotate nothing and see positions only through
the causal mask (Kazemnejad et al., 2023).

``no_rope_layers`` (one 0/1 per layer, 1 = RoPE; by default a NoPE layer every
``no_rope_layer_interval`` = 4th) becomes ``layer_types`` {rope: {}, nope: {position: none}} with the
shortest ``pattern`` that repeats into it (5 layers, NoPE every 4th: [rope, rope, rope, nope]).
A ``sliding_attention`` entry of ``layer_types`` (by default the NoPE layers when
``use_sliding_window``) adds ``attention.window: sliding_window`` to that layer's type. On export
``no_rope_layers`` and ``layer_types`` are rebuilt from the recipe's layers.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from torch import nn

from seqzoo.builder import layer_plan
from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import GGUFArch
from seqzoo.io.gguf.arch import NORM_ROPE
from seqzoo.io.hf import layer_pattern
from seqzoo.io.hf.config import HFConfig
from seqzoo.io.hf.decoder import LLAMA_DEFAULTS, DecoderConverter, DecoderFamily
from seqzoo.registry import builtin

FULL, SLIDING = "full_attention", "sliding_attention"
Kind = tuple[bool, int | None]  # (rotates with RoPE, sliding window or None)


def _name(kind: Kind) -> str:
    rope, window = kind
    return ("rope" if rope else "nope") + ("_sliding" if window else "")


def _spec(kind: Kind) -> dict:
    rope, window = kind
    return {**({} if rope else {"position": "none"}), **({"attention": {"window": window}} if window else {})}


def nope_layers(layers: int) -> list[int]:
    """llama.cpp's smollm3 NoPE layers (0 = no RoPE): every fourth, 3, 7, 11, ..."""
    return [0 if (i + 1) % 4 == 0 else 1 for i in range(layers)]


def smollm3_problem(config) -> str | None:
    if list(config["no_rope_layers"]) != nope_layers(config["num_hidden_layers"]):
        return ("llama.cpp's smollm3 skips RoPE in layers 3, 7, 11, ... and no others; this model's no_rope_layers "
                f"are {config['no_rope_layers']}")
    if config.get("use_sliding_window") or "sliding_attention" in (config.get("layer_types") or []):
        return "llama.cpp's smollm3 has no sliding window; this model has one"
    return None


@builtin("Hugging Face SmolLM3 <-> decoder_lm (NoPE layers by layer_types)")
class SmolLM3Converter(DecoderConverter):
    """LLaMA's keys plus no_rope_layers, no_rope_layer_interval (4), use_sliding_window,
    sliding_window and layer_types; rope_theta defaults to 2e6, tie_word_embeddings to true."""

    family = DecoderFamily(
        "smollm3", "SmolLM3ForCausalLM", "SmolLM3", mlp_bias="mlp_bias",
        defaults={**LLAMA_DEFAULTS, "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 11008,
                  "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 4,
                  "max_position_embeddings": 32768, "tie_word_embeddings": True, "use_sliding_window": False,
                  "sliding_window": None, "no_rope_layers": None, "no_rope_layer_interval": 4, "layer_types": None})
    # llama.cpp's smollm3 is llama with RoPE skipped in every fourth layer, hard-coded.
    gguf = GGUFArch("smollm3", transforms=NORM_ROPE, problem=smollm3_problem,
                    config=lambda get: {"no_rope_layers": nope_layers(get("block_count")), "use_sliding_window": False,
                                        "sliding_window": None, "layer_types": None})

    def layer_kinds(self, c: dict) -> list[Kind]:
        """(RoPE?, window) of each layer, as SmolLM3Config and its attention read the config."""
        n = c["num_hidden_layers"]
        switch = c["no_rope_layers"]
        if switch is None:
            interval = HFConfig(c).positive_int("no_rope_layer_interval")
            switch = [int((i + 1) % interval != 0) for i in range(n)]
        if not isinstance(switch, list) or len(switch) < n or any(s not in (0, 1) for s in switch[:n]):
            raise CheckpointError(f"config.json: no_rope_layers {switch!r} is not supported; it must list 0 (NoPE) "
                                  f"or 1 (RoPE) for each of the {n} layers")
        use, window = c["use_sliding_window"], c["sliding_window"]
        types = c["layer_types"]
        if types is None:  # SmolLM3Config's default: the NoPE layers slide when a window is on
            types = [SLIDING if use and window is not None and not switch[i] else FULL for i in range(n)]
        if not isinstance(types, list) or len(types) < n or any(t not in (FULL, SLIDING) for t in types[:n]):
            raise CheckpointError(f"config.json: layer_types {types!r} is not supported; it must list "
                                  f"{FULL} or {SLIDING} for each of the {n} layers")
        if SLIDING in types[:n]:
            # The eager/sdpa mask slides whenever a layer is marked, flash attention only with
            # use_sliding_window: a config where they disagree has no single meaning.
            if not use:
                raise CheckpointError(f"config.json: layer_types marks {SLIDING} layers but use_sliding_window is "
                                      f"{use}; transformers' attention backends disagree on that, set it true or "
                                      f"mark the layers {FULL}")
            HFConfig(c).positive_int("sliding_window", why=f"{SLIDING} layers need a positive integer")
        return [(bool(switch[i]), window if types[i] == SLIDING else None) for i in range(n)]

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        # SmolLM3's rope_theta default differs from LLaMA's; an explicit one (either format) wins.
        recipe = super().recipe({**config, "rope_theta": config.get("rope_theta", 2000000.0)}, names)
        kinds = self.layer_kinds(self.config(config))
        recipe["model"].update(layer_types={_name(k): _spec(k) for k in dict.fromkeys(kinds)},
                               pattern=[_name(k) for k in layer_pattern(kinds)])
        return recipe

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if not m.get("pattern") and not m.get("layer_overrides"):
            return ("model.pattern is null; SmolLM3 marks each layer rope or nope (layer_types + pattern), "
                    "a uniform RoPE stack is LLaMA")
        if m["attention"] is None:
            return "model.attention is null; SmolLM3's layers attend"
        # The model-wide parts are LLaMA's; then each layer may only drop RoPE or slide.
        uniform = {**m, "layer_types": None, "pattern": None, "layer_overrides": None,
                   "attention": {**m["attention"], "window": None}}
        problem = super().accepts({**recipe, "model": uniform})
        if problem:
            return problem
        base = layer_plan(uniform)[0]
        windows = set()
        for i, plan in enumerate(layer_plan(m)):
            windows.add(plan.attention.window)
            nope = plan.position.get("kind") == "none"
            same = replace(plan, type=None, attention=replace(plan.attention, window=None),
                           position=base.position if nope else plan.position)
            if same != base:
                part = next(f for f in base.__dataclass_fields__ if getattr(same, f) != getattr(base, f))
                return (f"model layer {i}: its {part} differs from the model's; SmolLM3's layers differ only "
                        f"in position (the model's rope or none) and attention.window")
        if len(windows - {None}) > 1:
            return f"model.attention.window: layers use windows {sorted(windows - {None})}; SmolLM3 has one"
        return None

    def family_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        plans = layer_plan(m)
        window = next((p.attention.window for p in plans if p.attention.window is not None), None)
        return {**super().family_config(model),
                "no_rope_layers": [int(p.position.get("kind") != "none") for p in plans],
                "layer_types": [SLIDING if p.attention.window is not None else FULL for p in plans],
                "use_sliding_window": window is not None, "sliding_window": window}
