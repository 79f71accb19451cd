"""OLMo-Hybrid against transformers: small random models with configs chosen to exercise what sets
it apart — pre-norm gated-delta layers beside output-norm OLMo 2 attention layers, QK-norm over the
whole projections, β = 2σ(b) (``linear_allow_neg_eigval``) and σ(b), more value heads than key heads
with values twice as wide (the family's default) and narrower, 70 tokens (one 64-token chunk and a
part of the next), GQA over an odd head count, head_dim ≠ C / H, biases on q/k/v/o, RoPE and NoPE
(``rope_theta`` null), a tied head — imported with ``seqzoo.from_hf`` and checked with the converter
kit (logits ≤ 1e-4 float32 plain and left-padded, 32 greedy steps with and without the state cache
against transformers' cached greedy decoding, an exported folder transformers loads).

transformers 5 saves the fused conv of a gated-delta layer as ``q/k/v_conv1d`` cut into three equal
chunks (its ``Concatenate``'s reverse is a ``Chunk``), not at the q/k/v boundaries where OLMo-core's
checkpoints cut it; seqzoo reads either and writes OLMo-core's."""
from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file

import seqzoo
from seqzoo.recipe import resolve
from seqzoo.testing import parity

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.filterwarnings("ignore:.*no tokenizer written")  # random models have none

V = 128   # vocabulary of every test model
T = 70    # test sequence length: one 64-token chunk of the gated-delta rule and part of the next
# 5 attention heads of 8 over 1 KV head; delta layers: 2 key heads of 8, 4 value heads of 16
CONFIG = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=256,
              initializer_range=0.06, hidden_size=40, intermediate_size=56, num_attention_heads=5,
              num_key_value_heads=1, linear_num_key_heads=2, linear_key_head_dim=8, linear_num_value_heads=4,
              linear_value_head_dim=16, linear_conv_kernel_dim=4)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def olmo_hybrid(**kw):
    model = transformers.OlmoHybridForCausalLM(transformers.OlmoHybridConfig(**{**CONFIG, **kw}))
    return parity.randomised(model)


MODELS = {
    # [delta ×3, attention, delta]: the default layout cut short; β = 2σ(b); biases on q/k/v/o
    "olmo-hybrid": lambda: olmo_hybrid(num_hidden_layers=5, attention_bias=True),
    # NoPE, [attention, delta, delta], β = σ(b), value heads narrower than keys (3 per key head),
    # head_dim 12 ≠ 40 / 5, a tied head, ε 1e-5
    "olmo-hybrid-nope": lambda: olmo_hybrid(
        num_hidden_layers=3, layer_types=["full_attention", "linear_attention", "linear_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": None}, linear_allow_neg_eigval=False,
        linear_num_value_heads=6, linear_value_head_dim=4, head_dim=12, tie_word_embeddings=True,
        rms_norm_eps=1e-5),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    return parity.cached_imports(lambda name: MODELS[name](), tmp_path_factory)


@pytest.mark.parametrize("name", MODELS)
def test_family_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits plain and left-padded, 32 greedy steps with and without the state cache, the export."""
    parity.check_causal_lm(imported(name), tmp_path / "out", T)


def test_recipe_reads_two_placements_and_the_delta_layers(imported):
    m = imported("olmo-hybrid").model.recipe["model"]
    assert m["pattern"] == ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    assert m["layer_types"] == {"linear_attention": {},
                                "full_attention": {"mixer": "attention", "placement": "output"}}
    assert m["placement"] == "pre" and m["norm"] == {"kind": "rmsnorm", "eps": 1e-6}
    assert m["attention"]["qk_norm_scope"] == "projection" and m["attention"]["bias"] is True
    assert {k: m["mixer"][k] for k in ("heads", "head_dim", "value_heads", "value_head_dim", "allow_neg_eigval",
                                       "norm_eps")} == {
        "heads": 2, "head_dim": 8, "value_heads": 4, "value_head_dim": 16, "allow_neg_eigval": True, "norm_eps": 1e-5}
    m = imported("olmo-hybrid-nope").model.recipe["model"]
    assert m["position"]["kind"] == "none" and m["mixer"]["allow_neg_eigval"] is False and m["tie_embeddings"]
    assert m["attention"]["head_dim"] == 12 and m["pattern"] == ["full_attention", "linear_attention",
                                                                 "linear_attention"]


def test_the_blocks_norm_where_transformers_does(imported):
    model = imported("olmo-hybrid").model
    delta, attention = model.decoder.blocks[0], model.decoder.blocks[3]
    assert delta.mixer_norm is not None and delta.ffn_norm is not None and delta.mixer_out_norm is None
    assert attention.mixer_norm is None and attention.mixer_out_norm is not None and attention.ffn_out_norm is not None


def test_the_conv_is_read_however_its_parts_are_cut_and_written_at_q_k_v(imported, tmp_path):
    hf, model, folder = imported("olmo-hybrid")
    stored = load_file(folder / "model.safetensors")
    cut = [stored[f"model.layers.0.linear_attn.{p}_conv1d.weight"].shape[0] for p in "qkv"]
    assert cut == [32, 32, 32]  # transformers' three chunks of the 16 + 16 + 64 channels
    out = seqzoo.to_hf(model, tmp_path / "out")
    written = load_file(out / "model.safetensors")
    assert [written[f"model.layers.0.linear_attn.{p}_conv1d.weight"].shape[0] for p in "qkv"] == [16, 16, 64]
    again = seqzoo.from_hf(out)  # OLMo-core's cut reads back as well
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        assert parity.max_difference(again(ids), hf(ids).logits) < parity.TOL


def test_a_conv_of_the_wrong_size_in_all_is_named(imported, tmp_path):
    _, _, folder = imported("olmo-hybrid")
    config = json.loads((folder / "config.json").read_text())
    name = "model.layers.1.linear_attn.v_conv1d.weight"
    bad = parity.edited_copy(folder, tmp_path / "bad", config, extra={name: torch.zeros(40, 1, 4)})  # 8 too many
    with pytest.raises(seqzoo.errors.CheckpointError,
                       match=r"linear_attn.q_conv1d.weight \+ .*v_conv1d.weight \(104, 1, 4\) != \(96, 1, 4\)"):
        seqzoo.from_hf(bad)


def test_layer_kinds_default_to_every_fourth_and_the_last(imported):
    converter = seqzoo.registry().get("converter", "olmo_hybrid").cls()
    config = json.loads((imported("olmo-hybrid").folder / "config.json").read_text())
    for layers in (2, 5, 9):
        config = {k: v for k, v in config.items() if k != "layer_types"} | {"num_hidden_layers": layers}
        theirs = transformers.OlmoHybridConfig(**config).layer_types
        pattern = converter.recipe(config)["model"]["pattern"]
        assert [pattern[i % len(pattern)] for i in range(layers)] == theirs


# -- refusals ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, match", [
    ({"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported; its gated-delta layers run their conv"),
    ({"linear_num_value_heads": 3}, r"linear_num_value_heads 3 is not supported; it must be a multiple of "
                                    r"linear_num_key_heads 2"),
    ({"linear_allow_neg_eigval": "yes"}, r"linear_allow_neg_eigval 'yes' is not supported; it must be true or false"),
    ({"layer_types": ["linear_attention", "sliding_attention"] * 2 + ["full_attention"]},
     r"each linear_attention or full_attention"),
    ({"intermediate_size": 0}, r"intermediate_size 0 is not supported"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, r"rope_type 'longrope' is not supported"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     r"partial_rotary_factor 0.5 is not supported for olmo_hybrid"),
])
def test_unsupported_config_option_is_refused_in_one_line(imported, tmp_path, change, match):
    parity.check_refused(imported("olmo-hybrid").folder, tmp_path / "bad", change, match)


def with_model(recipe: dict, **changes) -> dict:
    return {**recipe, "model": {**recipe["model"], **changes}}


@pytest.mark.parametrize("change, match", [
    ({"layer_types": {"linear_attention": {}, "full_attention": {"mixer": "attention"}}},
     r"gated-delta layers are pre-norm, its attention layers output-norm"),
    ({"pattern": ["linear_attention"]}, r"gated_deltanet and attention layers, at least one of each"),
    ({"mixer": "mamba2"}, r"gated_deltanet and attention layers"),
    ({"norm": {"kind": "layernorm"}}, r"model.norm is layernorm, needs rmsnorm"),
    ({"position": "alibi"}, r"model.position is alibi, needs rope or none"),
    ({"ffn": {"kind": "gelu", "hidden": 56}}, r"model.ffn must be swiglu without biases"),
    ({"layer_overrides": {0: {"mixer": {"conv": 3}}}}, r"the gated-delta layers differ"),
    ({"layer_overrides": {3: {"ffn": {"hidden": 32}}}}, r"differ only in their mixer and norm placement"),
    ({"residual_multiplier": 2.0}, r"adds its sublayers in sequence, unscaled"),
    ({"embed_norm": {"kind": "rmsnorm"}}, r"model.embed_norm is set; OLMo-Hybrid has none"),
])
def test_exporter_refuses_what_olmo_hybrid_cannot_express(imported, change, match):
    converter = seqzoo.registry().get("converter", "olmo_hybrid").cls()
    problem = converter.accepts(resolve(with_model(imported("olmo-hybrid").model.recipe, **change)).data)
    assert problem is not None and re.search(match, problem), problem


@pytest.mark.parametrize("part, change, match", [
    ("attention", {"qk_norm_scope": "head"}, r"qk_norm must be rmsnorm over each projection"),
    ("attention", {"output_gate": True}, r"output_gate must be false for OLMo-Hybrid"),
    ("attention", {"softcap": 30.0}, r"softcap is set; OLMo-Hybrid has none"),
    ("mixer", {"norm_eps": 1e-6}, r"norm_eps 1e-06 must be 1e-05 \(OLMo-Hybrid's o_norm\)"),
    ("mixer", {"gate": False}, r"gate is false \(DeltaNet\)"),
])
def test_exporter_refuses_attention_and_delta_options_it_lacks(imported, part, change, match):
    converter = seqzoo.registry().get("converter", "olmo_hybrid").cls()
    recipe = imported("olmo-hybrid").model.recipe
    problem = converter.accepts(resolve(with_model(recipe, **{part: {**recipe["model"][part], **change}})).data)
    assert problem is not None and re.search(match, problem), problem
