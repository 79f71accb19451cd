"""Phi-3 in and out, and the LongRoPE scaling (docs/formulas.md §4.6), against transformers.

Small random Phi3ForCausalLM models — odd head counts with GQA, a sliding window shorter than the
sequence, partial rotary (Phi-4-mini's 0.75), LongRoPE both past its L (long factors, and a greedy
decode that crosses L, where transformers' generate drops its cache) and within it (short
factors), non-unit norm weights — pass the converter kit: logits ≤ 1e-4 (plain and left-padded),
32 greedy steps with and without the KV cache equal to ``generate``, and an export that
transformers loads with the same logits.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

import seqzoo
from seqzoo.errors import CheckpointError, ConfigError
from seqzoo.nn.generation import generate
from seqzoo.testing import parity
from seqzoo.testing.parity import hf_greedy, left_padded

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 96
# initializer_range 0.1 (not 0.02): sharper attention, so a wrong rotation flips greedy tokens
BASE = dict(vocab_size=V, intermediate_size=56, num_hidden_layers=3, max_position_embeddings=64,
            initializer_range=0.1, bos_token_id=1, eos_token_id=2, pad_token_id=0)
GQA = dict(hidden_size=40, num_attention_heads=5, num_key_value_heads=1)  # head_dim 8: 4 pairs
PHI4 = dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=1, partial_rotary_factor=0.75)  # 6 pairs


def factors(pairs: int, low: float, high: float, seed: int) -> list[float]:
    """Non-trivial, increasing per-pair factors, as searched LongRoPE lists are."""
    g = torch.Generator().manual_seed(seed)
    return sorted(torch.empty(pairs).uniform_(low, high, generator=g).tolist())


def longrope(pairs: int, original: int, **extra) -> dict:
    return {"original_max_position_embeddings": original,
            "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, **extra,
                                "short_factor": factors(pairs, 1.0, 1.5, 1),
                                "long_factor": factors(pairs, 1.0, 9.0, 2)}}


def phi3(**kw):
    model = transformers.Phi3ForCausalLM(transformers.Phi3Config(**{**BASE, **kw}))
    with torch.no_grad():  # HF starts norms at one: random ones show a misplaced norm
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
    return model


# name -> (build the HF model, sequence length of the logit checks)
CASES = {
    # 5 heads sharing 1 kv head, a window of 6 over 20 tokens, no scaling
    "gqa-window": (lambda: phi3(**GQA, sliding_window=6), 20),
    # Phi-4-mini style: 3 heads, 1 kv head, 0.75 rotary, LongRoPE with L = 16 < 24 tokens (long
    # factors); greedy decoding (8 + 32 tokens) crosses L, where generate re-encodes
    "longrope-long-partial": (lambda: phi3(**PHI4, **longrope(6, 16)), 24),
    # L = 48 above every length used (short factors), s = 128/48, a window, a tied head
    "longrope-short-window-tied": (lambda: phi3(**{**GQA, "max_position_embeddings": 128}, sliding_window=7,
                                                tie_word_embeddings=True, **longrope(4, 48)), 20),
    # explicit factor and attention_factor, L = 16: long factors again
    "longrope-explicit-amplitude": (lambda: phi3(**GQA, **longrope(4, 16, factor=3.0, attention_factor=1.3)), 22),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    return parity.cached_imports(lambda name: CASES[name][0](), tmp_path_factory)


@pytest.mark.parametrize("name", CASES)
def test_phi3_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits plain and left-padded, 32 greedy steps with and without the KV cache, the export."""
    # A plain Phi-3 has LLaMA's / Mistral's layout: only LongRoPE or partial rotary pick phi3 by itself.
    named = "phi3" if name == "gqa-window" else None
    out = parity.check_causal_lm(imported(name), tmp_path / "out", CASES[name][1], model_type=named)
    config, source = json.loads((out / "config.json").read_text()), imported(name).hf.config
    if source.rope_parameters["rope_type"] == "longrope":  # transformers reads L from the top level
        assert config["original_max_position_embeddings"] == source.original_max_position_embeddings


def test_phi3_recipe_splits_the_fused_projections_and_names_the_scaling(imported):
    hf, model, _ = imported("longrope-long-partial")
    m = model.recipe["model"]
    assert m["position"]["rotary_dim"] == 12 and m["attention"]["kv_heads"] == 1
    scaling = m["position"]["scaling"]
    assert scaling["kind"] == "longrope" and scaling["original_max_seq_len"] == 16
    assert scaling["long_factor"] == pytest.approx(hf.config.rope_parameters["long_factor"])
    block, layer = model.decoder.blocks[1], hf.model.layers[1]
    gate, up = layer.mlp.gate_up_proj.weight.chunk(2)
    assert torch.equal(block.ffn.gate.weight, gate) and torch.equal(block.ffn.up.weight, up)
    assert torch.equal(block.mixer.qkv_proj.weight, layer.self_attn.qkv_proj.weight)


def test_cached_generate_re_encodes_once_when_the_sequence_passes_l(imported, monkeypatch):
    # transformers' generate drops its cache at L + 1 tokens; so does seqzoo's: one whole-sequence
    # forward besides the prompt, at the step where 16 tokens are cached.
    _, model, _ = imported("longrope-long-partial")
    ids, mask = left_padded(V, 8, pad=2)
    widths = []
    forward = type(model).forward

    def spy(self, input_ids, **kwargs):
        widths.append(input_ids.shape[1])
        return forward(self, input_ids, **kwargs)

    monkeypatch.setattr(type(model), "forward", spy)
    generate(model, ids, 12, attention_mask=mask, eos_id=None)
    assert widths == [8] + [1] * 8 + [17] + [1] * 2


def test_static_decoding_and_beam_search_re_encode_across_l_too(imported):
    _, model, _ = imported("longrope-long-partial")
    ids, mask = left_padded(V, 8, pad=2)
    uncached = generate(model, ids, 20, attention_mask=mask, eos_id=None, use_cache=False)
    with torch.inference_mode():  # the static cache (what compile=True decodes with) is rebuilt too
        session = model.start_generation(ids, 20, True, attention_mask=mask, static=True)
        token, out = None, [ids]
        for _ in range(20):
            token = session.next(token).argmax(-1)
            out.append(token[:, None])
    assert torch.equal(torch.cat(out, dim=1), uncached)
    beams = [generate(model, ids, 20, attention_mask=mask, eos_id=None, beam_size=3, use_cache=cached)
             for cached in (True, False)]
    assert torch.equal(*beams)


def test_transformers_generate_gives_the_same_tokens_with_and_without_its_cache_across_l(imported):
    # The reference behaviour seqzoo copies: Phi-3's generate drops its cache when passing L.
    hf = imported("longrope-long-partial").hf
    ids, mask = left_padded(V, 8, pad=2)
    assert torch.equal(hf_greedy(hf, ids, mask, 32), hf_greedy(hf, ids, mask, 32, use_cache=False))


def test_decoding_across_l_differs_from_transformers_forward_with_a_stale_cache(imported):
    # Why the re-encoding matters: keys cached with the short factors, extended past L with the
    # long ones, give other logits than the full forward (both in transformers and by hand here).
    hf, model, _ = imported("longrope-long-partial")
    ids = torch.randint(3, V, (1, 18))
    with torch.no_grad():
        full = model(ids)[:, -1]
        cache = model.new_cache(1, 18)
        model(ids[:, :16], cache=cache)
        model(ids[:, 16:17], cache=cache)
        stale = model(ids[:, 17:], cache=cache)[:, -1]
        assert (full - hf(ids).logits[:, -1]).abs().max() < parity.TOL
        assert (stale - full).abs().max() > 1e-3


def test_longrope_frequencies_and_amplitude_follow_the_worked_example():
    # docs/formulas.md §4.6: d_r = 4, b = 100, short [1, 2], long [4, 8], L = 16, max_seq_len 64.
    scaling = seqzoo.registry().create("rope_scaling", {"kind": "longrope", "short_factor": [1.0, 2.0],
                                                        "long_factor": [4.0, 8.0], "original_max_seq_len": 16})
    inv_freq = torch.tensor([1.0, 0.1], dtype=torch.float64)  # 100^(−2k/4)

    def at(length: int, max_seq_len: int = 64):
        return scaling.frequencies(inv_freq, rotary_dim=4, base=100.0, max_seq_len=max_seq_len,
                                   positions=torch.arange(length)[None])

    omega, amplitude = at(16)
    assert omega.tolist() == pytest.approx([1.0, 0.05]) and amplitude == pytest.approx(math.sqrt(1.5))
    omega, amplitude = at(17)
    assert omega.tolist() == pytest.approx([0.25, 0.0125]) and amplitude == pytest.approx(1.2247, abs=1e-4)
    assert at(17, max_seq_len=16)[1] == 1.0  # s = 1: no amplitude
    assert scaling.stale_after == 16


def test_longrope_explicit_factor_and_attention_factor_replace_the_defaults():
    make = lambda **kw: seqzoo.registry().create("rope_scaling", {  # noqa: E731
        "kind": "longrope", "short_factor": [1.0], "long_factor": [2.0], "original_max_seq_len": 16, **kw})
    assert make(factor=16.0).amplitude(64) == pytest.approx(math.sqrt(2.0))
    assert make(factor=16.0, attention_factor=0.9).amplitude(64) == 0.9
    # Phi-3-mini-128k: L = 4096, s = 32 -> √(17/12)
    phi3_mini = seqzoo.registry().create("rope_scaling", {
        "kind": "longrope", "short_factor": [1.0], "long_factor": [2.0], "original_max_seq_len": 4096})
    assert phi3_mini.amplitude(131072) == pytest.approx(math.sqrt(17 / 12))


def test_longrope_refuses_factor_lists_that_do_not_fit():
    with pytest.raises(ConfigError, match="short_factor has 2 entries and long_factor 3"):
        seqzoo.registry().create("rope_scaling", {"kind": "longrope", "short_factor": [1.0, 1.0],
                                                  "long_factor": [1.0, 1.0, 1.0], "original_max_seq_len": 8})
    scaling = seqzoo.registry().create("rope_scaling", {"kind": "longrope", "short_factor": [1.0, 1.0],
                                                        "long_factor": [1.0, 1.0], "original_max_seq_len": 8})
    with pytest.raises(ConfigError, match="rotary_dim=8 has 4 pairs"):
        scaling.frequencies(torch.ones(4, dtype=torch.float64), rotary_dim=8, base=1e4, max_seq_len=8,
                            positions=torch.arange(3)[None])
    with pytest.raises(ConfigError, match="original_max_seq_len=1"):
        seqzoo.registry().create("rope_scaling", {"kind": "longrope", "short_factor": [1.0],
                                                  "long_factor": [1.0], "original_max_seq_len": 1}).amplitude(4)


def rewritten(folder, tmp_path, **changes):
    """A copy of an imported folder with config.json keys changed (None deletes a key)."""
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        config.pop(key, None) if value is None else config.__setitem__(key, value)
    out = tmp_path / "changed"
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config))
    (out / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    return out


@pytest.mark.parametrize("changes, message", [
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0}},
     "rope_type 'linear' is not supported; supported: default, longrope"),
    ({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0] * 4,
                          "mscale": 1.2}}, r"rope_parameters.mscale 1.2 is not a longrope option"),
    ({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 4}},
     r"rope_parameters.short_factor \[1.0, 1.0, 1.0\] must list one number per rotary pair \(4\)"),
    ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.7}},
     "partial_rotary_factor 0.7 rotates 5 of head_dim 8 dims"),
    ({"resid_pdrop": 0.1}, "resid_pdrop 0.1 is not supported"),
    ({"rope_scaling": {"type": "su", "short_factor": [1.0] * 4, "long_factor": [1.0] * 4}},
     "rope_scaling type 'su' switches its factors at its own original_max_position_embeddings None"),
])
def test_unsupported_phi3_options_are_refused_in_one_line(imported, tmp_path, changes, message):
    _, _, folder = imported("gqa-window")
    with pytest.raises(CheckpointError, match=message) as error:
        seqzoo.from_hf(rewritten(folder, tmp_path, **changes))
    assert "\n" not in str(error.value)


def test_legacy_su_and_yarn_names_read_as_longrope_like_transformers(imported, tmp_path):
    hf, _, folder = imported("longrope-explicit-amplitude")
    params = dict(hf.config.rope_parameters)
    for legacy in ("yarn", "su"):
        scaling = {k: v for k, v in params.items() if k != "rope_type"} | {"type": legacy}
        out = rewritten(folder, tmp_path / legacy, rope_scaling=scaling, rope_parameters=None)
        model = seqzoo.from_hf(out)
        reference = transformers.Phi3ForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        ids = torch.randint(3, V, (1, 20))
        with torch.no_grad():
            assert (model(ids) - reference(ids).logits).abs().max() < parity.TOL
        assert model.recipe["model"]["position"]["scaling"]["kind"] == "longrope"


def test_phi3_export_refuses_what_transformers_phi3_cannot_hold(imported):
    _, model, _ = imported("gqa-window")
    recipe = json.loads(json.dumps(model.recipe))
    converter = seqzoo.registry().get("converter", "phi3").cls()
    assert converter.accepts(recipe) is None
    linear = json.loads(json.dumps(recipe))
    linear["model"]["position"]["scaling"] = {"kind": "linear", "factor": 2.0}
    assert "has no HF rope_type (supported: longrope)" in converter.accepts(linear)
    biased = json.loads(json.dumps(recipe))
    biased["model"]["attention"]["bias"] = True
    assert converter.accepts(biased) == "model.attention: Phi-3 has no biases"


def test_a_phi3_without_longrope_or_partial_rotary_exports_as_mistral_unless_named(imported, tmp_path):
    _, model, _ = imported("gqa-window")
    out = seqzoo.to_hf(model, tmp_path / "auto")
    assert json.loads((out / "config.json").read_text())["model_type"] == "mistral"


def test_llama_still_refuses_longrope(tmp_path):
    # HF LLaMA reads longrope but its generate keeps a stale cache past L; seqzoo's would not.
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **BASE, hidden_size=32, num_attention_heads=4,
        rope_parameters={"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
                         "original_max_position_embeddings": 16}))
    hf.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="rope_type 'longrope' is not supported"):
        seqzoo.from_hf(tmp_path)
