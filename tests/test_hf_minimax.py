"""MiniMax-01 against transformers: small random models with configs chosen to exercise what sets the
family apart — lightning-attention layers with their per-layer decay (each its own
``minimax_decay_scale``) among softmax-attention layers in an irregular order, the residual factors
α ≠ 1 and β ≠ 1 (MiniMax-Text-01's α = (2·80)^¼ too), GQA, head widths ≠ C / H (the lightning
layers' H·D ≠ C), 20 tokens (two lightning blocks of 8 and a part), a sliding window shorter than
the sequence, linear RoPE scaling, top-1 and top-2 routing, a tied head, random norms — imported
with ``seqzoo.from_hf`` and checked with the converter kit (logits ≤ 1e-4 in float32 plain and
left-padded, 32 greedy steps with and without the state cache against transformers' cached greedy
decoding, an exported folder transformers loads with the same logits), and the refusals.

transformers runs its PyTorch lightning attention here (its block loop for prompts, its recurrent
branch for cached steps) and its eager softmax attention.
"""
from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

import seqzoo
from seqzoo.builder import layer_plan
from seqzoo.errors import CheckpointError
from seqzoo.plugins.mixer.gla import minimax_decay_scale
from seqzoo.testing import parity

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.filterwarnings("ignore:.*no tokenizer written")  # random models have none

V = 96    # vocabulary of every test model
T = 20    # test sequence length: two lightning blocks of 8 and 4 tokens more
IDS = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=64)
MINIMAX = seqzoo.registry().get("converter", "minimax").cls()
LINEAR, FULL = "linear_attention", "full_attention"


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def factors(alpha: float, beta: float) -> dict:
    """The six residual factors, one α and one β for every sublayer."""
    return {f"{key}_{part}_factor": value for key in ("full_attn", "linear_attn", "mlp")
            for part, value in (("alpha", alpha), ("beta", beta))}


def minimax(**kw):
    # 4 heads of 16 (64 ≠ C = 48) over 2 KV heads; 4 experts of 40, top 2; lightning blocks of 8
    config = {**IDS, "hidden_size": 48, "intermediate_size": 40, "num_hidden_layers": 5, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
              "block_size": 8, "layer_types": [LINEAR, LINEAR, FULL, LINEAR, FULL], **factors(1.7, 0.6), **kw}
    return parity.randomised(transformers.MiniMaxForCausalLM(transformers.MiniMaxConfig(**config)))


MODELS = {
    # [lightning, lightning, attention, lightning, attention]; α 1.7, β 0.6
    "minimax-hybrid": lambda: minimax(),
    # transformers' default layout (attention first, alternating) over 4 layers; α = β = 1; 4 heads
    # of 8 = C, no GQA; a window of 6; linear RoPE scaling over θ 5000; 3 experts, top 1; tied head
    "minimax-default": lambda: minimax(hidden_size=32, num_hidden_layers=4, layer_types=None, head_dim=None,
                                       num_key_value_heads=4, sliding_window=6, num_local_experts=3,
                                       num_experts_per_tok=1, tie_word_embeddings=True, **factors(1, 1),
                                       rope_parameters={"rope_type": "linear", "rope_theta": 5000.0, "factor": 2.0}),
    # lightning only, 3 layers; MiniMax-Text-01's factors: α = (2·80)^¼, β = 1
    "minimax-lightning": lambda: minimax(num_hidden_layers=3, layer_types=[LINEAR] * 3, **factors(160 ** 0.25, 1)),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    return parity.cached_imports(lambda name: MODELS[name](), tmp_path_factory)


@pytest.mark.parametrize("name", list(MODELS))
def test_family_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits plain and left-padded (max |Δ| ≈ 2e-7), the export, 32 greedy steps with and without
    seqzoo's state cache equal to transformers' cached greedy decoding."""
    parity.check_causal_lm(imported(name), tmp_path / "out", T)


# -- what the imported recipes say -------------------------------------------------------------------
def test_recipe_is_a_post_norm_stack_with_the_factors_in_its_norms(imported):
    """n(α·s + β·F(s)) with ε is n(s + (β/α)·F(s)) with ε / α²; layer 0's input norm is the
    embedding norm."""
    m = imported("minimax-hybrid").model.recipe["model"]
    assert m["placement"] == "post" and m["embed_norm"] == {"kind": "rmsnorm", "eps": 1e-5}
    assert m["norm"]["eps"] == pytest.approx(1e-5 / 1.7 ** 2) and m["residual_multiplier"] == pytest.approx(0.6 / 1.7)
    assert m["pattern"] == ["lightning", "lightning", "attention", "lightning", "attention"]
    assert m["layer_types"] == {"lightning": {}, "attention": {"mixer": "attention"}}
    assert {k: m["mixer"][k] for k in ("kind", "heads", "head_dim", "value_head_dim", "decay", "feature_map",
                                       "scale", "norm", "gate", "norm_eps", "chunk")} == {
        "kind": "gla", "heads": 4, "head_dim": 16, "value_head_dim": 16, "decay": "head_fixed",
        "feature_map": "silu", "scale": 1.0, "norm": "whole", "gate": "sigmoid", "norm_eps": 1e-6, "chunk": 8}
    plans = layer_plan(m)
    assert [p.mixer.get("decay_scale") for p in plans] == [minimax_decay_scale(0, 5), minimax_decay_scale(1, 5),
                                                           None, minimax_decay_scale(3, 5), None]
    assert m["attention"]["kv_heads"] == 2 and m["attention"]["head_dim"] == 16
    assert m["ffn"]["router"] == {"kind": "softmax_topk", "normalize": True, "bias": False}
    assert m["position"]["base"] == 1e6  # MiniMaxConfig's default θ
    m = imported("minimax-default").model.recipe["model"]
    assert m["pattern"] == ["attention", "lightning"] and m["residual_multiplier"] == 1.0
    assert m["norm"]["eps"] == m["embed_norm"]["eps"] and m["attention"]["window"] == 6
    assert m["tie_embeddings"] is True and m["position"]["scaling"]["kind"] == "linear"


def test_the_lightning_rates_are_transformers_slopes(imported):
    """Each lightning layer's fixed rates are transformers' ``slope_rate`` buffer of that layer."""
    hf, model, _ = imported("minimax-hybrid")
    for i, layer in enumerate(hf.model.layers):
        if hasattr(layer.self_attn, "slope_rate"):
            rates = torch.tensor(model.decoder.blocks[i].mixer.rates)
            assert torch.allclose(-rates, layer.self_attn.slope_rate.flatten(), rtol=1e-6), i


@pytest.mark.parametrize("name, alpha, beta", [("minimax-hybrid", 1.7, 0.6), ("minimax-lightning", 160 ** 0.25, 1.0)])
def test_export_writes_the_factors_layer_types_and_no_decay_buffers(imported, name, alpha, beta, tmp_path):
    """The factors come back from the norms' ε (to rounding); the decay buffers are left to
    transformers, which computes them from the config as it loads."""
    hf, model, _ = imported(name)
    out = seqzoo.to_hf(model, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    for key in ("full_attn", "linear_attn", "mlp"):
        assert math.isclose(config[f"{key}_alpha_factor"], alpha, rel_tol=1e-12)
        assert math.isclose(config[f"{key}_beta_factor"], beta, rel_tol=1e-12)
    assert config["layer_types"] == hf.config.layer_types and config["block_size"] == 8
    assert not any("slope_rate" in n or "decay" in n for n in load_file(out / "model.safetensors"))
    again = transformers.MiniMaxForCausalLM.from_pretrained(out, dtype=torch.float32)
    for theirs, ours in zip(hf.model.layers, again.model.layers, strict=True):
        if hasattr(theirs.self_attn, "slope_rate"):
            assert torch.equal(theirs.self_attn.slope_rate, ours.self_attn.slope_rate)


# -- refusals ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, match", [
    ({"linear_attn_alpha_factor": 2.0}, r"config\.json: linear_attn_alpha_factor 2\.0 is not supported; .*scales "
                                        r"both sublayers of a layer alike: it must equal mlp_alpha_factor 1\.7"),
    ({"full_attn_beta_factor": 0.5}, r"full_attn_beta_factor 0\.5 is not supported; .*mlp_beta_factor 0\.6"),
    ({"mlp_beta_factor": 0}, r"mlp_beta_factor 0 is not supported; it must be a positive number"),
    ({"layernorm_mlp_alpha": 3.0}, r"layernorm_mlp_alpha 3\.0 is not supported; it must agree with "
                                   r"mlp_alpha_factor 1\.7, which transformers reads"),
    ({"attn_type_list": [1, 0, 1, 0, 1]}, r"attn_type_list \[1, 0, 1, 0, 1\] is not supported; it must agree "
                                          r"with layer_types"),
    ({"postnorm": False}, r"postnorm False is not supported; transformers' MiniMax keeps the normed input"),
    ({"router_jitter_noise": 0.1}, r"router_jitter_noise 0\.1 is not supported"),
    ({"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported; the lightning layers apply it to q, k and v"),
    ({"layer_types": [LINEAR, FULL]}, r"layer_types .* is not supported; it must list num_hidden_layers = 5"),
    ({"layer_types": ["mamba"] * 5}, r"layer_types .* is not supported; it must list .* linear_attention, "
                                     r"full_attention"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}},
     r"partial_rotary_factor 0\.5 is not supported for minimax \(it rotates whole heads\)"),
])
def test_unsupported_config_option_is_refused_in_one_line(imported, tmp_path, change, match):
    parity.check_refused(imported("minimax-hybrid").folder, tmp_path / "bad", change, match)


def test_remote_code_keys_that_agree_are_read(imported, tmp_path):
    """MiniMax's own config names (attn_type_list, layernorm_*_alpha/beta, postnorm) may sit beside
    transformers' when they say the same."""
    hf, _, folder = imported("minimax-hybrid")
    config = {**json.loads((folder / "config.json").read_text()), "attn_type_list": [0, 0, 1, 0, 1], "postnorm": True,
              **{f"layernorm_{k}_{p}": v for k in ("full_attention", "linear_attention", "mlp")
                 for p, v in (("alpha", 1.7), ("beta", 0.6))}}
    model = seqzoo.from_hf(parity.edited_copy(folder, tmp_path / "remote", config))
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL


def test_num_experts_is_read_as_transformers_reads_it(imported, tmp_path):
    """MiniMaxConfig maps ``num_experts`` onto ``num_local_experts``; a config that names only it
    has as many experts."""
    hf, _, folder = imported("minimax-hybrid")
    config = json.loads((folder / "config.json").read_text())
    config["num_experts"] = config.pop("num_local_experts")
    edited = parity.edited_copy(folder, tmp_path / "renamed", config)
    assert transformers.MiniMaxConfig.from_pretrained(edited).num_local_experts == 4
    model = seqzoo.from_hf(edited)
    assert model.recipe["model"]["ffn"]["experts"] == 4


def with_model(recipe: dict, **changes) -> dict:
    return {**recipe, "model": {**recipe["model"], **changes}}


@pytest.mark.parametrize("changes, reason", [
    ({"placement": "pre"}, "model.placement must be post"),
    ({"embed_norm": None}, "model.embed_norm must be rmsnorm"),
    ({"ffn": {"kind": "swiglu", "hidden": 40}}, "model.ffn is swiglu; every MiniMax layer is a mixture of experts"),
    ({"final_softcap": 30.0}, "MiniMax has no softcap"),
    ({"layer_overrides": {0: {"mixer": {"decay_scale": 0.5}}}}, "decay_scale is not minimax_decay_scale"),
    ({"layer_overrides": {}}, "decay_scale is not minimax_decay_scale"),
    ({"position": "none"}, "model.position is none, needs rope"),
])
def test_exporter_refuses_what_minimax_cannot_express(imported, changes, reason):
    recipe = imported("minimax-hybrid").model.recipe
    found = MINIMAX.accepts(with_model(recipe, **changes))
    assert found is not None and reason in found, found


@pytest.mark.parametrize("part, change, reason", [
    ("mixer", {"norm": "head"}, "MiniMax's lightning attention is gla with decay head_fixed"),
    ("mixer", {"head_dim": 8, "value_head_dim": 8}, "heads and head widths as the attention's"),
    ("attention", {"bias": True}, "MiniMax has no biases"),
    ("attention", {"qk_norm": "rmsnorm"}, "plain GQA"),
    ("ffn", {"router": {"kind": "softmax_topk", "normalize": False}}, "router.normalize must be True for MiniMax"),
])
def test_exporter_refuses_parts_minimax_has_not(imported, part, change, reason):
    recipe = imported("minimax-hybrid").model.recipe
    found = MINIMAX.accepts(with_model(recipe, **{part: {**recipe["model"][part], **change}}))
    assert found is not None and reason in found, found


def test_other_models_are_not_minimax():
    for name in ("tiny-gla", "tiny-llama", "tiny-moe", "tiny-xlstm"):
        assert MINIMAX.accepts(seqzoo.build(name, device="meta").recipe) is not None, name
    with pytest.raises(CheckpointError, match="cannot export as minimax"):
        seqzoo.to_hf(seqzoo.build("tiny-gla", device="meta"), "unused", model_type="minimax")
