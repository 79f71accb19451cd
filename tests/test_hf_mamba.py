"""Mamba and Falcon-Mamba against transformers: small random models of each family with what sets
them apart — a Δ rank other than ⌈C/16⌉, conv kernels of 3 and 4, no conv bias, in_proj/out_proj
biases, tied and untied heads, Falcon-Mamba's weightless norms of Δ, B and C with a large ε —
imported with ``seqzoo.from_hf`` and checked with the converter kit (logits ≤ 1e-4 float32 plain
and left-padded over 72 tokens, more than one scan chunk; 32 greedy steps with and without the
state cache; an exported folder transformers loads). A_log and D are drawn away from their
initial values (which seqzoo's own init would reproduce), norm weights and biases randomised.

The reference is transformers' sequential PyTorch loop (``mamba_selective_scan``'s fallback): see
``test_the_reference_is_transformers_sequential_pytorch_path``.
"""
from __future__ import annotations

import importlib.util
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
T = 72    # test sequence length: more than one scan chunk (64)
IDS = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def randomised(model):
    """``parity.randomised`` plus A = −exp(A_log) and D moved off transformers' (and seqzoo's) init."""
    parity.randomised(model)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("A_log"):
                parameter.add_(torch.rand_like(parameter) - 0.5)
            elif name.endswith(".D"):
                parameter.normal_(1.0, 0.5)
    return model


def mamba(**kw):
    config = {**IDS, "hidden_size": 32, "num_hidden_layers": 2, "state_size": 8, "conv_kernel": 4, "expand": 2, **kw}
    return randomised(transformers.MambaForCausalLM(transformers.MambaConfig(**config)))


def falcon(**kw):
    config = {**IDS, "hidden_size": 48, "num_hidden_layers": 3, "state_size": 8, "conv_kernel": 4, "expand": 2, **kw}
    return randomised(transformers.FalconMambaForCausalLM(transformers.FalconMambaConfig(**config)))


MODELS = {
    # the defaults at small size: Δ rank 2 = ⌈32/16⌉, conv bias, tied head
    "mamba-tied": lambda: mamba(),
    # Δ rank 5 (not ⌈48/16⌉ = 3), kernel 3 without bias, state 4, 3 layers, untied head, ε 1e-6
    "mamba-rank-untied": lambda: mamba(hidden_size=48, num_hidden_layers=3, state_size=4, conv_kernel=3,
                                       time_step_rank=5, use_conv_bias=False, tie_word_embeddings=False,
                                       layer_norm_epsilon=1e-6),
    # biases on in_proj and out_proj (left padding differs there, see the tests below)
    "mamba-bias": lambda: mamba(hidden_size=40, state_size=6, use_bias=True, tie_word_embeddings=False),
    # B/C/Δ norms with an ε large enough to move the logits, untied head
    "falcon-untied": lambda: falcon(mixer_rms_eps=1e-2, tie_word_embeddings=False),
    # the default ε 1e-6, kernel 3, Δ rank 4 (not 3), hidden 40 over 2 layers, tied head
    "falcon-tied": lambda: falcon(hidden_size=40, num_hidden_layers=2, conv_kernel=3, time_step_rank=4),
}
UNBIASED = [name for name in MODELS if name != "mamba-bias"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    return parity.cached_imports(lambda name: MODELS[name](), tmp_path_factory)


@pytest.mark.parametrize("name", UNBIASED)
def test_family_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits plain and left-padded, 32 greedy steps with and without the state cache, the export."""
    parity.check_causal_lm(imported(name), tmp_path / "out", T, position_ids=False)


def test_in_proj_biases_match_on_unpadded_rows_decode_alike_and_export(imported, tmp_path):
    pair = imported("mamba-bias")
    parity.check_logits(pair, T)
    parity.check_export(pair, tmp_path / "out", T)
    parity.check_greedy(pair, pad=0)  # transformers leaks the pads here; see the next test


def test_with_in_proj_biases_transformers_leaks_left_padding_into_the_conv_and_seqzoo_does_not(imported):
    """transformers zeroes the normed input at a pad, but in_proj adds its bias back and the conv
    carries that into the first K − 1 real tokens: its padded row is not the row alone. seqzoo's
    padded row is, and equals transformers' row alone."""
    pair = imported("mamba-bias")
    ids, mask = parity.left_padded(V, T, pad=3)
    real = ids[-1:, 3:]
    with torch.no_grad():
        theirs_padded = pair.hf(ids, attention_mask=mask).logits[-1, 3:]
        theirs_alone = pair.hf(real).logits[0]
        ours_padded = pair.model(ids, attention_mask=mask)[-1, 3:]
    assert parity.max_difference(theirs_padded, theirs_alone) > 1e-2
    assert parity.max_difference(ours_padded, theirs_alone) < parity.TOL


def test_the_reference_is_transformers_sequential_pytorch_path(imported, monkeypatch):
    """transformers runs mamba_ssm's or causal_conv1d's kernels when installed, the mambapy parallel
    scan (``pscan``, installed here) when ``use_mambapy`` is true (default false; FalconMambaConfig
    even resets it to false unless given as ``use_falcon_mambapy``), and torch's associative_scan only
    while compiling. Without the kernels and with pscan made to fail, the reference's logits are
    unchanged: they came from the sequential loop over time steps."""
    if importlib.util.find_spec("mamba_ssm") or importlib.util.find_spec("causal_conv1d"):
        pytest.skip("mamba_ssm / causal_conv1d installed: transformers would run their kernels")
    import mambapy.pscan

    def refuse(*args, **kwargs):
        raise AssertionError("transformers ran mambapy's pscan")

    ids = torch.randint(V, (2, T))
    for name in ("mamba-tied", "falcon-untied"):
        pair = imported(name)
        assert pair.hf.config.use_mambapy is False
        with torch.no_grad():
            before = pair.hf(ids).logits
            monkeypatch.setattr(mambapy.pscan, "pscan", refuse)
            after = pair.hf(ids).logits
            monkeypatch.undo()
        assert torch.equal(before, after)
        assert parity.max_difference(pair.model(ids), after) < parity.TOL


# -- what the imported recipes say -------------------------------------------------------------------
def test_imported_recipes_read_as_mamba_layers_without_ffn_or_positions(imported):
    m = imported("mamba-rank-untied").model.recipe["model"]
    assert m["ffn"] is None and m["position"] == {"kind": "none"} and m["placement"] == "pre"
    assert m["norm"] == {"kind": "rmsnorm", "eps": 1e-6} and m["tie_embeddings"] is False and m["layers"] == 3
    mixer = m["mixer"]
    assert (mixer["kind"], mixer["state"], mixer["conv"], mixer["expand"], mixer["dt_rank"]) == ("mamba", 4, 3, 2, 5)
    assert (mixer["bias"], mixer["conv_bias"], mixer["bcdt_norm_eps"]) == (False, False, None)
    assert imported("mamba-tied").model.recipe["model"]["mixer"]["dt_rank"] == 2
    assert imported("mamba-tied").model.recipe["model"]["tie_embeddings"] is True
    assert imported("mamba-bias").model.recipe["model"]["mixer"]["bias"] is True
    falcon_mixer = imported("falcon-untied").model.recipe["model"]["mixer"]
    assert falcon_mixer["bcdt_norm_eps"] == 1e-2 and falcon_mixer["dt_rank"] == 3
    assert imported("falcon-tied").model.recipe["model"]["mixer"]["bcdt_norm_eps"] == 1e-6


def test_exported_config_names_the_width_both_ways(imported, tmp_path):
    config = json.loads((seqzoo.to_hf(imported("falcon-tied").model, tmp_path / "out") / "config.json").read_text())
    assert config["model_type"] == "falcon_mamba" and config["architectures"] == ["FalconMambaForCausalLM"]
    assert (config["expand"], config["intermediate_size"], config["time_step_rank"]) == (2, 80, 4)
    assert config["mixer_rms_eps"] == 1e-6 and config["use_mambapy"] is False



def test_intermediate_size_wins_over_expand_as_in_transformers(imported, tmp_path):
    """transformers 5 sets intermediate_size from expand, then lets config.json's own value win."""
    _, _, folder = imported("mamba-tied")
    config = {**json.loads((folder / "config.json").read_text()), "expand": 16, "intermediate_size": 64}
    assert transformers.MambaConfig(**config).intermediate_size == 64
    model = seqzoo.from_hf(parity.edited_copy(folder, tmp_path / "wide", config))
    assert model.recipe["model"]["mixer"]["expand"] == 2


# -- what is refused ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name, change, match", [
    ("mamba-tied", {"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported; seqzoo's mamba mixer applies SiLU"),
    ("mamba-tied", {"intermediate_size": 48},
     r"intermediate_size 48 is not supported; .* whole multiple \(expand\) of hidden_size 32"),
    ("mamba-tied", {"time_step_rank": 0}, r"time_step_rank 0 is not supported; it must be a positive integer"),
    ("mamba-tied", {"use_bias": "yes"}, r"use_bias 'yes' is not supported; it must be true or false"),
    ("falcon-tied", {"mixer_rms_eps": 0}, r"mixer_rms_eps 0 is not supported; it must be a positive number"),
])
def test_unsupported_config_option_is_refused_in_one_line(imported, tmp_path, name, change, match):
    parity.check_refused(imported(name).folder, tmp_path / "bad", change, match)


def test_exporters_refuse_what_their_family_cannot_express(imported):
    mamba_converter = seqzoo.registry().get("converter", "mamba").cls()
    falcon_converter = seqzoo.registry().get("converter", "falcon_mamba").cls()
    plain = imported("mamba-tied").model.recipe
    normed = imported("falcon-tied").model.recipe
    assert "Falcon-Mamba has" in mamba_converter.accepts(normed)
    assert "bcdt_norm_eps is null" in falcon_converter.accepts(plain)

    def changed(recipe, **model):
        return {**recipe, "model": {**recipe["model"], **model}}

    assert "model.ffn is swiglu" in mamba_converter.accepts(changed(plain, ffn={"kind": "swiglu", "hidden": 64}))
    assert "model.mixer is None, needs mamba" in mamba_converter.accepts(changed(plain, mixer=None))
    assert "model.position is rope" in mamba_converter.accepts(changed(plain, position={"kind": "rope"}))
    assert "model.pattern" in mamba_converter.accepts(changed(plain, pattern=["a", "b"]))
    assert "model.norm is layernorm" in falcon_converter.accepts(changed(normed, norm={"kind": "layernorm"}))
    with pytest.raises(CheckpointError, match="cannot export as mamba"):
        seqzoo.to_hf(imported("falcon-tied").model, "unused", model_type="mamba")


def test_a_seqzoo_built_mamba_exports_and_transformers_gives_its_logits(tmp_path):
    model = seqzoo.build("tiny-mamba", device="cpu").eval()
    folder = seqzoo.to_hf(model, tmp_path / "out")  # the only family that fits: mamba
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(hf).__name__ == "MambaForCausalLM" and hf.config.time_step_rank == 4  # ⌈64 / 16⌉
    ids = torch.randint(3, 259, (2, T))
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL
