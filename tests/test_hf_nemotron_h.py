"""Nemotron-H (``nemotron_h``) against transformers: small random models chosen to exercise what sets
the family apart — layers that are one sublayer each (a Mamba-2 or attention mixer with no FFN, a
squared-ReLU MLP or a mixture of experts with no mixer), read from ``layers_block_type`` and from
the older ``hybrid_override_pattern``; Mamba-2 heads whose inner width is no multiple of the model
width (10 heads of 8 over C = 48: the mixer's ``heads``) in two and in seven groups, the gated norm
over each group, SSD chunks of 8 crossed by every T = 20 sequence; NoPE attention 8 wide over 3
heads (head_dim ≠ C / H) and one KV head; DeepSeek-V3 routing (sigmoid scores, a random selection
bias, 2 expert groups of which 1 is kept, a routed scale ≠ 1) over ungated relu² experts with a
shared expert; MLP biases; random norms, biases and A/D/Δ-bias — imported with ``seqzoo.from_hf`` and
checked with the converter kit: logits ≤ 1e-4 in float32 plain and left-padded (measured ≤ 1.5e-6 on
logits of order 3), 32 greedy steps with and without the state cache, an exported folder transformers
loads with the same logits.

With a finite ``time_step_limit`` transformers' cached decoding is not the reference: its decode step
skips the Δ clamp its chunked scan applies (as Bamba's does), so seqzoo's decoding, cached and not,
is checked against transformers' uncached generation (a full forward per step). Two limits of
transformers 5's Nemotron-H shape the test models: with its cache on (the default) it cannot run a
model whose layer 0 is an MLP or expert layer (a cache ``DummyLayer`` is asked for its length) nor
one without attention layers (``get_mask_sizes`` wants one), so every model here starts with a
Mamba layer, and the attention-less export is compared with ``use_cache=False``.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

import seqzoo
from seqzoo.builder import layer_plan
from seqzoo.cli import main
from seqzoo.errors import CheckpointError
from seqzoo.nn.generation import generate
from seqzoo.recipe import resolve
from seqzoo.testing import parity

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.filterwarnings("ignore:.*no tokenizer written")  # random models have none

V = 128   # vocabulary of every test model
T = 20    # test sequence length: longer than two SSD chunks of 8, not a multiple of 8
IDS = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0)
NEMOTRON = seqzoo.registry().get("converter", "nemotron_h").cls()


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def nemotron(**kw):
    # 10 Mamba heads of 8 (inner 80, no multiple of 48) in 2 groups; attention 3 heads of 8 over 1;
    # MLP 40 wide; 8 experts of 24 in 2 groups (1 kept), top 3, scaled by 1.7, a shared expert of 20
    config = {**IDS, "hidden_size": 48, "layers_block_type": ["linear_attention", "moe", "full_attention", "mlp",
                                                              "linear_attention", "mlp"],
              "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 40,
              "mlp_bias": True, "mamba_num_heads": 10, "mamba_head_dim": 8, "n_groups": 2, "ssm_state_size": 8,
              "chunk_size": 8, "n_routed_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 24,
              "moe_shared_expert_intermediate_size": 20, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.7,
              "max_position_embeddings": 64, "initializer_range": 0.1, **kw}  # logits of order 1
    model = transformers.AutoModelForCausalLM.from_config(transformers.NemotronHConfig(**config))
    with torch.no_grad():
        for name, buffer in model.named_buffers():  # the selection bias is a buffer, zero at init
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.05)
        for name, parameter in model.named_parameters():  # A_log, D and Δ bias start at fixed values
            if name.endswith(("A_log", ".D", "dt_bias")):
                parameter.add_(0.3 * torch.randn_like(parameter))
    return parity.randomised(model)


MODELS = {
    # [mamba, moe, attention, mlp, mamba, mlp]: every kind of layer, the pattern the whole stack
    "nemotron-moe": lambda: nemotron(),
    # the older spelling, hybrid_override_pattern M-M*-M (the pattern [mamba, mlp, mamba, attention,
    # mlp] cut short); 7 heads of 8 in 7 groups; tie_word_embeddings true, which transformers' class
    # ignores (its head stays its own); no MLP biases
    "nemotron-pattern": lambda: nemotron(layers_block_type=None, hybrid_override_pattern="M-M*-M", mamba_num_heads=7,
                                         n_groups=7, tie_word_embeddings=True, mlp_bias=False),
    # a finite time_step_limit (Δ clamped to [0, 0.05]; the initial Δ reaches 0.1); one expert group,
    # weights not renormalised; as many KV heads as heads
    "nemotron-limit": lambda: nemotron(layers_block_type=["linear_attention", "moe", "moe", "full_attention"],
                                       n_group=1, topk_group=1, norm_topk_prob=False, time_step_limit=(0.0, 0.05),
                                       num_key_value_heads=3),
    # biases on the Mamba projections (use_bias): see test_mamba_biases_...
    "nemotron-bias": lambda: nemotron(layers_block_type=["linear_attention", "mlp", "full_attention", "mlp"],
                                      use_bias=True),
}
#: Models whose reference decoding is transformers' uncached generation (see the module docstring).
UNCACHED = {"nemotron-limit"}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    return parity.cached_imports(lambda name: MODELS[name](), tmp_path_factory)


@pytest.mark.parametrize("name", ["nemotron-moe", "nemotron-pattern"])
def test_family_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits plain and left-padded, 32 greedy steps with and without the state cache, the export."""
    parity.check_causal_lm(imported(name), tmp_path / "out", T)


@pytest.mark.parametrize("name", sorted(UNCACHED))
def test_decoding_matches_the_full_forward_of_transformers(imported, name, tmp_path):
    pair = imported(name)
    parity.check_logits(pair, T)
    parity.check_padded_logits(pair, T)
    parity.check_export(pair, tmp_path / "out", T)
    ids, mask = parity.left_padded(V, 8, pad=2)
    theirs = parity.hf_greedy(pair.hf, ids, mask, 32, use_cache=False)
    for use_cache in (True, False):
        ours = generate(pair.model, ids, 32, attention_mask=mask, eos_id=None, use_cache=use_cache)
        assert torch.equal(ours, theirs), f"use_cache={use_cache}"


def test_mamba_biases_match_transformers_unpadded(imported, tmp_path):
    """With use_bias, transformers zeroes padding before in_proj, so its conv sees the bias at pad
    positions and carries it into the first real tokens (as for Mamba-2); seqzoo zeroes the conv
    input. Unpadded the two agree, and so does greedy decoding."""
    pair = imported("nemotron-bias")
    parity.check_logits(pair, T)
    parity.check_export(pair, tmp_path / "out", T)
    parity.check_greedy(pair, pad=0)


# -- what the imported recipes say -------------------------------------------------------------------
def test_recipe_gives_each_layer_one_sublayer(imported):
    m = imported("nemotron-moe").model.recipe["model"]
    assert m["pattern"] == ["mamba", "moe", "attention", "mlp", "mamba", "mlp"] and m["position"]["kind"] == "none"
    assert m["layer_types"]["mamba"] == {"ffn": None} and m["layer_types"]["mlp"] == {"mixer": "none"}
    assert m["layer_types"]["attention"] == {"mixer": "attention", "ffn": None}
    mixer = m["mixer"]
    assert (mixer["heads"], mixer["head_dim"], mixer["groups"], mixer["state"]) == (10, 8, 2, 8)
    assert m["ffn"] == {**m["ffn"], "kind": "mlp", "hidden": 40, "bias": True}
    assert m["ffn"]["activation"]["kind"] == "relu2"
    assert m["attention"]["head_dim"] == 8 and m["attention"]["bias"] is False
    moe = m["layer_types"]["moe"]["ffn"]
    assert (moe["experts"], moe["top_k"], moe["routed_scale"], moe["balance_loss"]) == (8, 3, 1.7, 0.0)
    assert moe["router"] == {"kind": "sigmoid_grouped", "groups": 2, "topk_groups": 1, "normalize": True}
    assert moe["expert"]["bias"] is False and moe["shared"]["hidden"] == 20 and moe["shared"]["bias"] is True
    plans = layer_plan(m)
    assert [(p.mixer["kind"], p.ffn and p.ffn["kind"]) for p in plans] == [
        ("mamba2", None), ("none", "moe"), ("attention", None), ("none", "mlp"), ("mamba2", None), ("none", "mlp")]
    model = imported("nemotron-moe").model
    assert model.decoder.blocks[1].mixer_norm is None and model.decoder.blocks[0].ffn is None
    m = imported("nemotron-pattern").model.recipe["model"]
    assert m["pattern"] == ["mamba", "mlp", "mamba", "attention", "mlp"] and m["layers"] == 6
    assert m["tie_embeddings"] is False and m["mixer"]["groups"] == 7


def test_mamba_gated_norm_groups_as_transformers_does(imported):
    hf, model, _ = imported("nemotron-moe")
    theirs = hf.model.layers[0].mixer.norm
    assert theirs.group_size == 40  # inner 80 / 2 groups
    y, z = torch.randn(2, 5, 80), torch.randn(2, 5, 80)
    assert torch.allclose(model.decoder.blocks[0].mixer.norm(y, z), theirs(y, z), atol=1e-6)


def test_export_writes_the_layer_kinds_in_both_spellings(imported, tmp_path):
    hf, model, _ = imported("nemotron-pattern")
    config = json.loads((seqzoo.to_hf(model, tmp_path / "out") / "config.json").read_text())
    assert config["model_type"] == "nemotron_h" and config["hybrid_override_pattern"] == "M-M*-M"
    assert config["layers_block_type"] == hf.config.layers_block_type
    assert (config["mamba_num_heads"], config["n_groups"], config["head_dim"]) == (7, 7, 8)
    assert config["tie_word_embeddings"] is False


def test_a_tied_seqzoo_model_exports_its_head(tmp_path):
    """transformers never ties Nemotron-H's head, so a tied model is written with the head as its own
    tensor (and tie_word_embeddings false); tiny-mamba2 is a Nemotron-H of Mamba layers alone, which
    transformers runs with its cache off only."""
    model = seqzoo.build("tiny-mamba2", device="cpu").eval()
    assert model.recipe["model"]["tie_embeddings"] is True
    assert seqzoo.io.hf.exporter_for(model).model_type == "mamba2"  # unnamed, it stays a Mamba-2
    out = seqzoo.to_hf(model, tmp_path / "out", model_type="nemotron_h")
    hf = transformers.NemotronHForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(3, 259, (2, 70))  # longer than one SSD chunk of 64
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids, use_cache=False).logits) < parity.TOL
    assert torch.equal(hf.lm_head.weight, model.embed.weight)


def test_multi_token_prediction_weights_are_dropped_with_a_warning(imported, tmp_path):
    hf, _, folder = imported("nemotron-moe")
    config = json.loads((folder / "config.json").read_text())
    copy = parity.edited_copy(folder, tmp_path / "mtp", config, extra={"mtp.layers.0.norm.weight": torch.ones(48)})
    with pytest.warns(UserWarning, match="dropped multi-token prediction layers"):
        model = seqzoo.from_hf(copy)
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL


# -- refusals ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, change, match", [
    ("nemotron-moe", {"mamba_hidden_act": "gelu"}, r"mamba_hidden_act 'gelu' is not supported; seqzoo's Mamba-2"),
    ("nemotron-moe", {"mlp_hidden_act": "swiglu"}, r"mlp_hidden_act: activation 'swiglu' has no seqzoo equivalent"),
    ("nemotron-moe", {"time_step_limit": None}, r"time_step_limit None is not supported; write \[0.0, Infinity\]"),
    ("nemotron-moe", {"moe_latent_size": 16}, r"moe_latent_size 16 is not supported; seqzoo's experts read"),
    ("nemotron-moe", {"layers_block_type": ["linear_attention", "sliding_attention"]}, r"layers_block_type .* is not"),
    ("nemotron-moe", {"layers_block_type": None, "hybrid_override_pattern": "M-X"},
     r"hybrid_override_pattern 'M-X' is not supported; each layer must be one of"),
    ("nemotron-moe", {"n_groups": 3}, r"n_groups 3 is not supported; it must divide mamba_num_heads 10"),
    ("nemotron-moe", {"head_dim": None}, r"head_dim None is not supported; NemotronHConfig sizes"),
])
def test_unsupported_config_option_is_refused_in_one_line(imported, tmp_path, name, change, match):
    parity.check_refused(imported(name).folder, tmp_path / "bad", change, match)


def test_legacy_mamba_option_names_win_as_in_transformers(imported, tmp_path):
    """NemotronHConfig reads mamba_n_groups, mamba_d_conv, mamba_chunk_size, ... over the current
    names; so does the converter."""
    hf, _, folder = imported("nemotron-moe")
    config = {**json.loads((folder / "config.json").read_text()), "n_groups": 5, "mamba_n_groups": 2,
              "chunk_size": 3, "mamba_chunk_size": 8}
    model = seqzoo.from_hf(parity.edited_copy(folder, tmp_path / "legacy", config))
    assert model.recipe["model"]["mixer"]["groups"] == 2 and model.recipe["model"]["mixer"]["chunk"] == 8


def with_model(recipe: dict, **changes) -> dict:
    return {**recipe, "model": {**recipe["model"], **changes}}


MOE = {"kind": "moe", "experts": 8, "top_k": 3, "expert": {"kind": "mlp", "activation": "relu2", "hidden": 24,
                                                           "bias": False},
       "router": {"kind": "sigmoid_grouped", "groups": 2, "topk_groups": 1},
       "shared": {"kind": "mlp", "activation": "relu2", "hidden": 20, "bias": True}, "balance_loss": 0.0}


@pytest.mark.parametrize("change, match", [
    ({"layer_types": {"mamba": {}, "moe": {"mixer": "none", "ffn": MOE}, "attention": {"mixer": "attention",
                                                                                       "ffn": None},
                      "mlp": {"mixer": "none"}}}, r"a Nemotron-H layer is one of mamba2 without an FFN"),
    ({"mixer": "mamba"}, r"a Nemotron-H layer is one of .*mixer mamba"),
    ({"ffn": {"kind": "swiglu", "hidden": 40}}, r"MLPs and experts are ungated"),
    ({"ffn": {"kind": "mlp", "activation": "gelu", "hidden": 40, "bias": True}}, r"ungated, with one activation"),
    ({"ffn": {"kind": "mlp", "activation": "relu2", "hidden": 40, "bias": False}}, r"differ in bias"),
    ({"layer_overrides": {5: {"ffn": {"hidden": 32}}}}, r"layers of one kind differ"),
    ({"position": "rope"}, r"model.position is rope; Nemotron-H has none"),
    ({"norm": {"kind": "layernorm"}}, r"Nemotron-H is pre-norm RMSNorm"),
    ({"residual_multiplier": 0.5}, r"Nemotron-H has no μP multipliers"),
    ({"scale_embeddings": True}, r"no embedding norm, embedding scale or final softcap"),
])
def test_exporter_refuses_what_nemotron_h_cannot_express(imported, change, match):
    reason = NEMOTRON.accepts(with_model(imported("nemotron-moe").model.recipe, **change))
    assert reason is not None and re.search(match, reason), reason


@pytest.mark.parametrize("part, change, match", [
    ("attention", {"bias": True}, r"Nemotron-H's projections have no biases"),
    ("attention", {"window": 4}, r"plain GQA"),
    ("attention", {"score": {"kind": "scaled_dot", "scale": 0.5}}, r"scaled_dot with the default scale"),
    ("moe", {"router": {"kind": "softmax_topk"}}, r"router is softmax_topk; Nemotron-H routes by sigmoid_grouped"),
    ("moe", {"shared": None}, r"one ungated shared expert"),
    ("moe", {"expert": {"kind": "mlp", "activation": "relu2", "hidden": 24, "bias": True}},
     r"experts are ungated MLPs without biases"),
    ("moe", {"capacity_factor": 1.5}, r"drops no token"),
    ("mixer", {"norm_eps": 1e-3}, r"norm_eps 0.001 must equal model.norm.eps"),
])
def test_exporter_refuses_another_attention_router_or_mixer(imported, part, change, match):
    m = imported("nemotron-moe").model.recipe["model"]
    if part == "moe":
        types = {**m["layer_types"], "moe": {"mixer": "none", "ffn": {**m["layer_types"]["moe"]["ffn"], **change}}}
        recipe = with_model({"model": m}, layer_types=types)
    else:
        recipe = with_model({"model": m}, **{part: {**(m[part] if part == "mixer" else m["attention"]), **change}})
    reason = NEMOTRON.accepts(recipe)
    assert reason is not None and re.search(match, reason), reason
    with pytest.raises(CheckpointError, match="cannot export as nemotron_h"):
        seqzoo.to_hf(seqzoo.build("tiny-gpt", device="meta"), "unused", model_type="nemotron_h")


# -- the shipped recipe ------------------------------------------------------------------------------
#: Nemotron-H-4B-Base-8K's architecture (nvidia/Nemotron-H-4B-Base-8K), as the recipe's comment says.
NEMOTRON_H_4B = {
    "vocab_size": 131072, "hidden_size": 3072, "num_hidden_layers": 52,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "mlp_hidden_act": "relu2",
    "mlp_bias": False, "mamba_num_heads": 112, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8,
    "conv_kernel": 4, "expand": 2, "chunk_size": 128, "use_conv_bias": True, "use_bias": False,
    "layer_norm_epsilon": 1e-5, "max_position_embeddings": 8192, "tie_word_embeddings": False,
}


def test_nemotron_h_4b_has_transformers_parameter_count_and_is_its_config():
    """The shipped recipe builds on the meta device to the count transformers gives the config
    (4,489,223,040), and is what the converter makes of it, layer by layer."""
    config = transformers.NemotronHConfig(**NEMOTRON_H_4B)
    with torch.device("meta"):
        reference = transformers.AutoModelForCausalLM.from_config(config)
    model = seqzoo.build("nemotron-h-4b", device="meta")
    count = sum(p.numel() for p in model.parameters())
    assert count == sum(p.numel() for p in reference.parameters()) == 4_489_223_040
    converted = resolve(NEMOTRON.recipe(NEMOTRON_H_4B, ["lm_head.weight"])).data
    ours, theirs = layer_plan(model.recipe["model"]), layer_plan(converted["model"])
    assert [(p.mixer_spec, p.ffn, p.norm) for p in ours] == [(p.mixer_spec, p.ffn, p.norm) for p in theirs]
    assert model.recipe["model"]["tie_embeddings"] is converted["model"]["tie_embeddings"] is False


def test_nemotron_h_4b_shrunk_exports_and_loads_in_transformers(tmp_path):
    """The shipped recipe's layout (52 layers, Mamba heads that are no multiple of the width) at a
    test width, exported, is a NemotronHForCausalLM with the same logits."""
    model = seqzoo.build("nemotron-h-4b", ["model.vocab_size=300", "model.dim=24", "model.mixer.heads=5",
                                           "model.mixer.head_dim=8", "model.mixer.state=4", "model.mixer.groups=1",
                                           "model.mixer.chunk=8", "model.attention.heads=2",
                                           "model.attention.kv_heads=1", "model.attention.head_dim=8",
                                           "model.ffn.hidden=32", "runtime.dtype=float32"], device="cpu").eval()
    out = seqzoo.to_hf(model, tmp_path / "out")
    hf = transformers.NemotronHForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(3, 300, (2, T))
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL


def test_show_counts_nemotron_h_4b_without_allocating(capsys):
    assert main(["show", "nemotron-h-4b"]) == 0
    assert "parameters: 4,489,223,040" in capsys.readouterr().out
