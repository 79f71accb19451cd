"""Granite 4.0-H (``granitemoehybrid``) against transformers: small random models chosen to exercise
what sets the family apart — the μP multipliers all ≠ 1 (embeddings, every sublayer, the attention
score scale in place of 1/√D, and the logits divided by ``logits_scaling``), experts routed by a
softmax over their top-k logits beside the shared expert, the dense variant (0 experts: the shared
expert alone), NoPE attention and the optional whole-head RoPE, attention layers at an index that
cuts the pattern short, GQA over an odd head count, head_dim ≠ C / H, biases, a tied head, and
Bamba's Mamba-2 layers (12 heads of 8 in two groups, SSD chunks of 8 crossed by every T = 20
sequence) — imported with ``seqzoo.from_hf`` and checked with the converter kit: logits ≤ 1e-4 in
float32 plain and left-padded (measured ≤ 5e-7 on logits of order 1), 32 greedy steps with and without the state cache
equal to transformers' own cached generation, and an exported folder transformers loads with the
same logits. The reference is transformers' PyTorch path (no mamba_ssm or causal_conv1d here).
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
from seqzoo.recipe import resolve
from seqzoo.testing import parity

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.filterwarnings("ignore:.*no tokenizer written")  # random models have none

V = 128   # vocabulary of every test model
T = 20    # test sequence length: longer than two SSD chunks of 8, not a multiple of 8
IDS = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0)
MULTIPLIERS = dict(embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=2.5)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def granite(**kw):
    # 12 Mamba heads of 8 over 2 groups (expand 2 · 48 = 96); attention 3 heads over 1 KV head of 16;
    # 4 experts of 24, top 2, beside a shared expert of 40
    config = {**IDS, **MULTIPLIERS, "hidden_size": 48, "num_attention_heads": 3, "num_key_value_heads": 1,
              "intermediate_size": 24, "shared_intermediate_size": 40, "num_hidden_layers": 5,
              "layer_types": ["mamba", "mamba", "attention", "mamba", "mamba"], "num_local_experts": 4,
              "num_experts_per_tok": 2, "mamba_n_heads": 12, "mamba_d_head": 8, "mamba_n_groups": 2,
              "mamba_d_state": 8, "mamba_chunk_size": 8, "max_position_embeddings": 64,
              "initializer_range": 0.1, **kw}  # Granite's own initializer_range: logits of order 1
    model = transformers.GraniteMoeHybridForCausalLM(transformers.GraniteMoeHybridConfig(**config))
    with torch.no_grad():  # transformers starts A_log, D and the Δ bias at fixed values; a swapped one must show
        for name, parameter in model.named_parameters():
            if name.endswith(("A_log", ".D", "dt_bias")):
                parameter.add_(0.3 * torch.randn_like(parameter))
    return parity.randomised(model)


MODELS = {
    # [mamba, mamba, attention, mamba, mamba]: the pattern [mamba, mamba, attention] cut short; NoPE;
    # routed experts beside the shared one; untied head
    "granite-moe": lambda: granite(),
    # no routed experts (the dense H models): the shared expert is the FFN; transformers 5's layer
    # names, attention at 0 and 3 of 4, biases on q/k/v/o, head_dim 8 ≠ 48 / 3 over 3 KV heads,
    # mamba_d_head "auto" (96 / 12), no conv bias, tied head
    "granite-dense": lambda: granite(num_local_experts=0, num_experts_per_tok=0, num_hidden_layers=4,
                                     layer_types=["full_attention", "linear_attention", "linear_attention",
                                                  "full_attention"], attention_bias=True, head_dim=8,
                                     num_key_value_heads=3, mamba_d_head="auto", mamba_conv_bias=False,
                                     tie_word_embeddings=True),
    # whole-head RoPE (position_embedding_type "rope", θ = 500), every other layer attends, 4 heads
    # of 16 over 2 (head_dim ≠ 48 / 4), 6 experts top 3, one Mamba group
    "granite-rope": lambda: granite(position_embedding_type="rope",
                                    rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                                    layer_types=["mamba", "attention"] * 2, num_hidden_layers=4,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=6,
                                    num_experts_per_tok=3, mamba_n_groups=1),
    # every layer attends with RoPE and a dense FFN (Granite-4.0-Micro's layout)
    "granite-attention-only": lambda: granite(position_embedding_type="rope", layer_types=["attention"] * 3,
                                              num_hidden_layers=3, num_local_experts=0, num_experts_per_tok=0),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    return parity.cached_imports(lambda name: MODELS[name](), tmp_path_factory)


@pytest.mark.parametrize("name", list(MODELS))
def test_family_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits plain and left-padded, 32 greedy steps with and without the state cache, the export."""
    parity.check_causal_lm(imported(name), tmp_path / "out", T)


def test_the_multipliers_reach_the_logits(imported):
    """The reference's multipliers are not all 1, and seqzoo's logits follow them: with the
    multipliers reset to 1 in seqzoo alone, the two disagree."""
    hf, model, _ = imported("granite-moe")
    assert hf.model.embedding_multiplier == 3.0 and hf.config.logits_scaling == 2.5
    plain = seqzoo.build(model.recipe, ["model.embedding_multiplier=1.0", "model.residual_multiplier=1.0",
                                        "model.logits_multiplier=1.0"], device="cpu").eval()
    plain.load_state_dict(model.state_dict())
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        assert parity.max_difference(plain(ids), hf(ids).logits) > 1e-2


# -- what the imported recipes say -------------------------------------------------------------------
def test_recipe_reads_the_multipliers_experts_and_layout(imported):
    m = imported("granite-moe").model.recipe["model"]
    assert (m["embedding_multiplier"], m["residual_multiplier"], m["logits_multiplier"]) == (3.0, 0.5, 0.4)
    assert m["attention"]["score"] == {"kind": "scaled_dot", "scale": 0.3} and m["position"]["kind"] == "none"
    assert m["layer_types"] == {"mamba": {}, "attention": {"mixer": "attention"}}
    assert m["pattern"] == ["mamba", "mamba", "attention"] and m["tie_embeddings"] is False  # over 5 layers
    ffn = m["ffn"]
    assert (ffn["kind"], ffn["experts"], ffn["top_k"], ffn["router"]) == ("moe", 4, 2, {"kind": "topk_softmax",
                                                                                      "bias": False})
    assert (ffn["expert"]["kind"], ffn["expert"]["hidden"], ffn["shared"]["hidden"]) == ("swiglu", 24, 40)
    assert m["mixer"]["groups"] == 2 and m["mixer"]["head_dim"] == 8 and m["mixer"]["chunk"] == 8
    m = imported("granite-dense").model.recipe["model"]
    assert m["ffn"]["kind"] == "swiglu" and m["ffn"]["hidden"] == 40 and m["tie_embeddings"] is True
    assert m["pattern"] == ["attention", "mamba", "mamba"] and m["attention"]["head_dim"] == 8  # over 4 layers
    assert m["attention"]["bias"] is True and m["mixer"]["conv_bias"] is False
    m = imported("granite-rope").model.recipe["model"]
    assert m["position"]["kind"] == "rope" and m["position"]["base"] == 500.0 and m["pattern"] == ["mamba",
                                                                                                   "attention"]
    m = imported("granite-attention-only").model.recipe["model"]
    assert "layer_types" not in m or not m["layer_types"]
    assert {p.mixer["kind"] for p in layer_plan(m)} == {"attention"}


@pytest.mark.parametrize("name", list(MODELS))
def test_export_writes_the_family_config(imported, name, tmp_path):
    hf, model, _ = imported(name)
    config = json.loads((seqzoo.to_hf(model, tmp_path / "out", model_type="granitemoehybrid")
                         / "config.json").read_text())
    assert [{"mamba": "linear_attention", "attention": "full_attention"}[k] for k in config["layer_types"]] \
        == hf.config.layer_types  # written in the published configs' names
    for key in ("logits_scaling", "embedding_multiplier", "residual_multiplier", "attention_multiplier",
                "num_local_experts", "shared_intermediate_size", "tie_word_embeddings"):
        assert config[key] == getattr(hf.config, key), key
    assert config["position_embedding_type"] == (hf.config.position_embedding_type or "nope")


def test_the_exported_folder_is_found_without_naming_the_family(imported, tmp_path):
    """Granite is exported by name only when another family fits too; a model with μP multipliers
    and a shared expert has no other family, so ``to_hf`` picks it alone."""
    out = seqzoo.to_hf(imported("granite-moe").model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["model_type"] == "granitemoehybrid"


@pytest.mark.parametrize("recipe", ["tiny-hybrid", "tiny-llama"])
def test_seqzoo_recipes_export_as_granite_when_named(recipe, tmp_path):
    """A Bamba-like hybrid (its partial RoPE made whole) and LLaMA (attention multiplier 1/√D) load in
    GraniteMoeHybridForCausalLM with the same logits; unnamed, they stay Bamba and LLaMA."""
    model = seqzoo.build(recipe, ["model.position={kind: rope, base: 10000}"], device="cpu").eval()
    assert seqzoo.io.hf.exporter_for(model).model_type in ("bamba", "llama")
    out = seqzoo.to_hf(model, tmp_path / "out", model_type="granitemoehybrid")
    hf = transformers.GraniteMoeHybridForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(3, 259, (2, 70))  # longer than one SSD chunk of 64
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL


# -- refusals ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, change, match", [
    ("granite-moe", {"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported; granitemoehybrid's Mamba-2"),
    ("granite-moe", {"time_step_limit": None}, r"time_step_limit None is not supported; write \[0.0, Infinity\]"),
    ("granite-moe", {"layer_types": ["mamba"] * 4}, r"layer_types .* it must list num_hidden_layers = 5 entries"),
    ("granite-moe", {"layer_types": ["mamba"] * 4 + ["sliding_attention"]}, r"layer_types .* is not supported"),
    ("granite-moe", {"num_local_experts": -1}, r"num_local_experts -1 is not supported; it must be 0"),
    ("granite-moe", {"num_experts_per_tok": 5}, r"num_experts_per_tok 5 is not supported; it must be 1..num_local"),
    ("granite-moe", {"shared_intermediate_size": 0}, r"shared_intermediate_size 0 is not supported; the shared"),
    ("granite-moe", {"logits_scaling": 0}, r"logits_scaling 0 is not supported; it must be a positive number"),
    ("granite-moe", {"attention_multiplier": None}, r"attention_multiplier None is not supported"),
    ("granite-moe", {"mamba_d_head": 16}, r"mamba_n_heads 12 × mamba_d_head 16 = 192 must equal mamba_expand"),
    ("granite-moe", {"mamba_n_groups": 5}, r"mamba_n_groups 5 is not supported; it must divide mamba_n_heads 12"),
    ("granite-rope", {"rope_parameters": {"rope_type": "su", "rope_theta": 1e4}}, r"rope_type 'su' is not"),
])
def test_unsupported_config_option_is_refused_in_one_line(imported, tmp_path, name, change, match):
    parity.check_refused(imported(name).folder, tmp_path / "bad", change, match)


GRANITE = seqzoo.registry().get("converter", "granitemoehybrid").cls()


def with_model(recipe: dict, **changes) -> dict:
    return {**recipe, "model": {**recipe["model"], **changes}}


@pytest.mark.parametrize("name, change, match", [
    ("granite-moe", {"ffn": {"kind": "gelu", "hidden": 64}}, r"model.ffn is gelu; Granite's is SwiGLU"),
    ("granite-dense", {"ffn": {"kind": "swiglu", "hidden": 40, "bias": True}}, r"SwiGLU without biases"),
    ("granite-moe", {"ffn": {"kind": "moe", "experts": 4, "top_k": 2, "expert": {"kind": "swiglu", "hidden": 24},
                             "router": {"kind": "softmax_topk", "normalize": True},
                             "shared": {"kind": "swiglu", "hidden": 40}}}, r"router is softmax_topk; Granite"),
    ("granite-moe", {"ffn": {"kind": "moe", "experts": 4, "top_k": 2, "expert": {"kind": "swiglu", "hidden": 24},
                             "router": {"kind": "topk_softmax", "bias": False}}}, r"ungated SwiGLU shared expert"),
    ("granite-moe", {"ffn": {"kind": "moe", "experts": 4, "top_k": 2, "expert": {"kind": "swiglu", "hidden": 24},
                             "router": {"kind": "topk_softmax", "bias": False}, "routed_scale": 2.0,
                             "shared": {"kind": "swiglu", "hidden": 40}}}, r"no routed_scale"),
    ("granite-moe", {"norm": {"kind": "layernorm"}}, r"model.norm is layernorm, needs rmsnorm"),
    ("granite-moe", {"placement": "post"}, r"Granite is pre-norm"),
    ("granite-moe", {"final_softcap": 30.0}, r"no embedding norm, √C embedding scale or final softcap"),
    ("granite-moe", {"mixer": "mamba"}, r"layers use \['attention', 'mamba'\]; Granite's are mamba2 or attention"),
    ("granite-moe", {"layer_overrides": {3: {"mixer": {"state": 16}}}}, r"the Mamba-2 layers differ"),
    ("granite-moe", {"layer_types": {"mamba": {}, "attention": {"mixer": "attention", "residual_multiplier": 1.0}}},
     r"Granite's layers differ only in their mixer"),
    ("granite-rope", {"position": {"kind": "rope", "base": 500.0, "rotary_dim": 8}}, r"partial rotary"),
    ("granite-rope", {"position": "learned"}, r"model.position is learned, needs rope or none"),
])
def test_exporter_refuses_what_granite_cannot_express(imported, name, change, match):
    recipe = imported(name).model.recipe
    reason = GRANITE.accepts(with_model(recipe, **change))
    assert reason is not None and re.search(match, reason), reason


@pytest.mark.parametrize("attention, match", [
    ({"window": 4}, r"no window, QK-norm, softcap, sinks or gate"),
    ({"output_gate": True}, r"no window, QK-norm, softcap, sinks or gate"),
    ({"bias": True, "out_bias": False}, r"one bias setting"),
    ({"score": "dot"}, r"score must be scaled_dot"),
])
def test_exporter_refuses_another_attention(imported, attention, match):
    recipe = imported("granite-moe").model.recipe
    reason = GRANITE.accepts(with_model(recipe, attention={**recipe["model"]["attention"], **attention}))
    assert reason is not None and re.search(match, reason), reason


def test_a_mamba2_mixer_with_free_heads_is_refused(imported):
    recipe = imported("granite-moe").model.recipe
    changed = with_model(recipe, mixer={**recipe["model"]["mixer"], "heads": 10})
    assert "model.mixer.heads is set; Granite sizes its Mamba-2 layers by expand" in GRANITE.accepts(changed)
    with pytest.raises(CheckpointError, match="cannot export as granitemoehybrid"):
        seqzoo.to_hf(seqzoo.build("tiny-gpt", device="meta"), "unused", model_type="granitemoehybrid")


# -- the shipped recipe ------------------------------------------------------------------------------
#: Granite-4.0-H-350M's config.json (ibm-granite/granite-4.0-h-350m), as the recipe's comment says.
GRANITE_4_H_350M = {
    "vocab_size": 100352, "hidden_size": 768, "intermediate_size": 2048, "shared_intermediate_size": 2048,
    "num_hidden_layers": 32, "layer_types": ["attention" if i in (10, 13, 17, 27) else "mamba" for i in range(32)],
    "num_attention_heads": 12, "num_key_value_heads": 4, "mamba_n_heads": 48, "mamba_d_head": 32,
    "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256,
    "mamba_conv_bias": True, "mamba_proj_bias": False, "num_local_experts": 0, "num_experts_per_tok": 0,
    "embedding_multiplier": 12, "logits_scaling": 3, "residual_multiplier": 0.246, "attention_multiplier": 0.015625,
    "rms_norm_eps": 1e-5, "max_position_embeddings": 32768, "position_embedding_type": "nope", "rope_theta": 10000,
    "tie_word_embeddings": True, "initializer_range": 0.1, "bos_token_id": 100257, "eos_token_id": 100257,
    "pad_token_id": 100256,
}


def test_granite_4_h_350m_has_transformers_parameter_count_and_is_its_config():
    """The shipped recipe builds on the meta device to the count transformers gives the published
    config (340,332,224), and is what the converter makes of that config, layer by layer."""
    config = transformers.GraniteMoeHybridConfig(**GRANITE_4_H_350M)
    with torch.device("meta"):
        reference = transformers.AutoModelForCausalLM.from_config(config)
    model = seqzoo.build("granite-4.0-h-350m", device="meta")
    count = sum(p.numel() for p in model.parameters())
    assert count == sum(p.numel() for p in reference.parameters()) == 340_332_224
    converted = resolve(GRANITE.recipe(GRANITE_4_H_350M)).data
    ours, theirs = layer_plan(model.recipe["model"]), layer_plan(converted["model"])
    assert [(p.mixer_spec, p.ffn, p.norm) for p in ours] == [(p.mixer_spec, p.ffn, p.norm) for p in theirs]
    for key in ("embedding_multiplier", "residual_multiplier", "logits_multiplier", "tie_embeddings", "vocab_size"):
        assert model.recipe["model"][key] == pytest.approx(converted["model"][key]), key


def test_show_counts_granite_4_h_350m_without_allocating(capsys):
    assert main(["show", "granite-4.0-h-350m"]) == 0
    assert "parameters: 340,332,224" in capsys.readouterr().out
