"""ModernBERT (Warner et al., 2024) <-> ``encoder``: a pre-norm bidirectional stack with RoPE, a
global layer every ``global_attn_every_n_layers`` (3) layers and a local one elsewhere, no biases,
GeGLU and LayerNorms without bias.

- Embeddings: ``tok_embeddings`` then a LayerNorm (``embed_norm``); no position table, no token
  types. Layer 0 has no attention norm (its input is that norm's output):
  ``layer_overrides: {0: {mixer_norm: false}}``.
- Layer i is global when i % n == 0 (or as ``layer_types`` lists): layer types ``global`` (the
  model's RoPE, base ``global_rope_theta`` 160000) and ``local`` (base ``local_rope_theta`` 10000,
  and a window). A local query i sees keys j with |i − j| ≤ ``local_attention`` // 2, which is
  seqzoo's bidirectional ``window: local_attention // 2 + 1`` (|i − j| < W).
- ``Wqkv`` rows are [q | k | v], seqzoo's own layout; ``mlp.Wi`` rows are [input | gate] and the
  MLP is Wo(act(input) · gate), so the activated half is GeGLU's ``gate`` and the other its ``up``.
- ``ModernBertForMaskedLM``'s head — dense, activation, LayerNorm, and a decoder tied to the
  embedding with its own bias — is the encoder's ``mlm_head``.
"""
from __future__ import annotations

from collections.abc import Collection

from torch import nn

from seqzoo.builder import layer_plan
from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import GGUFArch, Key
from seqzoo.io.gguf.arch import layer_types, sliding_flags
from seqzoo.io.hf import (
    ACTIVATIONS,
    HFConverter,
    Rule,
    activation_name,
    activation_spec,
    copy,
    ffn_activation,
    first_problem,
    glu_ffn,
    kind_of,
    layer_pattern,
    linear,
    norm,
    special_ids,
    split,
)
from seqzoo.io.hf.config import HFConfig
from seqzoo.io.hf.rope import rope_parameters, rope_problem, rope_spec
from seqzoo.registry import builtin

DEFAULTS = {"vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
            "num_attention_heads": 12, "hidden_activation": "gelu", "max_position_embeddings": 8192,
            "initializer_range": 0.02, "norm_eps": 1e-5, "norm_bias": False, "attention_bias": False,
            "attention_dropout": 0.0, "layer_types": None, "rope_parameters": None, "rope_scaling": None,
            "local_attention": 128, "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0,
            "local_rope_theta": 10000.0, "embedding_dropout": 0.0, "mlp_bias": False, "mlp_dropout": 0.0,
            "tie_word_embeddings": True, "classifier_activation": "gelu", "classifier_bias": False,
            "decoder_bias": True}
GLOBAL, LOCAL = "full_attention", "sliding_attention"
#: Options whose non-default value changes the math in a way seqzoo's encoder does not reproduce.
#: (The dropouts apply while training: ModernBERT drops the embeddings alone and the attention
#: output as well as its weights, which seqzoo places differently.)
REFUSED = {"embedding_dropout": 0.0, "attention_dropout": 0.0}


def _activation(name: str) -> str | dict:
    """seqzoo's activation spec for ``classifier_activation`` (the MLM head's)."""
    if name not in ACTIVATIONS:
        raise CheckpointError(f"config.json: modernbert classifier_activation {name!r} has no seqzoo "
                              f"equivalent; supported: {', '.join(sorted(ACTIVATIONS))}")
    return activation_spec(name)


def _hf_name(activation: str | dict) -> str | None:
    """The HF name of a resolved activation spec (ModernBERT calls tanh-GELU gelu_pytorch_tanh)."""
    return activation_name(activation, "gelu_pytorch_tanh")


def modernbert_gguf_problem(config) -> str | None:
    if config.get("norm_bias") or config.get("attention_bias") or config.get("mlp_bias"):
        return "llama.cpp's modern-bert has no biases; this model has some"
    ropes = config["rope_parameters"]
    if any(ropes[kind].get("rope_type", "default") != "default" for kind in ropes):
        return "llama.cpp's modern-bert reads plain RoPE; this model scales it"
    return None


def modernbert_gguf_config(get) -> dict:
    flags = list(get("attention.sliding_window_pattern"))
    return {"layer_types": layer_types(flags), "norm_bias": False, "attention_bias": False, "mlp_bias": False,
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": float(get("rope.freq_base"))},
                                "sliding_attention": {"rope_type": "default",
                                                      "rope_theta": float(get("rope.freq_base_swa"))}}}


@builtin("Hugging Face ModernBERT <-> encoder (local/global RoPE layers, GeGLU)")
class ModernBertConverter(HFConverter):
    """config.json keys: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    hidden_activation, max_position_embeddings, norm_eps, norm_bias, attention_bias, mlp_bias,
    local_attention, layer_types (or global_attn_every_n_layers), rope_parameters per layer type
    (or global_rope_theta, local_rope_theta and rope_scaling), mlp_dropout, tie_word_embeddings."""

    model_type = "modernbert"
    architecture = "ModernBertModel"
    # llama.cpp's modern-bert computes embeddings: the masked-LM head and decoder are left out; a
    # symmetric window on the local layers, their own RoPE base, GeGLU by hidden_activation.
    gguf = GGUFArch("modern-bert", rope=False, output="never", drop=(r"^head\.", r"^decoder\."),
                    keys=(Key("block_count", "num_hidden_layers"), Key("context_length", "max_position_embeddings"),
                          Key("embedding_length", "hidden_size"), Key("feed_forward_length", "intermediate_size"),
                          Key("attention.head_count", "num_attention_heads"),
                          Key("attention.layer_norm_epsilon", "norm_eps", "f32"),
                          Key("attention.sliding_window", "local_attention"),
                          Key("hidden_activation", "hidden_activation", "str", "gelu")),
                    fixed={"attention.causal": False}, problem=modernbert_gguf_problem,
                    export=lambda c: {"rope.freq_base": float(c["rope_parameters"]["full_attention"]["rope_theta"]),
                                      "rope.freq_base_swa":
                                          float(c["rope_parameters"]["sliding_attention"]["rope_theta"]),
                                      "attention.sliding_window_pattern": sliding_flags(c)},
                    config=modernbert_gguf_config)

    def config(self, config: dict) -> dict:
        c = HFConfig(config, DEFAULTS)
        for key, default in REFUSED.items():
            if c[key] != default:
                raise CheckpointError(f"config.json: modernbert {key} {c[key]} is not supported (seqzoo's "
                                      f"encoder places its dropouts differently); set it to {default}")
        layers, heads = c["num_hidden_layers"], c["num_attention_heads"]
        head_dim = c["hidden_size"] // heads
        if c["hidden_size"] % heads or c.get("head_dim") not in (None, head_dim):
            raise CheckpointError(f"config.json: modernbert hidden_size {c['hidden_size']} with "
                                  f"{heads} heads and head_dim {c.get('head_dim')} is not supported; "
                                  f"heads must divide hidden_size into head_dim")
        every = c["global_attn_every_n_layers"]
        types = c["layer_types"] or [LOCAL if i % every else GLOBAL for i in range(layers)]
        bad = sorted({t for t in types if t not in (GLOBAL, LOCAL)})
        if bad or len(types) != layers:
            raise CheckpointError(f"config.json: modernbert layer_types {types} is not supported; it must "
                                  f"list {layers} entries of {GLOBAL!r} or {LOCAL!r}")
        c["layer_types"], c["head_dim"] = types, head_dim
        if c.get("sliding_window") is not None:  # transformers' setter: the half-width, it wins
            c["local_attention"] = 2 * c["sliding_window"]
        # transformers 5 keys rope_parameters by layer type; a legacy rope_scaling goes to both, and
        # global_rope_theta / local_rope_theta give each its base when it has none. As there, a
        # legacy {type: linear} leaves rope_type default, and transformers ignores its factor.
        given = c["rope_parameters"] or {}
        if given and not set(given) <= {GLOBAL, LOCAL}:
            raise CheckpointError(f"config.json: modernbert rope_parameters must be keyed by layer type "
                                  f"({GLOBAL}, {LOCAL}), got keys {sorted(given)}")
        rope = {}
        for kind, theta in ((GLOBAL, c["global_rope_theta"]), (LOCAL, c["local_rope_theta"])):
            params = {"rope_type": "default", **(given.get(kind) or {}), **(c["rope_scaling"] or {})}
            params.setdefault("rope_theta", theta)
            if params.get("rope_type", params.get("type")) == "dynamic":
                raise CheckpointError(f"config.json: modernbert rope_type 'dynamic' ({kind}) is not supported")
            rope[kind] = rope_spec({"model_type": "modernbert", "rope_parameters": params}, head_dim,
                                   c["max_position_embeddings"])
        c["rope"] = rope
        return c

    def canonical_names(self, names: Collection[str]) -> dict[str, str]:
        """Task models keep the encoder under ``model.``; ModernBertModel has no prefix."""
        return {n.removeprefix("model."): n for n in names}

    @staticmethod
    def masked_lm(names: Collection[str]) -> bool:
        """ModernBertForMaskedLM's head is there (a classifier's head is not this one)."""
        return "head.dense.weight" in names and not any(n.startswith("classifier.") for n in names)

    def recipe(self, config: dict, names: Collection[str] = ()) -> dict:
        c = self.config(config)
        ln = {"kind": "layernorm", "eps": c["norm_eps"], "bias": c["norm_bias"]}
        types, rope = c["layer_types"], c["rope"]
        model = {
            "kind": "encoder", "vocab_size": c["vocab_size"], "dim": c["hidden_size"],
            "layers": c["num_hidden_layers"], "max_seq_len": c["max_position_embeddings"],
            "position": rope[GLOBAL if GLOBAL in types else LOCAL], "norm": ln, "embed_norm": ln,
            "placement": "pre",
            "attention": {"heads": c["num_attention_heads"], "score": "scaled_dot",
                          "bias": c["attention_bias"], "dropout": 0.0},
            "ffn": {**glu_ffn(c["hidden_activation"], c["intermediate_size"], c["mlp_bias"]),
                    "dropout": c["mlp_dropout"]},
            "type_vocab_size": 0, "pooler": False, "dropout": 0.0, "init_std": c["initializer_range"],
        }
        window = c["local_attention"] // 2 + 1  # |i − j| ≤ local_attention // 2
        if set(types) == {GLOBAL, LOCAL}:
            position = {k: v for k, v in rope[LOCAL].items() if rope[GLOBAL].get(k) != v}
            if isinstance(position.get("scaling"), dict) and rope[GLOBAL].get("scaling"):
                # A layer type's mapping merges into the model's: null the global-only keys
                # (yarn's optional attention_factor / mscale, whose defaults are null).
                position["scaling"] = {**dict.fromkeys(rope[GLOBAL]["scaling"]), **position["scaling"]}
            model["layer_types"] = {"global": {}, "local": {"attention": {"window": window}, "position": position}}
            model["pattern"] = layer_pattern(["global" if t == GLOBAL else "local" for t in types])
        elif LOCAL in types:
            model["attention"]["window"] = window
        model["layer_overrides"] = {0: {"mixer_norm": False}}
        if self.masked_lm(names):
            if not c["tie_word_embeddings"]:
                raise CheckpointError("config.json: modernbert tie_word_embeddings false is not supported "
                                      "(seqzoo's masked-LM decoder is the token embedding)")
            # The head's norm is the model's LayerNorm (norm_eps, norm_bias): norm null.
            model["mlm_head"] = {"activation": _activation(c["classifier_activation"]),
                                 "bias": c["classifier_bias"], "norm": None, "decoder_bias": c["decoder_bias"]}
        return {"model": model}

    def rules(self, config: dict, recipe: dict) -> list[Rule]:
        c = self.config(config)
        bias, f = c["norm_bias"], c["intermediate_size"]
        rules = [copy("embed.weight", "embeddings.tok_embeddings.weight"),
                 *norm("encoder.embed_norm", "embeddings.norm", bias)]
        for i in range(c["num_hidden_layers"]):
            h, b = f"layers.{i}.", f"encoder.blocks.{i}."
            if i:  # layer 0's attention norm is an Identity
                rules += norm(b + "mixer_norm", h + "attn_norm", bias)
            rules += linear(b + "mixer.qkv_proj", h + "attn.Wqkv", c["attention_bias"])
            rules += linear(b + "mixer.out_proj", h + "attn.Wo", c["attention_bias"])
            rules += norm(b + "ffn_norm", h + "mlp_norm", bias)
            for part in ("weight", "bias") if c["mlp_bias"] else ("weight",):
                rules.append(split((f"{b}ffn.gate.{part}", f"{b}ffn.up.{part}"), f"{h}mlp.Wi.{part}", (f, f)))
            rules += linear(b + "ffn.down", h + "mlp.Wo", c["mlp_bias"])
        rules += norm("encoder.final_norm", "final_norm", bias)
        if recipe["model"].get("mlm_head"):
            rules += linear("mlm_head.dense", "head.dense", c["classifier_bias"])
            rules += norm("mlm_head.norm", "head.norm", bias)
            rules += [copy("mlm_head.bias", "decoder.bias")] if c["decoder_bias"] else []
        return rules

    def aliases(self, config: dict, recipe: dict) -> dict[str, str]:
        tied = recipe["model"].get("mlm_head")
        return {"decoder.weight": "embeddings.tok_embeddings.weight"} if tied else {}

    def accepts(self, recipe: dict) -> str | None:
        m = recipe["model"]
        if m["kind"] != "encoder":
            return f"model.kind is {m['kind']}, needs encoder"
        act, head = ffn_activation(m["ffn"], "gelu_pytorch_tanh"), m.get("mlm_head")
        problem = first_problem(
            (kind_of(m["norm"]) == "layernorm" and m["embed_norm"] == m["norm"],
             "model.norm must be a layernorm, and model.embed_norm the same (ModernBERT's embedding norm)"),
            (m["placement"] == "pre" and m["residual"] == "sequential" and m["mixer"] is None,
             "model.placement must be pre, with sequential attention layers"),
            (act is not None and act[1], "model.ffn must be gated (geglu) with a named activation"),
            (m["type_vocab_size"] == 0 and not m["pooler"] and m.get("padding_idx") is None,
             "model: ModernBERT has no token types, no pooler and no padding_idx"),
            (m["dropout"] == 0, "model.dropout must be 0 (ModernBERT places its dropouts elsewhere)"),
            (head is None or (head["norm"] in (None, m["norm"]) and _hf_name(head["activation"]) is not None),
             "model.mlm_head: ModernBERT's head norm is the model's (norm: null), its activation has an HF name"),
        )
        plans = layer_plan(m)
        first = {k: v for k, v in vars(plans[0].attention).items() if k != "window"}
        for i, plan in enumerate(plans):
            a = plan.attention
            problem = problem or first_problem(
                (plan.mixer_norm == (i > 0), f"layer {i}: ModernBERT has an attention norm on every layer but "
                                            f"the first (layer_overrides: {{0: {{mixer_norm: false}}}})"),
                ((plan.mixer["kind"], plan.placement, plan.residual, plan.norm, plan.ffn)
                 == ("attention", "pre", "sequential", m["norm"], m["ffn"]),
                 f"layer {i}: ModernBERT's layers are the model's pre-norm attention layers"),
                ({k: v for k, v in vars(a).items() if k != "window"} == first,
                 f"layer {i}: attention differs from layer 0's in more than its window"),
                (a.kv_heads in (None, a.heads) and a.head_dim in (None, m["dim"] // a.heads) and a.qk_norm is None
                 and a.softcap is None and not a.sinks and a.out_bias in (None, a.bias) and a.dropout == 0
                 and a.score == {"kind": "scaled_dot", "scale": None},
                 f"layer {i}: ModernBERT's attention is plain scaled-dot MHA, one bias setting, no dropout"),
                (kind_of(plan.position) == "rope", f"layer {i}: ModernBERT rotates with rope"),
            ) or rope_problem(plan.position, m["max_seq_len"], m["dim"] // a.heads)
        for kind in ("global", "local"):
            found = [p for p in plans if (p.attention.window is None) == (kind == "global")]
            if len({repr(p.position) for p in found}) > 1 or len({p.attention.window for p in found}) > 1:
                problem = problem or f"model: ModernBERT's {kind} layers share one window and one rope"
        return problem

    def hf_config(self, model: nn.Module) -> dict:
        m = model.recipe["model"]
        plans = layer_plan(m)
        types = [GLOBAL if p.attention.window is None else LOCAL for p in plans]
        position = {t: next((p.position for p, u in zip(plans, types) if u == t), None) for t in (GLOBAL, LOCAL)}
        rope = {t: rope_parameters(spec, m["max_seq_len"]) if spec else {"rope_type": "default"}
                for t, spec in position.items()}
        rope[GLOBAL].setdefault("rope_theta", DEFAULTS["global_rope_theta"])
        rope[LOCAL].setdefault("rope_theta", DEFAULTS["local_rope_theta"])
        window = next((p.attention.window for p in plans if p.attention.window), None)
        act, _ = ffn_activation(m["ffn"], "gelu_pytorch_tanh")
        ids, attn = special_ids(model), plans[0].attention
        head = m.get("mlm_head")
        if head is not None:
            head_config = {"architectures": ["ModernBertForMaskedLM"], "classifier_bias": head["bias"],
                           "classifier_activation": _hf_name(head["activation"]), "decoder_bias": head["decoder_bias"]}
        else:
            head_config = {"architectures": [self.architecture]}
        config = {
            "vocab_size": m["vocab_size"], "hidden_size": m["dim"],
            "intermediate_size": model.encoder.blocks[0].ffn.hidden,
            "num_hidden_layers": m["layers"], "num_attention_heads": attn.heads,
            "hidden_activation": act, "max_position_embeddings": m["max_seq_len"], "norm_eps": m["norm"]["eps"],
            "norm_bias": m["norm"]["bias"], "attention_bias": attn.bias, "mlp_bias": m["ffn"]["bias"],
            "mlp_dropout": m["ffn"]["dropout"], "attention_dropout": 0.0, "embedding_dropout": 0.0,
            # local_attention is the whole window, 2(W − 1); transformers 4 reads the older keys.
            "local_attention": 2 * (window - 1) if window else DEFAULTS["local_attention"],
            "layer_types": types, "rope_parameters": rope, "global_rope_theta": rope[GLOBAL]["rope_theta"],
            "local_rope_theta": rope[LOCAL]["rope_theta"], "initializer_range": m["init_std"],
            "tie_word_embeddings": True, **ids, "cls_token_id": ids["bos_token_id"],
            "sep_token_id": ids["eos_token_id"], **head_config}
        every = [n for n in range(1, len(types) + 1)
                 if types == [LOCAL if i % n else GLOBAL for i in range(len(types))]]
        if every:
            config["global_attn_every_n_layers"] = every[0]
        return config
