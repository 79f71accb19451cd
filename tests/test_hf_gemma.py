"""Gemma 2 and Gemma 3 (text) in and out, exact to the logit: small random transformers models whose
configs exercise what sets the families apart — local and global layers with a window shorter than
the sequence, more layers than one pattern period, odd head counts and GQA, softcaps small enough
to bite, query_pre_attn_scalar ≠ head_dim, a RoPE per layer type with linear scaling on the global
layers only, and non-zero (1 + w) norm weights — pass the converter kit: logits (plain and left-padded),
32 greedy steps with and without the KV cache, and an exported folder transformers loads."""
from __future__ import annotations

import copy
import json

import pytest
import torch

import seqzoo
from seqzoo.io.hf import layer_pattern
from seqzoo.plugins.converter.gemma2 import Gemma2Converter
from seqzoo.plugins.converter.gemma3_text import Gemma3TextConverter
from seqzoo.recipe import resolve
from seqzoo.testing import parity

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 128  # vocabulary of every test model
T = 20   # test sequence length: longer than every window below
SMALL = dict(vocab_size=V, intermediate_size=64, max_position_embeddings=64, initializer_range=0.2,
             bos_token_id=1, eos_token_id=2, pad_token_id=0)
BIG = 0.5  # init std that makes attention and final logits large enough for caps of 5 and 3 to saturate


def gemma2(**kw):
    return parity.randomised(transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**{**SMALL, **kw})),
                            norms=(-0.5, 0.5))


def gemma3(**kw):
    return parity.randomised(transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**{**SMALL, **kw})),
                            norms=(-0.5, 0.5))


GEMMA = {
    # 3 query heads on 1 kv head, head_dim 24 ≠ 48 / 3, 3 layers (local, global, local), window 5,
    # query_pre_attn_scalar 20 ≠ head_dim, both softcaps biting, tied head.
    "gemma2": lambda: gemma2(hidden_size=48, num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=1,
                             head_dim=24, sliding_window=5, query_pre_attn_scalar=20, initializer_range=BIG,
                             attn_logit_softcapping=5.0, final_logit_softcapping=3.0),
    # GQA 4:2, two pattern periods, untied head, biases, linear RoPE scaling, the default caps.
    "gemma2-gqa-untied": lambda: gemma2(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=16, sliding_window=6,
                                        query_pre_attn_scalar=16, tie_word_embeddings=False, attention_bias=True,
                                        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
    # 5 query heads on 1 kv head, 7 layers over the 6-period (one global, at 5), window 4, RoPE base
    # 1e4 local and 1e6 global, linear scaling ×8 on the global layers only (the legacy rope_scaling).
    "gemma3": lambda: gemma3(hidden_size=60, num_hidden_layers=7, num_attention_heads=5, num_key_value_heads=1,
                             head_dim=16, sliding_window=4, rope_scaling={"rope_type": "linear", "factor": 8.0}),
    # GQA 4:2, 12 layers = two whole periods, a final softcap that bites, and an attention softcap
    # that transformers' Gemma 3 never applies (so neither may seqzoo).
    "gemma3-gqa-softcap": lambda: gemma3(
        hidden_size=64, num_hidden_layers=12, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        sliding_window=6, query_pre_attn_scalar=20, final_logit_softcapping=3.0, attn_logit_softcapping=5.0,
        initializer_range=BIG,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                         "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 20000.0}}),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    return parity.cached_imports(lambda name: GEMMA[name](), tmp_path_factory)


@pytest.mark.parametrize("name", GEMMA)
def test_gemma_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits plain and left-padded, 32 greedy steps with and without the KV cache, the export."""
    out = parity.check_causal_lm(imported(name), tmp_path / "out", T)
    config = json.loads((out / "config.json").read_text())
    assert config["layer_types"] == imported(name).hf.config.layer_types


@pytest.mark.parametrize("name", ["gemma2", "gemma3-gqa-softcap"])
def test_softcaps_bite_in_the_test_models(imported, name):
    """Without a cap the test model's logits change: the parity above really covers the caps."""
    model = imported(name).model
    ids = torch.randint(V, (1, T))
    with torch.no_grad():
        capped = model(ids)
        assert capped.abs().max() > 0.8 * model.final_softcap
        for part in ("final", "attention"):
            uncapped = copy.deepcopy(model)
            if part == "final":
                uncapped.final_softcap = None
            for block in uncapped.decoder.blocks if part == "attention" else ():
                # Gemma 3's config asks for a cap of 5 that transformers never applies: applying it
                # would change the logits, so matching transformers means leaving it out.
                block.mixer.softcap = None if block.mixer.softcap else 5.0
            assert (uncapped(ids) - capped).abs().max() > 0.1, part


def test_imported_gemma2_recipe_names_its_components(imported):
    m = imported("gemma2").model.recipe["model"]
    assert m["norm"] == {"kind": "gemma_rmsnorm", "eps": 1e-6} and m["placement"] == "sandwich"
    assert m["ffn"]["kind"] == "geglu" and m["ffn"]["approximate"] == "tanh"
    assert m["scale_embeddings"] is True and m["final_softcap"] == 3.0
    attn = m["attention"]
    assert attn["softcap"] == 5.0 and attn["window"] is None and attn["score"]["scale"] == 20 ** -0.5
    assert (attn["heads"], attn["kv_heads"], attn["head_dim"]) == (3, 1, 24)
    # 3 layers do not hold the period of 2 a whole number of times: the last period is cut short.
    assert m["layer_types"] == {"local": {"attention": {"window": 5}}, "global": {}}
    assert m["pattern"] == ["local", "global"] and not m.get("layer_overrides")
    m = imported("gemma2-gqa-untied").model.recipe["model"]
    assert m["pattern"] == ["local", "global"] and not m.get("layer_overrides")
    assert m["attention"]["score"]["scale"] is None  # query_pre_attn_scalar = head_dim
    assert m["position"]["scaling"] == {"kind": "linear", "factor": 2.0}


def test_imported_gemma3_recipe_names_its_components(imported):
    m = imported("gemma3").model.recipe["model"]
    assert m["position"] == {"kind": "rope", "base": 1e6, "rotary_dim": None, "interleaved": False,
                             "scaling": {"kind": "linear", "factor": 8.0}}
    assert m["layer_types"] == {"local": {"attention": {"window": 4}, "position": {"base": 1e4, "scaling": None}},
                                "global": {}}
    assert m["pattern"] == ["local"] * 5 + ["global"] and m["layers"] == 7 and not m.get("layer_overrides")
    assert m["attention"]["qk_norm"] == {"kind": "gemma_rmsnorm", "eps": 1e-6}
    assert m["attention"]["qk_norm_scope"] == "head" and m["attention"]["softcap"] is None
    assert m["final_softcap"] is None and m["attention"]["score"]["scale"] == 256 ** -0.5
    m = imported("gemma3-gqa-softcap").model.recipe["model"]
    assert m["pattern"] == ["local"] * 5 + ["global"] and not m.get("layer_overrides")
    assert m["final_softcap"] == 3.0 and m["attention"]["softcap"] is None
    assert m["layer_types"]["local"]["position"] == {"base": 500.0, "scaling": None}
    assert m["position"]["base"] == 20000.0 and m["position"]["scaling"]["factor"] == 4.0


@pytest.mark.parametrize("types, pattern", [
    (["local", "global"] * 2, ["local", "global"]),
    (["local", "global"], ["local", "global"]),
    ((["local"] * 5 + ["global"]) * 2, ["local"] * 5 + ["global"]),
    # Gemma 3 1B: 26 layers, a global one every 6th; the last period is cut short.
    ([("global" if (i + 1) % 6 == 0 else "local") for i in range(26)], ["local"] * 5 + ["global"]),
    (["local"] * 3, ["local"]),
])
def test_layer_types_become_the_shortest_repeating_pattern(types, pattern):
    assert layer_pattern(types) == pattern


def test_gemma3_legacy_rope_keys_give_the_same_recipe_as_rope_parameters_per_layer_type():
    common = dict(SMALL, hidden_size=64, num_hidden_layers=12, num_attention_heads=4, head_dim=16)
    legacy = Gemma3TextConverter().recipe({**common, "rope_theta": 2e5, "rope_local_base_freq": 5e3,
                                           "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                                           "sliding_window_pattern": 4})
    types = (["sliding_attention"] * 3 + ["full_attention"]) * 3
    nested = Gemma3TextConverter().recipe({**common, "layer_types": types,
                                           "rope_parameters": {
                                               "sliding_attention": {"rope_type": "default", "rope_theta": 5e3},
                                               "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                  "rope_theta": 2e5}}})
    assert legacy == nested
    assert legacy["model"]["pattern"] == ["local", "local", "local", "global"]
    assert legacy["model"]["position"] == {"kind": "rope", "base": 2e5, "scaling": {"kind": "linear", "factor": 8.0}}


@pytest.mark.parametrize("converter, change, message", [
    (Gemma3TextConverter, {"use_bidirectional_attention": True},
     r"config\.json: use_bidirectional_attention=True is not supported"),
    (Gemma2Converter, {"use_bidirectional_attention": True},
     r"config\.json: use_bidirectional_attention=True is not supported"),
    (Gemma2Converter, {"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]},
     r"config\.json: layer_types entry 'chunked_attention' is not supported"),
    (Gemma2Converter, {"layer_types": ["sliding_attention", "full_attention"]},
     r"config\.json: layer_types has 2 entries for num_hidden_layers=3"),
    (Gemma3TextConverter, {"rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                               "full_attention": {"rope_type": "proportional", "rope_theta": 1e6}}},
     r"config\.json: rope_parameters\.full_attention: rope_type 'proportional' is not supported"),
])
def test_unsupported_gemma_config_options_are_refused_naming_the_option(converter, change, message):
    config = {**SMALL, "hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 3, "head_dim": 16,
              **change}
    with pytest.raises(seqzoo.CheckpointError, match=message):
        converter().recipe(config)


def test_import_of_a_folder_with_an_unsupported_option_is_one_clear_error(imported, tmp_path):
    folder = imported("gemma3").folder
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "use_bidirectional_attention": True}))
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(seqzoo.CheckpointError, match=r"^config\.json: use_bidirectional_attention=True is not "
                                                      r"supported \(seqzoo's decoder_lm is causal\)$"):
        seqzoo.from_hf(tmp_path)


@pytest.mark.parametrize("recipe, hf_class", [("tiny-gemma2", "Gemma2ForCausalLM"),
                                              ("tiny-gemma3", "Gemma3ForCausalLM")])
def test_family_recipe_exports_to_the_family_and_transformers_agrees(recipe, hf_class, tmp_path):
    model = parity.randomised(seqzoo.build(recipe, device="cpu").eval(), norms=(-0.5, 0.5))
    out = seqzoo.to_hf(model, tmp_path / "out")  # no model_type: exactly one family fits
    reference = getattr(transformers, hf_class).from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(3, 259, (2, T))
    with torch.no_grad():
        assert parity.max_difference(model(ids), reference(ids).logits) < parity.TOL


@pytest.mark.parametrize("recipe, model_type, edit, message", [
    ("tiny-gemma2", "gemma3_text", lambda m: None, r"model\.attention\.softcap is set; gemma3_text has none"),
    ("tiny-gemma3", "gemma2", lambda m: None, r"model\.attention\.qk_norm is set; gemma2 has none"),
    ("tiny-gemma2", "gemma2", lambda m: m["attention"].update(score={"kind": "scaled_dot", "scale": 0.3}),
     r"integer query_pre_attn_scalar"),
    ("tiny-gemma2", "gemma2", lambda m: m["layer_types"]["global"].update(attention={"window": 16}),
     r"local layers have windows \[8, 16\]"),
    ("tiny-gemma2", "gemma2", lambda m: m["layer_types"]["global"].update(position={"base": 1e6}),
     r"gemma2 has one RoPE for all layers"),
    ("tiny-gemma3", "gemma3_text", lambda m: m["layer_types"]["global"].update(ffn={"hidden": 64}),
     r"model\.layer_types: gemma3_text's layers differ only in their window and RoPE"),
    ("tiny-gemma2", "gemma2", lambda m: m.update(scale_embeddings=False), r"model\.scale_embeddings is false"),
])
def test_export_refuses_a_model_the_family_cannot_express(recipe, model_type, edit, message, tmp_path):
    spec = copy.deepcopy(resolve(recipe).data)
    edit(spec["model"])
    model = seqzoo.build(spec, device="cpu")
    with pytest.raises(seqzoo.CheckpointError, match=message):
        seqzoo.to_hf(model, tmp_path / "out", model_type=model_type)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [2304, 3072, 3584])  # √C: 48 exact; 55.43 -> 55.5 (bf16); 59.87 -> 59.75 (bf16)
def test_embeddings_are_scaled_by_root_c_rounded_to_the_weights_dtype_as_transformers_does(dim, dtype):
    spec = copy.deepcopy(resolve("tiny-gemma2").data)
    spec["model"].update(dim=dim, layers=2, ffn={"kind": "geglu", "hidden": 8, "approximate": "tanh"},
                         attention={**spec["model"]["attention"], "heads": 1, "kv_heads": 1, "head_dim": 8})
    model = seqzoo.build(spec, device="cpu", dtype=dtype).eval()
    seen = []
    model.decoder.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    reference = transformers.models.gemma2.modeling_gemma2.Gemma2TextScaledWordEmbedding(
        model.vocab_size, dim, 0, embed_scale=dim ** 0.5).to(dtype)
    reference.weight.data.copy_(model.embed.weight)
    ids = torch.arange(model.vocab_size)[None]
    with torch.no_grad():
        model(ids)
        assert torch.equal(seen[0], reference(ids))
