"""GPT-NeoX (Pythia) and SmolLM3 against transformers: small random models of each family, with
configs chosen to exercise what sets them apart — parallel and sequential residuals, partial rotary
(a quarter and a half of each head), per-head fused q/k/v with an odd head count, LayerNorm biases;
NoPE layers from ``no_rope_layers`` (periodic, every 4th over 5 layers, and an irregular list),
sliding windows shorter than the sequence, GQA and MQA, RoPE scaling — imported with
``seqzoo.from_hf``, checked with the converter kit (logits ≤ 1e-4 float32 plain and left-padded,
32 greedy steps with and without the KV cache, an exported folder transformers loads)."""
from __future__ import annotations

import json

import pytest
import torch

import seqzoo
from seqzoo.errors import CheckpointError
from seqzoo.testing import parity

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.filterwarnings("ignore:.*no tokenizer written")  # random models have none

V = 128   # vocabulary of every test model
T = 20    # test sequence length: longer than every window below
IDS = dict(vocab_size=V, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def neox(**kw):
    # hidden 40 over 5 heads: D = 8, an odd head count through the per-head fused q/k/v
    config = {**IDS, "hidden_size": 40, "num_attention_heads": 5, "num_hidden_layers": 3, "intermediate_size": 64, **kw}
    return parity.randomised(transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**config)))


def smollm3(**kw):
    config = {**IDS, "intermediate_size": 64, **kw}
    return parity.randomised(transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(**config)))


def rope(kind: str, theta: float, **params) -> dict:
    return {"rope_type": kind, "rope_theta": theta, **params}


MODELS = {
    # x + attn(LN₁x) + mlp(LN₂x); rotary on 2 of 8 dims; untied embed_out
    "neox-parallel-quarter": lambda: neox(rope_parameters=rope("default", 10000.0, partial_rotary_factor=0.25)),
    # x + attn(LN₁x), then + mlp(LN₂·); rotary on 4 of 8 dims; tanh GELU, no attention biases, tied head
    "neox-sequential-half": lambda: neox(use_parallel_residual=False, hidden_act="gelu_new", attention_bias=False,
                                         tie_word_embeddings=True,
                                         rope_parameters=rope("default", 5000.0, partial_rotary_factor=0.5)),
    # D = 16, rotary on 8 dims with YaRN
    "neox-yarn": lambda: neox(hidden_size=80, rope_parameters=rope(
        "yarn", 10000.0, partial_rotary_factor=0.5, factor=4.0, original_max_position_embeddings=16)),
    # 5 layers, NoPE every 4th (layer 3), which also slides (window 6 < T); 6 heads over 2 kv heads
    "smollm3-5-layers": lambda: smollm3(hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
                                        num_hidden_layers=5, use_sliding_window=True, sliding_window=6),
    # 8 layers = two periods of [rope, rope, rope, nope]; 3 heads over 1 kv head (MQA), D = 16, YaRN
    "smollm3-periodic-yarn": lambda: smollm3(hidden_size=48, num_attention_heads=3, num_key_value_heads=1,
                                             num_hidden_layers=8, rope_parameters=rope(
                                                 "yarn", 2000000.0, factor=4.0, original_max_position_embeddings=16)),
    # an irregular list, sliding on a RoPE and a NoPE layer, biases, untied head, linear scaling
    "smollm3-irregular": lambda: smollm3(
        hidden_size=40, num_attention_heads=5, num_key_value_heads=5, num_hidden_layers=6,
        no_rope_layers=[1, 0, 0, 1, 1, 0], use_sliding_window=True, sliding_window=4,
        layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention",
                     "full_attention", "full_attention"],
        attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
        rope_parameters=rope("linear", 2000000.0, factor=2.0)),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    return parity.cached_imports(lambda name: MODELS[name](), tmp_path_factory)


@pytest.mark.parametrize("name", MODELS)
def test_family_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits plain and left-padded, 32 greedy steps with and without the KV cache, the export."""
    parity.check_causal_lm(imported(name), tmp_path / "out", T)


# -- what the imported recipes say -------------------------------------------------------------------
def test_neox_recipe_reads_parallel_residual_and_rotary_dim(imported):
    m = imported("neox-parallel-quarter").model.recipe["model"]
    assert m["residual"] == "parallel" and m["position"]["rotary_dim"] == 2
    assert m["norm"]["kind"] == "layernorm" and m["attention"]["bias"] is True
    assert m["ffn"]["kind"] == "gelu" and m["ffn"]["approximate"] == "none" and m["tie_embeddings"] is False
    m = imported("neox-sequential-half").model.recipe["model"]
    assert m["residual"] == "sequential" and m["position"]["rotary_dim"] == 4 and m["position"]["base"] == 5000.0
    assert m["attention"]["bias"] is False and m["tie_embeddings"] is True
    assert imported("neox-yarn").model.recipe["model"]["position"]["scaling"]["kind"] == "yarn"


def test_smollm3_recipe_reads_the_nope_pattern(imported):
    m = imported("smollm3-periodic-yarn").model.recipe["model"]
    assert m["layer_types"] == {"rope": {}, "nope": {"position": "none"}}
    assert m["pattern"] == ["rope", "rope", "rope", "nope"] and not m["layer_overrides"]
    assert m["position"]["base"] == 2000000.0 and m["position"]["scaling"]["kind"] == "yarn"
    m = imported("smollm3-5-layers").model.recipe["model"]
    assert m["pattern"] == ["rope", "rope", "rope", "nope_sliding"] and not m["layer_overrides"]  # 5 layers
    assert m["layer_types"]["nope_sliding"] == {"position": "none", "attention": {"window": 6}}
    assert m["attention"]["window"] is None and m["attention"]["kv_heads"] == 2
    m = imported("smollm3-irregular").model.recipe["model"]
    assert m["pattern"] == ["rope", "nope_sliding", "nope", "rope_sliding", "rope", "nope"]  # no period


@pytest.mark.parametrize("name", ["smollm3-5-layers", "smollm3-periodic-yarn", "smollm3-irregular"])
def test_smollm3_export_rebuilds_the_per_layer_switches(imported, name, tmp_path):
    hf, model, _ = imported(name)
    config = json.loads((seqzoo.to_hf(model, tmp_path / "out") / "config.json").read_text())
    assert config["no_rope_layers"] == hf.config.no_rope_layers
    assert config["layer_types"] == hf.config.layer_types
    assert config["sliding_window"] == (hf.config.sliding_window if hf.config.use_sliding_window else None)


def test_neox_partial_factor_gives_back_the_rotary_dim():
    from seqzoo.plugins.converter.gpt_neox import partial_factor

    for head_dim in range(2, 257):
        for rotary in range(2, head_dim + 1, 2):
            assert int(head_dim * partial_factor(rotary, head_dim)) == rotary


# -- old checkpoints and refusals --------------------------------------------------------------------

def test_neox_old_config_and_mask_buffers_import(imported, tmp_path):
    hf, _, folder = imported("neox-parallel-quarter")
    config = json.loads((folder / "config.json").read_text())
    del config["rope_parameters"]
    config.update(rotary_pct=0.25, rotary_emb_base=10000.0)  # transformers 4's keys
    buffers = {"gpt_neox.layers.0.attention.bias": torch.ones(1, 1, 64, 64, dtype=torch.bool).tril(),
               "gpt_neox.layers.0.attention.masked_bias": torch.tensor(-1e9)}
    model = seqzoo.from_hf(parity.edited_copy(folder, tmp_path / "old", config, extra=buffers))
    assert model.recipe["model"]["position"]["rotary_dim"] == 2
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < parity.TOL


@pytest.mark.parametrize("name, change, match", [
    ("neox-parallel-quarter", {"rope_parameters": rope("default", 1e4, partial_rotary_factor=0.375)},
     r"partial_rotary_factor \(rotary_pct\) 0.375 gives 3 rotary dims"),
    ("neox-parallel-quarter", {"rope_parameters": rope("default", 1e4, partial_rotary_factor=0.0)},
     r"partial_rotary_factor \(rotary_pct\) 0.0 is not supported; it must be a number in \(0, 1\]"),
    ("neox-parallel-quarter", {"hidden_act": "mish"}, r"activation 'mish'"),
    ("neox-parallel-quarter", {"head_dim": 16}, r"head_dim 16 is not supported for gpt_neox"),
    ("neox-parallel-quarter", {"hidden_size": 42}, r"hidden_size 42 is not divisible by num_attention_heads 5"),
    ("neox-parallel-quarter", {"use_parallel_residual": "yes"}, r"use_parallel_residual 'yes' must be true"),
    ("neox-parallel-quarter", {"rope_parameters": rope("longrope", 1e4, partial_rotary_factor=0.25)},
     r"rope_type 'longrope'"),
    ("smollm3-5-layers", {"use_sliding_window": False, "layer_types": ["sliding_attention"] * 5},
     r"use_sliding_window is False"),
    ("smollm3-5-layers", {"no_rope_layers": [1, 0]}, r"no_rope_layers \[1, 0\] is not supported"),
    ("smollm3-5-layers", {"no_rope_layers": None, "no_rope_layer_interval": 0},
     r"no_rope_layer_interval 0 is not supported; it must be a positive integer"),
    ("smollm3-5-layers", {"sliding_window": None}, r"sliding_window None is not supported"),
    ("smollm3-5-layers", {"layer_types": ["chunked_attention"] * 5}, r"layer_types .* is not supported"),
    ("smollm3-5-layers", {"rope_parameters": rope("default", 2e6, partial_rotary_factor=0.5)},
     r"partial_rotary_factor 0.5"),
])
def test_unsupported_config_option_is_refused_in_one_line(imported, tmp_path, name, change, match):
    parity.check_refused(imported(name).folder, tmp_path / "bad", change, match)


def test_exporters_refuse_what_their_family_cannot_express(imported):
    neox_converter = seqzoo.registry().get("converter", "gpt_neox").cls()
    smol_converter = seqzoo.registry().get("converter", "smollm3").cls()
    recipe = imported("neox-parallel-quarter").model.recipe
    gqa = {**recipe, "model": {**recipe["model"], "attention": {**recipe["model"]["attention"], "kv_heads": 1}}}
    assert "no GQA" in neox_converter.accepts(gqa)
    shared = {**recipe, "model": {**recipe["model"], "residual": "parallel_shared"}}
    assert "model.residual is parallel_shared" in neox_converter.accepts(shared)
    recipe = imported("smollm3-5-layers").model.recipe
    assert "model.pattern" in seqzoo.registry().get("converter", "llama").cls().accepts(recipe)
    uniform = {**recipe, "model": {**recipe["model"], "layer_types": None, "pattern": None, "layer_overrides": None}}
    assert "a uniform RoPE stack is LLaMA" in smol_converter.accepts(uniform)
    other_base = {**recipe, "model": {**recipe["model"], "layer_types": {
        "rope": {"position": {"base": 10000.0}}, "nope_sliding": {"position": "none", "attention": {"window": 6}}}}}
    assert "model layer 0: its position differs" in smol_converter.accepts(other_base)
    two_windows = {**recipe, "model": {**recipe["model"], "layer_types": {
        "rope": {"attention": {"window": 3}}, "nope_sliding": {"position": "none", "attention": {"window": 6}}}}}
    assert "windows [3, 6]" in smol_converter.accepts(two_windows)
    with pytest.raises(CheckpointError, match="cannot export as gpt_neox"):
        seqzoo.to_hf(imported("smollm3-5-layers").model, "unused", model_type="gpt_neox")
