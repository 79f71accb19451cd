"""Falcon-H1 (``falcon_h1``) against transformers: small random models chosen to exercise what sets
the family apart — attention and Mamba-2 side by side on one normed input in every layer (seqzoo's
``parallel`` mixer), every μP multiplier ≠ 1 (embeddings, logits, keys, attention in and out, SSM in
and out, the five per-slice ``ssm_multipliers`` and the MLP's gate and down multipliers, the last
two folded into the weights on import), the Mamba-2 layer without its gated norm (Falcon-H1-0.5B's
``mamba_rms_norm: false``), with it normalising before the gate (``mamba_norm_before_gate``) and
after; an inner width ``mamba_d_ssm`` that is no multiple of the model width (6 heads of 12 over
C = 40) and one sized by ``mamba_expand``, two groups, SSD chunks of 8 crossed by every T = 20
sequence; GQA over heads of 12 (head_dim ≠ C / H) and one KV head, RoPE; biases on every projection,
random norms, biases and A/D/Δ-bias; tied and untied heads — imported with ``seqzoo.from_hf`` and
checked with the converter kit: logits ≤ 1e-4 in float32 (measured ≤ 9e-7 on logits of order 2),
plain and left-padded, 32 greedy steps with and without the state cache equal to transformers' own
cached generation, and an exported folder that transformers loads with the same logits.

Left padding is not compared where the Mamba-2 in-projection has a bias: transformers zeroes a pad's
layer input before ``in_proj``, so the bias still enters the conv from the pads, which seqzoo zeroes
(as for Mamba-2 and Bamba); that model decodes unpadded prompts.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

import seqzoo
from seqzoo.builder import layer_plan
from seqzoo.cli import main
from seqzoo.recipe import resolve
from seqzoo.testing import parity
from seqzoo.testing._shared import kv_cache_equivalence, left_padding_equivalence

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.filterwarnings("ignore:.*no tokenizer written")  # random models have none

V = 128   # vocabulary of every test model
T = 20    # test sequence length: longer than two SSD chunks of 8, not a multiple of 8
IDS = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0)
MULTIPLIERS = dict(embedding_multiplier=1.7, lm_head_multiplier=0.6, key_multiplier=0.4, attention_in_multiplier=1.3,
                   attention_out_multiplier=0.8, ssm_in_multiplier=1.25, ssm_out_multiplier=0.7,
                   ssm_multipliers=[0.35, 0.25, 0.5, 1.5, 0.8], mlp_multipliers=[0.9, 0.6])
FALCON = seqzoo.registry().get("converter", "falcon_h1").cls()
ABSENT = object()  # a key left out of config.json


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def falcon(**kw):
    # attention: 4 heads of 12 over 2 KV heads (head_dim ≠ 40 / 4), RoPE θ = 1000; Mamba-2: 6 heads of 12
    # (mamba_d_ssm 72, no multiple of 40) in 2 groups, state 8, chunks of 8; SwiGLU of 56
    config = {**IDS, **MULTIPLIERS, "hidden_size": 40, "intermediate_size": 56, "num_hidden_layers": 3,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12, "max_position_embeddings": 64,
              "rope_theta": 1000.0, "mamba_d_ssm": 72, "mamba_n_heads": 6, "mamba_d_head": 12, "mamba_n_groups": 2,
              "mamba_d_state": 8, "mamba_chunk_size": 8, "initializer_range": 0.1, **kw}  # logits of order 1
    config = {k: v for k, v in config.items() if v is not ABSENT}  # transformers reads a null head_dim as a width
    model = transformers.FalconH1ForCausalLM(transformers.FalconH1Config(**config))
    with torch.no_grad():  # transformers starts A_log, D and the Δ bias at fixed values; a swapped one must show
        for name, parameter in model.named_parameters():
            if name.endswith(("A_log", ".D", "dt_bias")):
                parameter.add_(0.3 * torch.randn_like(parameter))
    return parity.randomised(model)


MODELS = {
    # Falcon-H1-0.5B's layout: no gated norm in the Mamba-2 layers, no biases, an untied head
    "falcon-0.5b-layout": lambda: falcon(mamba_rms_norm=False, mamba_norm_before_gate=False),
    # the gated norm before the gate (FalconH1Config's default when it is on); biases on q/k/v/o, the
    # MLP and both Mamba-2 projections
    "falcon-biases": lambda: falcon(mamba_rms_norm=True, mamba_norm_before_gate=True, attention_bias=True,
                                    mlp_bias=True, mamba_proj_bias=True, projectors_bias=True),
    # Mamba-2's own order (gate, then norm); the inner width expand·C = 80 in 10 heads of "auto" 8;
    # head_dim C / H over one KV head; a tied head
    "falcon-mamba2-norm": lambda: falcon(mamba_rms_norm=True, mamba_norm_before_gate=False, mamba_d_ssm=None,
                                         mamba_n_heads=10, mamba_d_head="auto", head_dim=ABSENT, num_attention_heads=5,
                                         num_key_value_heads=1, tie_word_embeddings=True),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    return parity.cached_imports(lambda name: MODELS[name](), tmp_path_factory)


@pytest.mark.parametrize("name", ["falcon-0.5b-layout", "falcon-mamba2-norm"])
def test_family_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits plain and left-padded, 32 greedy steps with and without the state cache, the export."""
    parity.check_causal_lm(imported(name), tmp_path / "out", T, model_type="falcon_h1")


def test_a_model_with_mamba_biases_matches_unpadded_and_exports(imported, tmp_path):
    pair = imported("falcon-biases")
    assert parity.check_logits(pair, T) < 1e-5
    parity.check_export(pair, tmp_path / "out", T, model_type="falcon_h1")
    parity.check_greedy(pair, pad=0)


def test_the_multipliers_reach_the_logits(imported, tmp_path):
    """Each multiplier is read: with it reset to 1 in config.json alone, the import's logits leave
    the reference's (the recipe's and the folded ones alike)."""
    hf, _, folder = imported("falcon-0.5b-layout")
    config = json.loads((folder / "config.json").read_text())
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        theirs = hf(ids).logits
    for key, one in [("embedding_multiplier", 1.0), ("lm_head_multiplier", 1.0), ("key_multiplier", 1.0),
                     ("attention_in_multiplier", 1.0), ("attention_out_multiplier", 1.0), ("ssm_in_multiplier", 1.0),
                     ("ssm_out_multiplier", 1.0), ("ssm_multipliers", [1.0] * 5), ("mlp_multipliers", [1.0, 1.0])]:
        model = seqzoo.from_hf(parity.edited_copy(folder, tmp_path / key, {**config, key: one}), device="cpu")
        with torch.no_grad():
            assert parity.max_difference(model(ids), theirs) > 1e-3, key


# -- what the imported recipes say -------------------------------------------------------------------
def test_recipe_reads_the_parallel_layer_and_its_multipliers(imported):
    m = imported("falcon-0.5b-layout").model.recipe["model"]
    attention, mamba = m["mixer"]["mixers"]
    assert m["mixer"]["kind"] == "parallel" and (attention["kind"], mamba["kind"]) == ("attention", "mamba2")
    assert m["mixer"]["in_multipliers"] == [1.3, 1.25] and m["mixer"]["out_multipliers"] == [0.8, 0.7]
    assert (m["embedding_multiplier"], m["logits_multiplier"]) == (1.7, 0.6)
    assert attention["score"]["scale"] == pytest.approx(0.4 / 12 ** 0.5) and attention["head_dim"] == 12
    assert (mamba["heads"], mamba["head_dim"], mamba["groups"], mamba["chunk"]) == (6, 12, 2, 8)
    assert (mamba["rmsnorm"], mamba["norm_before_gate"]) == (False, False)
    assert m["position"] == {"kind": "rope", "base": 1000.0, "rotary_dim": None, "interleaved": False,
                             "scaling": None}
    assert not any(".norm." in n for n in imported("falcon-0.5b-layout").model.state_dict() if "mixers.1" in n)
    mamba = imported("falcon-biases").model.recipe["model"]["mixer"]["mixers"][1]
    assert (mamba["rmsnorm"], mamba["norm_before_gate"], mamba["bias"]) == (True, True, True)
    m = imported("falcon-mamba2-norm").model.recipe["model"]
    mamba = m["mixer"]["mixers"][1]
    assert (mamba["heads"], mamba["head_dim"], mamba["rmsnorm"], mamba["norm_before_gate"]) == (10, 8, True, False)
    assert m["tie_embeddings"] is True


@pytest.mark.parametrize("name", list(MODELS))
def test_export_writes_the_family_config(imported, name, tmp_path):
    hf, model, _ = imported(name)
    config = json.loads((seqzoo.to_hf(model, tmp_path / "out", model_type="falcon_h1") / "config.json").read_text())
    for key in ("embedding_multiplier", "lm_head_multiplier", "attention_in_multiplier", "attention_out_multiplier",
                "ssm_in_multiplier", "ssm_out_multiplier", "mamba_rms_norm", "mamba_n_heads", "mamba_n_groups",
                "projectors_bias", "tie_word_embeddings"):
        assert config[key] == getattr(hf.config, key), key
    assert config["key_multiplier"] == pytest.approx(0.4)
    assert config["mamba_d_ssm"] == hf.config.mamba_n_heads * hf.config.mamba_d_head
    assert config["ssm_multipliers"] == [1.0] * 5 and config["mlp_multipliers"] == [1.0, 1.0]  # in the weights


def test_the_exported_folder_is_found_without_naming_the_family(imported):
    """A parallel attention + Mamba-2 layer has no other family: every other converter refuses it."""
    recipe = imported("falcon-0.5b-layout").model.recipe
    accepting = [name for name in seqzoo.io.hf.supported()
                 if name != "falcon_h1" and _accepts(seqzoo.io.hf.converter_for(name), recipe)]
    assert accepting == [] and FALCON.accepts(recipe) is None


def _accepts(converter, recipe) -> bool:
    try:
        return converter.accepts(recipe) is None
    except NotImplementedError:  # an import-only family
        return False


# -- the Mamba-2 options Falcon-H1 needs ------------------------------------------------------------
@pytest.mark.parametrize("options", ["rmsnorm: false", "norm_before_gate: true"])
def test_a_mamba2_without_its_usual_gated_norm_decodes_from_its_state_as_it_computes_whole(options):
    model = seqzoo.build("tiny-mamba2", [f"model.mixer={{kind: mamba2, state: 8, head_dim: 16, groups: 2, "
                                         f"chunk: 4, {options}}}"], device="cpu").eval()
    assert ("decoder.blocks.0.mixer.norm.weight" in model.state_dict()) == ("rmsnorm" not in options)
    kv_cache_equivalence(model)
    left_padding_equivalence(model)


@pytest.mark.parametrize("family, recipe", [("mamba2", "tiny-mamba2"), ("bamba", "tiny-hybrid"),
                                            ("granitemoehybrid", "tiny-hybrid")])
@pytest.mark.parametrize("option", ["rmsnorm=false", "norm_before_gate=true"])
def test_the_other_mamba2_families_refuse_another_gated_norm(family, recipe, option):
    converter = seqzoo.io.hf.converter_for(family)
    assert converter.accepts(seqzoo.build(recipe, device="meta").recipe) is None
    reason = converter.accepts(seqzoo.build(recipe, [f"model.mixer.{option}"], device="meta").recipe)
    assert reason is not None and "Mamba-2 gates, then normalises (rmsnorm true, norm_before_gate false)" in reason


# -- refusals ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, match", [
    ({"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported; Falcon-H1's Mamba-2 conv and MLP"),
    ({"mamba_d_ssm": 80}, r"mamba_d_ssm 80 is not supported; it must equal mamba_n_heads 6 × mamba_d_head 12"),
    ({"projectors_bias": True}, r"projectors_bias True is not supported; seqzoo's Mamba-2 has one bias setting"),
    ({"time_step_limit": None}, r"time_step_limit None is not supported; write \[0.0, Infinity\]"),
    ({"ssm_multipliers": [1.0, 2.0]}, r"ssm_multipliers \[1.0, 2.0\] is not supported; it must list 5 positive"),
    ({"mlp_multipliers": [1.0, 0]}, r"mlp_multipliers \[1.0, 0\] is not supported; it must list 2 positive"),
    ({"key_multiplier": 0}, r"key_multiplier 0 is not supported; it must be a positive number"),
    ({"rope_parameters": {"rope_type": "su", "rope_theta": 1e4}}, r"rope_type 'su' is not supported"),
])
def test_unsupported_config_option_is_refused_in_one_line(imported, tmp_path, change, match):
    parity.check_refused(imported("falcon-0.5b-layout").folder, tmp_path / "bad", change, match)


def with_mixer(recipe: dict, branch: int | None = None, **changes) -> dict:
    mixer = recipe["model"]["mixer"]
    if branch is not None:
        mixers = list(mixer["mixers"])
        mixers[branch] = {**mixers[branch], **changes}
        changes = {"mixers": mixers}
    return {**recipe, "model": {**recipe["model"], "mixer": {**mixer, **changes}}}


def with_model(recipe: dict, **changes) -> dict:
    return {**recipe, "model": {**recipe["model"], **changes}}


@pytest.mark.parametrize("change, match", [
    (lambda r: with_model(r, mixer={"kind": "mamba2", "head_dim": 8}), r"model.mixer is mamba2; Falcon-H1's is "
                                                                       r"parallel"),
    (lambda r: with_mixer(r, mixers=r["model"]["mixer"]["mixers"][::-1]), r"\['mamba2', 'attention'\]; Falcon-H1"),
    (lambda r: with_mixer(r, 0, window=4), r"no window, QK-norm, softcap, sinks or output gate"),
    (lambda r: with_mixer(r, 0, bias=True, out_bias=False), r"q/k/v and output biases agree"),
    (lambda r: with_mixer(r, 0, score="dot"), r"score must be scaled_dot"),
    (lambda r: with_mixer(r, 1, rmsnorm=True, norm_eps=1e-3), r"norm_eps 0.001 must equal model.norm.eps"),
    (lambda r: with_model(r, ffn={"kind": "gelu", "hidden": 64}), r"model.ffn is gelu, needs swiglu"),
    (lambda r: with_model(r, norm={"kind": "layernorm"}), r"model.norm is layernorm, needs rmsnorm"),
    (lambda r: with_model(r, residual_multiplier=0.5), r"no residual multiplier"),
    (lambda r: with_model(r, position="none"), r"model.position is none, needs rope"),
    (lambda r: with_model(r, final_softcap=30.0), r"no embedding norm, √C embedding scale or final softcap"),
    (lambda r: with_model(r, layer_overrides={1: {"ffn": {"hidden": 64}}}), r"Falcon-H1's layers are all alike"),
])
def test_exporter_refuses_what_falcon_h1_cannot_express(imported, change, match):
    reason = FALCON.accepts(change(imported("falcon-0.5b-layout").model.recipe))
    assert reason is not None and re.search(match, reason), reason


# -- the shipped recipe ------------------------------------------------------------------------------
#: Falcon-H1-0.5B's config.json (tiiuae/Falcon-H1-0.5B-Base), as the recipe's comment says.
FALCON_H1_0_5B = {
    "vocab_size": 32784, "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 36,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "hidden_act": "silu", "rms_norm_eps": 1e-5,
    "rope_theta": 1e11, "max_position_embeddings": 16384, "attention_bias": False, "mlp_bias": False,
    "projectors_bias": False, "mamba_d_ssm": 1536, "mamba_n_heads": 24, "mamba_d_head": 64, "mamba_n_groups": 1,
    "mamba_d_state": 128, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 128, "mamba_conv_bias": True,
    "mamba_proj_bias": False, "mamba_rms_norm": False, "mamba_norm_before_gate": False,
    "embedding_multiplier": 5.656854249492381, "lm_head_multiplier": 0.0390625, "key_multiplier": 0.39062499999999994,
    "attention_in_multiplier": 1.0, "attention_out_multiplier": 0.9375, "ssm_in_multiplier": 1.25,
    "ssm_out_multiplier": 0.23570226039551587,
    "ssm_multipliers": [0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738],
    "mlp_multipliers": [0.8838834764831844, 0.5859375], "tie_word_embeddings": False, "initializer_range": 0.02,
}


def test_falcon_h1_0_5b_has_transformers_parameter_count_and_is_its_config():
    """The shipped recipe builds on the meta device to the count transformers gives the published
    config (521,411,104), and is what the converter makes of that config."""
    with torch.device("meta"):
        reference = transformers.AutoModelForCausalLM.from_config(transformers.FalconH1Config(**FALCON_H1_0_5B))
    model = seqzoo.build("falcon-h1-0.5b", device="meta")
    count = sum(p.numel() for p in model.parameters())
    assert count == sum(p.numel() for p in reference.parameters()) == 521_411_104
    converted = resolve(FALCON.recipe(FALCON_H1_0_5B)).data["model"]
    ours = model.recipe["model"]
    scale = lambda m: m["mixer"]["mixers"][0]["score"].pop("scale")  # noqa: E731  0.390625 / 8, in two roundings
    assert scale(ours) == pytest.approx(scale(converted), rel=1e-12)
    assert [p.mixer_spec for p in layer_plan(ours)] == [p.mixer_spec for p in layer_plan(converted)]
    for key in ("ffn", "norm", "position", "embedding_multiplier", "logits_multiplier", "tie_embeddings", "vocab_size",
                "max_seq_len"):
        assert ours[key] == converted[key], key


def test_show_counts_falcon_h1_0_5b_without_allocating(capsys):
    assert main(["show", "falcon-h1-0.5b"]) == 0
    assert "parameters: 521,411,104" in capsys.readouterr().out
