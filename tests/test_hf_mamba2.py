"""Mamba-2 and Bamba against transformers: small random models of each family, with configs chosen
to exercise what sets them apart — grouped B/C (two and three groups) and the gated norm per group,
a conv kernel of 3, expand 1, SSD chunks of 8 crossed by every sequence (T = 20), a finite
time_step_limit, biases; Bamba's attention layers at an index that cuts the pattern short
([mamba, mamba, attention] over 5 layers) and at irregular ones, GQA over an odd head count, the
hard-coded partial rotary (half of each head), a quarter and a whole one, head_dim ≠ C / H, a tied
head — imported with ``seqzoo.from_hf`` and checked with the converter kit (logits ≤ 1e-4 float32
plain and left-padded, 32 greedy steps with and without the state cache, an exported folder
transformers loads).

The reference is transformers' PyTorch path: no CUDA, mamba_ssm or causal_conv1d kernels run here,
so ``Mamba2Mixer`` / ``BambaMixer`` fall back to ``mamba2_chunk_scan``, ``causal_conv1d_fn`` and
``mamba2_selective_state_update`` (eval mode: the fused training kernel is never tried).
``test_the_reference_runs_its_pytorch_path`` makes sure of it.
"""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from safetensors.torch import load_file

import seqzoo
from seqzoo.errors import CheckpointError
from seqzoo.nn.generation import generate
from seqzoo.testing import parity

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.filterwarnings("ignore:.*no tokenizer written")  # random models have none

V = 128   # vocabulary of every test model
T = 20    # test sequence length: longer than two SSD chunks of 8
IDS = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def mamba2(**kw):
    config = {**IDS, "hidden_size": 32, "num_heads": 8, "head_dim": 8, "state_size": 8, "n_groups": 2,
              "num_hidden_layers": 3, "chunk_size": 8, **kw}
    return parity.randomised(transformers.Mamba2ForCausalLM(transformers.Mamba2Config(**config)))


def bamba(**kw):
    # 12 Mamba heads of 8 over 2 groups (expand 2 · 48 = 96); attention 3 heads over 1 kv head, D = 16
    config = {**IDS, "max_position_embeddings": 64, "hidden_size": 48, "num_attention_heads": 3,
              "num_key_value_heads": 1, "intermediate_size": 64, "num_hidden_layers": 5, "attn_layer_indices": [2],
              "mamba_n_heads": 12, "mamba_d_head": 8, "mamba_n_groups": 2, "mamba_d_state": 8,
              "mamba_chunk_size": 8, **kw}
    return parity.randomised(transformers.BambaForCausalLM(transformers.BambaConfig(**config)))


def rope(kind: str, theta: float, **params) -> dict:
    return {"rope_type": kind, "rope_theta": theta, **params}


MODELS = {
    # 8 heads of 8 in 2 groups of B/C (the gated norm over 2 groups of 32), 3 layers, untied head
    "mamba2-groups": lambda: mamba2(),
    # expand 1: 6 heads of 8 in 3 groups; conv kernel 3 without a bias; tied head; ε 1e-6; chunks of 8
    "mamba2-expand1-tied": lambda: mamba2(hidden_size=48, expand=1, num_heads=6, n_groups=3, conv_kernel=3,
                                          use_conv_bias=False, tie_word_embeddings=True, layer_norm_epsilon=1e-6,
                                          num_hidden_layers=2),
    # Δ clamped to [0, 0.05] (the initial Δ reaches 0.1); one group
    "mamba2-limit": lambda: mamba2(n_groups=1, time_step_limit=(0.0, 0.05), num_hidden_layers=2),
    # biases on in_proj and out_proj
    "mamba2-bias": lambda: mamba2(use_bias=True, num_hidden_layers=2),
    # [mamba, mamba, attention, mamba, mamba]: the pattern [mamba, mamba, attention] cut short;
    # the hard-coded partial rotary: 8 of 16 dims
    "bamba-cut-short": lambda: bamba(),
    # attention at 0 and 4 of 6 ([attention, mamba, mamba, mamba], cut after two); biases on q/k/v/o
    # and the MLP, tied head, 5 heads of 8 over 5 kv heads rotating whole heads, linear RoPE
    # scaling, mamba_d_head "auto" (80 / 10 = 8), one group, no conv bias
    "bamba-irregular": lambda: bamba(hidden_size=40, num_attention_heads=5, num_key_value_heads=5,
                                     num_hidden_layers=6, attn_layer_indices=[0, 4], attention_bias=True,
                                     mlp_bias=True, tie_word_embeddings=True, mamba_n_heads=10, mamba_d_head="auto",
                                     mamba_n_groups=1, mamba_conv_bias=False,
                                     rope_parameters=rope("linear", 10000.0, factor=2.0, partial_rotary_factor=1.0)),
    # every other layer attends ([mamba, attention] twice); head_dim 16 ≠ 48 / 4, 4 heads over 2,
    # a quarter of each head rotated; a Δ limit and conv kernel 3 in the Mamba layers
    "bamba-periodic": lambda: bamba(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
                                    attn_layer_indices=[1, 3], mamba_d_conv=3, time_step_limit=(0.0, 0.05),
                                    rope_parameters=rope("default", 5000.0, partial_rotary_factor=0.25)),
}
#: Models whose time_step_limit binds: transformers' cached decoding skips the clamp its full
#: forward applies, so their greedy tokens are checked against its uncached generation.
LIMITED = {"mamba2-limit", "bamba-periodic"}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    return parity.cached_imports(lambda name: MODELS[name](), tmp_path_factory)


@pytest.mark.parametrize("name", [n for n in MODELS if n not in LIMITED and n != "mamba2-bias"])
def test_family_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits plain and left-padded, 32 greedy steps with and without the state cache, the export."""
    parity.check_causal_lm(imported(name), tmp_path / "out", T)


@pytest.mark.parametrize("name", sorted(LIMITED))
def test_time_step_limit_matches_the_full_forward_of_transformers(imported, name, tmp_path):
    """A finite limit clamps Δ in seqzoo's decode step as in the chunked scan; transformers' step
    skips it, so decoding is compared with its uncached generation (its full forward each step)."""
    pair = imported(name)
    parity.check_logits(pair, T)
    parity.check_padded_logits(pair, T)
    parity.check_export(pair, tmp_path / "out", T)
    ids, mask = parity.left_padded(V, 8, pad=2)
    theirs = parity.hf_greedy(pair.hf, ids, mask, 32, use_cache=False)
    for use_cache in (True, False):
        ours = generate(pair.model, ids, 32, attention_mask=mask, eos_id=None, use_cache=use_cache)
        assert torch.equal(ours, theirs), f"use_cache={use_cache}"


def test_biases_match_transformers_unpadded_and_pad_without_leaking(imported, tmp_path):
    """With use_bias, transformers zeroes padding before in_proj, so the conv sees the bias at pad
    positions and carries it into the first real tokens; seqzoo zeroes the conv input, so the padded
    row equals the row alone. Unpadded, the two agree, and so does greedy decoding."""
    pair = imported("mamba2-bias")
    parity.check_logits(pair, T)
    parity.check_export(pair, tmp_path / "out", T)
    parity.check_greedy(pair, pad=0)
    ids, mask = parity.left_padded(V, T)
    alone = ids[-1:, 3:]
    with torch.no_grad():
        ours, ours_alone = pair.model(ids, attention_mask=mask)[-1, 3:], pair.model(alone)[0]
        theirs, theirs_alone = pair.hf(ids, attention_mask=mask).logits[-1, 3:], pair.hf(alone).logits[0]
    assert parity.max_difference(ours, ours_alone) < parity.TOL
    assert parity.max_difference(ours_alone, theirs_alone) < parity.TOL
    assert parity.max_difference(theirs, theirs_alone) > 1e-3  # transformers' leak, not seqzoo's


def test_the_reference_runs_its_pytorch_path(imported):
    """transformers swaps in mamba_ssm's and causal_conv1d's kernels when they import; neither is
    installed, so every reference here is its PyTorch code, in eval mode (no fused training path)."""
    for package in ("mamba_ssm", "causal_conv1d"):
        assert importlib.util.find_spec(package) is None, f"{package} would replace transformers' PyTorch path"
    assert not imported("mamba2-groups").hf.training


# -- what the imported recipes say -------------------------------------------------------------------
def test_mamba2_recipe_reads_the_mixer_options(imported):
    m = imported("mamba2-groups").model.recipe["model"]
    assert m["position"]["kind"] == "none" and m["ffn"] is None and m["tie_embeddings"] is False
    assert {k: m["mixer"][k] for k in ("kind", "state", "head_dim", "groups", "conv", "expand", "bias",
                                       "conv_bias", "dt_limit", "chunk")} == {
        "kind": "mamba2", "state": 8, "head_dim": 8, "groups": 2, "conv": 4, "expand": 2, "bias": False,
        "conv_bias": True, "dt_limit": None, "chunk": 8}
    m = imported("mamba2-expand1-tied").model.recipe["model"]
    assert m["mixer"]["expand"] == 1 and m["mixer"]["groups"] == 3 and m["mixer"]["conv"] == 3
    assert m["mixer"]["conv_bias"] is False and m["tie_embeddings"] is True
    assert m["norm"]["eps"] == m["mixer"]["norm_eps"] == 1e-6
    assert imported("mamba2-limit").model.recipe["model"]["mixer"]["dt_limit"] == [0.0, 0.05]
    assert imported("mamba2-bias").model.recipe["model"]["mixer"]["bias"] is True


def test_mamba2_gated_norm_groups_as_transformers_does(imported):
    hf, model, _ = imported("mamba2-groups")
    assert hf.backbone.layers[0].mixer.norm.group_size == 32  # intermediate 64 / 2 groups
    mixer = model.decoder.blocks[0].mixer
    y, z = torch.randn(2, 5, 64), torch.randn(2, 5, 64)
    assert torch.allclose(mixer.norm(y, z), hf.backbone.layers[0].mixer.norm(y, z), atol=1e-6)


def test_bamba_recipe_reads_the_layer_pattern_and_partial_rotary(imported):
    m = imported("bamba-cut-short").model.recipe["model"]
    assert m["layer_types"] == {"mamba": {}, "attention": {"mixer": "attention"}}
    assert m["pattern"] == ["mamba", "mamba", "attention"] and not m["layer_overrides"]  # over 5 layers
    assert m["mixer"]["kind"] == "mamba2" and m["mixer"]["groups"] == 2 and m["mixer"]["head_dim"] == 8
    assert m["position"]["rotary_dim"] == 8 and m["attention"]["kv_heads"] == 1  # BambaConfig's 0.5
    assert m["ffn"]["kind"] == "swiglu" and m["ffn"]["bias"] is False and m["norm"]["eps"] == m["mixer"]["norm_eps"]
    m = imported("bamba-irregular").model.recipe["model"]
    assert m["pattern"] == ["attention", "mamba", "mamba", "mamba"]  # and again, cut after two
    assert m["position"]["rotary_dim"] is None and m["position"]["scaling"]["kind"] == "linear"
    assert m["attention"]["bias"] is True and m["ffn"]["bias"] is True and m["tie_embeddings"] is True
    assert m["mixer"]["head_dim"] == 8 and m["mixer"]["groups"] == 1 and m["mixer"]["conv_bias"] is False
    m = imported("bamba-periodic").model.recipe["model"]
    assert m["pattern"] == ["mamba", "attention"] and m["attention"]["head_dim"] == 16
    assert m["position"]["rotary_dim"] == 4 and m["position"]["base"] == 5000.0
    assert m["mixer"]["dt_limit"] == [0.0, 0.05] and m["mixer"]["conv"] == 3


@pytest.mark.parametrize("name", ["bamba-cut-short", "bamba-irregular", "bamba-periodic"])
def test_bamba_export_rebuilds_the_layer_kinds_and_names_the_rotary_fraction(imported, name, tmp_path):
    hf, model, _ = imported(name)
    config = json.loads((seqzoo.to_hf(model, tmp_path / "out") / "config.json").read_text())
    assert config["attn_layer_indices"] == hf.config.attn_layer_indices
    assert config["rope_parameters"]["partial_rotary_factor"] == hf.config.rope_parameters["partial_rotary_factor"]
    assert config["mamba_n_heads"] == hf.config.mamba_n_heads and config["mamba_d_head"] == 8


@pytest.mark.parametrize("recipe, family, hf_class", [("tiny-mamba2", "mamba2", "Mamba2ForCausalLM"),
                                                      ("tiny-hybrid", "bamba", "BambaForCausalLM")])
def test_seqzoo_recipes_export_to_their_family(recipe, family, hf_class, tmp_path):
    """tiny-mamba2 is a Mamba-2, tiny-hybrid (1 attention layer in 4, whole-head RoPE) a Bamba."""
    model = seqzoo.build(recipe, device="cpu").eval()
    out = seqzoo.to_hf(model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    hf = getattr(transformers, hf_class).from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(3, 259, (2, 70))  # longer than one chunk of 64
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL


# -- old checkpoints and refusals --------------------------------------------------------------------
def test_mamba2_bare_backbone_with_the_old_embedding_name_imports(imported, tmp_path):
    hf, _, folder = imported("mamba2-expand1-tied")  # tied: the bare model's names are all there is
    config = json.loads((folder / "config.json").read_text())
    bare = parity.edited_copy(folder, tmp_path / "bare", config,
                              rename=lambda k: k.removeprefix("backbone.").replace("embeddings.", "embedding."))
    assert "embedding.weight" in load_file(bare / "model.safetensors")
    model = seqzoo.from_hf(bare)
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL


@pytest.mark.parametrize("name, change, match", [
    ("mamba2-groups", {"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported for mamba2"),
    ("mamba2-groups", {"num_heads": 6}, r"num_heads 6 × head_dim 8 = 48 must equal expand·hidden_size = 64"),
    ("mamba2-groups", {"n_groups": 3}, r"n_groups 3 is not supported; it must divide num_heads 8"),
    ("mamba2-groups", {"expand": 1.5}, r"expand 1.5 is not supported; it must be a positive integer"),
    ("mamba2-groups", {"time_step_limit": [0.1]}, r"time_step_limit \[0.1\] is not supported"),
    ("mamba2-groups", {"time_step_limit": [0.2, 0.1]}, r"time_step_limit \[0.2, 0.1\] is not supported"),
    ("bamba-cut-short", {"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported for bamba"),
    ("bamba-cut-short", {"time_step_limit": None}, r"time_step_limit None is not supported"),
    ("bamba-cut-short", {"attn_layer_indices": [2, 7]}, r"attn_layer_indices \[2, 7\] is not supported"),
    ("bamba-cut-short", {"layers_block_type": ["mamba"] * 5}, r"layers_block_type .* disagrees with attn_layer"),
    ("bamba-cut-short", {"mamba_n_groups": 5}, r"mamba_n_groups 5 is not supported; it must divide mamba_n_heads"),
    ("bamba-cut-short", {"mamba_d_head": 16}, r"mamba_n_heads 12 × mamba_d_head 16 = 192 must equal mamba_expand"),
    ("bamba-cut-short", {"rope_parameters": rope("default", 1e4, partial_rotary_factor=0.1875)},
     r"partial_rotary_factor 0.1875 rotates 3 of head_dim 16"),
    ("bamba-cut-short", {"rope_parameters": rope("longrope", 1e4)}, r"rope_type 'longrope' is not supported"),
])
def test_unsupported_config_option_is_refused_in_one_line(imported, tmp_path, name, change, match):
    parity.check_refused(imported(name).folder, tmp_path / "bad", change, match)


def with_model(recipe: dict, **changes) -> dict:
    return {**recipe, "model": {**recipe["model"], **changes}}


def test_exporters_refuse_what_their_family_cannot_express(imported):
    mamba2_converter = seqzoo.registry().get("converter", "mamba2").cls()
    bamba_converter = seqzoo.registry().get("converter", "bamba").cls()
    recipe = imported("mamba2-groups").model.recipe
    mixer = recipe["model"]["mixer"]
    assert "model.ffn is set" in mamba2_converter.accepts(with_model(recipe, ffn={"kind": "swiglu", "hidden": 64}))
    assert "model.position is rope" in mamba2_converter.accepts(with_model(recipe, position="rope"))
    assert "norm_eps 0.001 must equal model.norm.eps" in mamba2_converter.accepts(
        with_model(recipe, mixer={**mixer, "norm_eps": 1e-3}))
    reversed_limit = with_model(recipe, mixer={**mixer, "dt_limit": [0.5, 0.1]})
    assert "dt_limit [0.5, 0.1]" in mamba2_converter.accepts(reversed_limit)
    assert "model.mixer is mamba, needs mamba2" in mamba2_converter.accepts(with_model(recipe, mixer="mamba"))
    assert "model.ffn is None, needs swiglu" in bamba_converter.accepts(recipe)
    hybrid = imported("bamba-cut-short").model.recipe
    assert "layers differ" in mamba2_converter.accepts(hybrid)
    attention = hybrid["model"]["attention"]
    assert "window" in bamba_converter.accepts(with_model(hybrid, attention={**attention, "window": 4}))
    assert "Mamba-2 layers differ" in bamba_converter.accepts(with_model(hybrid, layer_overrides={
        3: {"mixer": {"state": 16}}}))
    assert "differ only in their mixer" in bamba_converter.accepts(with_model(hybrid, layer_types={
        "mamba": {}, "attention": {"mixer": "attention", "ffn": {"hidden": 32}}}))
    assert "mamba2 or attention" in bamba_converter.accepts(with_model(hybrid, mixer="mamba"))
    assert "needs swiglu" in bamba_converter.accepts(with_model(hybrid, ffn={"kind": "gelu", "hidden": 64}))
    with pytest.raises(CheckpointError, match="cannot export as mamba2"):
        seqzoo.to_hf(imported("bamba-cut-short").model, "unused", model_type="mamba2")


def test_a_constant_step_clamp_imports_and_a_negative_floor_is_zero():
    """lo = hi clamps every Δ to one value, which transformers runs; a negative lo clamps as 0 does
    (Δ is a softplus), and the mixer takes no floor below 0."""
    from seqzoo.plugins.converter._mamba2 import time_step_limit

    assert time_step_limit([0.1, 0.1]) == [0.1, 0.1] and time_step_limit([-0.5, 0.2]) == [0.0, 0.2]
    seqzoo.build({"extends": "tiny-mamba2", "model": {"mixer": {"dt_limit": [0.1, 0.1]}}}, device="meta")
