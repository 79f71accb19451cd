"""Qwen3-Next, Qwen3.5 and Qwen3.5-MoE against transformers: small random models of each family with
configs chosen to exercise what sets them apart — three value heads per key head in the gated-delta
layers (and value heads narrower or wider than key heads), a conv kernel of 3, 70 tokens (one
64-token chunk and a part of the next, transformers' chunk and seqzoo's), the attention layers'
double-wide query projection with its per-head gate, a quarter and a half of each head rotated,
head_dim ≠ C / H, GQA over an odd head count, biases on q/k/v/o, (1 + w) norms drawn at random,
dense layers among sparse ones, unnormalised routing, a tied head — imported with ``seqzoo.from_hf``
and checked with the converter kit (logits ≤ 1e-4 float32 plain and left-padded, 32 greedy steps
with and without the state cache against transformers' cached greedy decoding, an exported folder
transformers loads).

transformers runs its PyTorch gated-delta rule here (``torch_chunk_gated_delta_rule``, no fla or
causal_conv1d kernels on this CPU)."""
from __future__ import annotations

import json
import re

import pytest
import torch

import seqzoo
from seqzoo.cli import main
from seqzoo.errors import CheckpointError
from seqzoo.recipe import resolve
from seqzoo.testing import parity

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
qwen3_5 = pytest.importorskip("transformers.models.qwen3_5")
qwen3_5_moe = pytest.importorskip("transformers.models.qwen3_5_moe")
pytestmark = pytest.mark.filterwarnings("ignore:.*no tokenizer written")  # random models have none

V = 128   # vocabulary of every test model
T = 70    # test sequence length: one 64-token chunk of the gated-delta rule and part of the next
IDS = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=256,
           initializer_range=0.06)
# 3 attention heads of 24 over 1 KV head (24 ≠ 48 / 3); delta layers: 2 key heads of 8, 6 value
# heads of 4 (three per key head, narrower than the keys), conv 3
SHAPE = dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=1, head_dim=24, linear_num_key_heads=2,
             linear_key_head_dim=8, linear_num_value_heads=6, linear_value_head_dim=4, linear_conv_kernel_dim=3)
EXPERTS = dict(num_experts=5, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def randomised(model):
    """Random norms and biases: the (1 + w) norms' w around 0, the gated-delta norms' w around 1."""
    parity.randomised(model, norms=(-0.5, 0.5))
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer, "linear_attn"):
                layer.linear_attn.norm.weight.uniform_(0.5, 1.5)
    return model


def qwen3_next(**kw):
    config = {**IDS, **SHAPE, **EXPERTS, "num_hidden_layers": 5, "intermediate_size": 40, **kw}
    return randomised(transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**config)))


def qwen3_5_text(**kw):
    config = {**IDS, **SHAPE, "num_hidden_layers": 4, "intermediate_size": 40, **kw}
    return randomised(qwen3_5.Qwen3_5ForCausalLM(qwen3_5.Qwen3_5TextConfig(**config)))


def qwen3_5_moe_text(**kw):
    config = {**IDS, **SHAPE, **EXPERTS, "num_hidden_layers": 4, **kw}
    return randomised(qwen3_5_moe.Qwen3_5MoeForCausalLM(qwen3_5_moe.Qwen3_5MoeTextConfig(**config)))


def rope(theta: float, factor: float, **params) -> dict:
    return {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": factor, **params}


MODELS = {
    # [delta ×3, attention, delta]: the default interval of 4 cut short; layer 1 dense among
    # sparse ones, unnormalised top-2 of 5 experts; biases on q (both halves), k, v and o
    "qwen3-next": lambda: qwen3_next(mlp_only_layers=[1], norm_topk_prob=False, attention_bias=True),
    # every second layer attends and every second layer is sparse; half of each head rotated at
    # θ = 5000; value heads (2 per key head) wider than the keys; a tied head
    "qwen3-next-alternating": lambda: qwen3_next(
        num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2, decoder_sparse_step=2,
        linear_num_value_heads=4, linear_value_head_dim=12, tie_word_embeddings=True,
        rope_parameters=rope(5000.0, 0.5)),
    # Qwen3.5's split projections, [attention, delta, delta, attention], the multimodal RoPE's
    # sections (one position stream for text), a tied head
    "qwen3.5": lambda: qwen3_5_text(layer_types=["full_attention", "linear_attention", "linear_attention",
                                                 "full_attention"], tie_word_embeddings=True,
                                    rope_parameters=rope(1e4, 0.25, mrope_section=[1, 1, 0], mrope_interleaved=True)),
    # every layer sparse and renormalised, with the gated shared expert
    "qwen3.5-moe": lambda: qwen3_5_moe_text(),
}
FAMILY = {"qwen3-next": "qwen3_next", "qwen3-next-alternating": "qwen3_next", "qwen3.5": "qwen3_5_text",
          "qwen3.5-moe": "qwen3_5_moe_text"}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    return parity.cached_imports(lambda name: MODELS[name](), tmp_path_factory)


@pytest.mark.parametrize("name", MODELS)
def test_family_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits plain and left-padded, 32 greedy steps with and without the state cache, the export
    (Qwen3.5-MoE named: its models are also Qwen3-Next's)."""
    parity.check_causal_lm(imported(name), tmp_path / "out", T, model_type=FAMILY[name])


def test_the_query_projection_holds_each_heads_query_then_its_gate(imported):
    """transformers views q_proj's output as (H, 2·D) and halves each head: rows [q_h | gate_h]."""
    hf, model, _ = imported("qwen3-next")
    q = hf.model.layers[3].self_attn.q_proj
    rows, bias = q.weight.view(3, 2, 24, 48), q.bias.view(3, 2, 24)
    mixer = model.decoder.blocks[3].mixer
    assert torch.equal(mixer.gate_proj.weight, rows[:, 1].reshape(72, 48))
    assert torch.equal(mixer.gate_proj.bias, bias[:, 1].reshape(72))
    assert torch.equal(mixer.qkv_proj.weight[:72], rows[:, 0].reshape(72, 48))


# -- what the imported recipes say -------------------------------------------------------------------
def test_qwen3_next_recipe_reads_layers_attention_norms_and_experts(imported):
    m = imported("qwen3-next").model.recipe["model"]
    assert m["pattern"] == ["linear_attention", "linear_attention_dense", "linear_attention", "full_attention"]
    assert m["layer_types"]["full_attention"] == {"mixer": "attention"}
    assert m["layer_types"]["linear_attention_dense"]["ffn"] == {"kind": "swiglu", "hidden": 40, "bias": False}
    assert m["ffn"]["kind"] == "moe" and m["ffn"]["expert"]["hidden"] == 16
    assert {k: m["mixer"][k] for k in ("kind", "heads", "head_dim", "value_heads", "value_head_dim", "conv",
                                       "allow_neg_eigval", "norm_eps")} == {
        "kind": "gated_deltanet", "heads": 2, "head_dim": 8, "value_heads": 6, "value_head_dim": 4, "conv": 3,
        "allow_neg_eigval": False, "norm_eps": 1e-6}
    attention = m["attention"]
    assert attention["output_gate"] and attention["head_dim"] == 24 and attention["kv_heads"] == 1
    assert attention["qk_norm"]["kind"] == m["norm"]["kind"] == "gemma_rmsnorm" and attention["bias"] is True
    assert m["position"]["rotary_dim"] == 6  # 0.25 of 24
    ffn = m["ffn"]
    assert ffn["kind"] == "moe" and ffn["experts"] == 5 and ffn["top_k"] == 2 and ffn["shared_gate"]
    assert ffn["router"]["normalize"] is False and ffn["shared"]["hidden"] == 24 and ffn["expert"]["hidden"] == 16
    m = imported("qwen3-next-alternating").model.recipe["model"]
    assert m["pattern"] == ["linear_attention_dense", "full_attention"] and m["tie_embeddings"]
    assert m["position"]["rotary_dim"] == 12 and m["position"]["base"] == 5000.0
    assert m["ffn"]["router"]["normalize"] is True


def test_qwen3_5_recipes_read_dense_and_sparse_layers(imported):
    m = imported("qwen3.5").model.recipe["model"]
    assert m["pattern"] == ["full_attention", "linear_attention", "linear_attention"]  # cut short
    assert (m["ffn"]["kind"], m["ffn"]["hidden"]) == ("swiglu", 40) and m["position"]["rotary_dim"] == 6
    m = imported("qwen3.5-moe").model.recipe["model"]
    assert m["pattern"] == ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    assert m["ffn"]["kind"] == "moe" and m["ffn"]["router"]["normalize"] is True and m["ffn"]["shared_gate"]


def test_layer_kinds_follow_full_attention_interval_when_config_lists_none(imported):
    config = json.loads((imported("qwen3-next").folder / "config.json").read_text())
    del config["layer_types"]
    converter = seqzoo.registry().get("converter", "qwen3_next").cls()
    for interval in (2, 3):
        config.update(full_attention_interval=interval, num_hidden_layers=7)
        theirs = transformers.Qwen3NextConfig(**config).layer_types
        ours = [p if "full" in p else "linear_attention" for p in
                [t.removesuffix("_dense") for t in converter.recipe(config)["model"]["pattern"]]]
        assert (ours * 7)[:7] == theirs


# -- across the families -----------------------------------------------------------------------------
def test_qwen3_5_moe_exports_as_qwen3_next_unless_named(imported, tmp_path):
    """The two lay out the same model; the weights' layout is no part of a recipe."""
    hf, model, _ = imported("qwen3.5-moe")
    out = seqzoo.to_hf(model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3_next"
    again = transformers.Qwen3NextForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(3, V, (2, T))
    with torch.no_grad():
        assert parity.max_difference(again(ids).logits, hf(ids).logits) < 1e-5


def test_qwen3_next_without_experts_is_exported_as_qwen3_5(tmp_path):
    hf = qwen3_next(num_experts=0)
    pair = parity.import_reference(hf, tmp_path / "hf")
    parity.check_logits(pair, T)
    with pytest.raises(CheckpointError, match="no layer has experts; Qwen3-Next without them is Qwen3.5"):
        seqzoo.to_hf(pair.model, tmp_path / "unused", model_type="qwen3_next")
    out = seqzoo.to_hf(pair.model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3_5_text"
    again = qwen3_5.Qwen3_5ForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(3, V, (2, T))
    with torch.no_grad():
        assert parity.max_difference(again(ids).logits, hf(ids).logits) < 1e-5


def test_qwen3_5_reads_a_vision_language_checkpoints_language_model(imported, tmp_path):
    """Qwen3.5's checkpoints store the text model under model.language_model., beside the vision
    tower and the multi-token-prediction layer, which are dropped with one warning."""
    hf, _, folder = imported("qwen3.5")
    config = json.loads((folder / "config.json").read_text())
    extra = {"model.visual.patch_embed.proj.weight": torch.zeros(4, 3), "mtp.fc.weight": torch.zeros(4, 4)}
    vl = parity.edited_copy(folder, tmp_path / "vl", config, extra=extra,
                            rename=lambda n: n.replace("model.", "model.language_model.", 1))
    with pytest.warns(UserWarning, match="dropped the multi-token-prediction layer .*; the vision tower"):
        model = seqzoo.from_hf(vl)
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL


def test_qwen3_next_drops_the_multi_token_prediction_layer(imported, tmp_path):
    hf, _, folder = imported("qwen3-next")
    config = json.loads((folder / "config.json").read_text())
    mtp = parity.edited_copy(folder, tmp_path / "mtp", config, extra={"mtp.norm.weight": torch.ones(48)})
    with pytest.warns(UserWarning, match="dropped the multi-token-prediction layer"):
        seqzoo.from_hf(mtp)


# -- refusals ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, change, match", [
    ("qwen3-next", {"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported; its gated-delta layers run "
                                           r"their conv through it"),
    ("qwen3-next", {"linear_num_value_heads": 5}, r"linear_num_value_heads 5 is not supported; it must be a "
                                                  r"multiple of linear_num_key_heads 2"),
    ("qwen3-next", {"linear_key_head_dim": 0}, r"linear_key_head_dim 0 is not supported; it must be a positive"),
    ("qwen3-next", {"layer_types": ["linear_attention"] * 4}, r"layer_types .* it must list 5 entries"),
    ("qwen3-next", {"layer_types": ["mamba"] * 5}, r"each linear_attention or full_attention"),
    ("qwen3-next", {"layer_types": None, "full_attention_interval": 0}, r"full_attention_interval 0"),
    ("qwen3-next", {"norm_topk_prob": "yes"}, r"norm_topk_prob 'yes' is not supported; it must be true or false"),
    ("qwen3-next", {"decoder_sparse_step": 0}, r"decoder_sparse_step 0 is not supported"),
    ("qwen3-next", {"num_experts_per_tok": 0}, r"num_experts_per_tok 0 is not supported"),
    ("qwen3-next", {"rope_parameters": rope(1e4, 0.125)}, r"partial_rotary_factor 0.125 rotates 3 of head_dim 24"),
    ("qwen3-next", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
     r"rope_type 'longrope' is not supported"),
    ("qwen3.5", {"intermediate_size": 0}, r"intermediate_size 0 is not supported"),
])
def test_unsupported_config_option_is_refused_in_one_line(imported, tmp_path, name, change, match):
    parity.check_refused(imported(name).folder, tmp_path / "bad", change, match)


def with_model(recipe: dict, **changes) -> dict:
    return {**recipe, "model": {**recipe["model"], **changes}}


@pytest.mark.parametrize("family, change, match", [
    ("qwen3_next", {"norm": {"kind": "rmsnorm", "eps": 1e-6}}, r"model.norm is rmsnorm, needs gemma_rmsnorm"),
    ("qwen3_next", {"placement": "post"}, r"pre-norm with sequential residuals"),
    ("qwen3_next", {"position": "alibi"}, r"model.position is alibi, needs rope"),
    ("qwen3_next", {"mixer": "mamba2"}, r"layers are gated_deltanet or attention"),
    ("qwen3_next", {"final_softcap": 30.0}, r"final_softcap is set"),
    ("qwen3_next", {"logits_multiplier": 2.0}, r"logits_multiplier must be 1"),
    ("qwen3_next", {"layer_overrides": {0: {"mixer": {"conv": 4}}}}, r"gated-delta layers are alike"),
    ("qwen3_next", {"layer_overrides": {3: {"norm": {"eps": 1e-5}}}}, r"differ only in mixer and FFN"),
    ("qwen3_next", {"ffn": {"kind": "swiglu", "hidden": 40}}, r"no layer has experts"),
    ("qwen3_5_text", {"ffn": {"kind": "gelu", "hidden": 40}}, r"model.ffn must be swiglu without biases"),
    ("qwen3_5_moe_text", {"ffn": {"kind": "swiglu", "hidden": 40}}, r"every Qwen3.5-MoE layer is a mixture"),
])
def test_exporters_refuse_what_their_family_cannot_express(imported, family, change, match):
    converter = seqzoo.registry().get("converter", family).cls()
    base = imported({"qwen3_next": "qwen3-next", "qwen3_5_text": "qwen3.5",
                     "qwen3_5_moe_text": "qwen3.5-moe"}[family]).model.recipe
    recipe = resolve(with_model(base, **change)).data
    problem = converter.accepts(recipe)
    assert problem is not None and re.search(match, problem), problem


@pytest.mark.parametrize("part, change, match", [
    ("attention", {"output_gate": False}, r"output_gate must be true for Qwen3-Next"),
    ("attention", {"qk_norm": None}, r"qk_norm must be gemma_rmsnorm over each head"),
    ("attention", {"window": 8}, r"no sliding window"),
    ("attention", {"out_bias": False}, r"q/k/v and output biases differ"),
    ("mixer", {"allow_neg_eigval": True}, r"allow_neg_eigval must be False for Qwen3-Next"),
    ("mixer", {"norm_eps": 1e-5}, r"norm_eps 1e-05 must be 1e-06 \(rms_norm_eps\)"),
    ("mixer", {"conv_bias": True}, r"short conv has no bias"),
    ("ffn", {"shared_gate": False}, r"shared_gate is false; Qwen3-Next gates its shared expert"),
    ("ffn", {"shared": None}, r"Qwen3-Next has a shared expert"),
])
def test_qwen3_next_refuses_attention_mixer_and_expert_options_it_lacks(imported, part, change, match):
    converter = seqzoo.registry().get("converter", "qwen3_next").cls()
    recipe = imported("qwen3-next").model.recipe
    recipe = resolve(with_model(recipe, **{part: {**recipe["model"][part], **change}})).data
    assert re.search(match, converter.accepts(recipe)), converter.accepts(recipe)


# -- the shipped recipes -----------------------------------------------------------------------------
#: The model cards' configs (Qwen3-Next-80B-A3B-Instruct's config.json; Qwen3.5-0.8B's text_config).
QWEN3_NEXT_80B = {"model_type": "qwen3_next", "intermediate_size": 5120, "max_position_embeddings": 262144,
                  "rope_parameters": rope(10000000.0, 0.25)}
QWEN3_5_0_8B = {"model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 1024, "intermediate_size": 3584,
                "num_hidden_layers": 24, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
                "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
                "linear_value_head_dim": 128, "tie_word_embeddings": True, "max_position_embeddings": 262144,
                "rope_parameters": rope(10000000.0, 0.25, mrope_section=[11, 11, 10], mrope_interleaved=True)}


def hf_config(card: dict, **changes):
    cls = {"qwen3_next": transformers.Qwen3NextConfig, "qwen3_5_text": qwen3_5.Qwen3_5TextConfig}[card["model_type"]]
    return cls(**{k: v for k, v in {**card, **changes}.items() if k != "model_type"})


def count_on_meta(card: dict, **changes) -> int:
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config(card, **changes))
    return sum(p.numel() for p in model.parameters())


def ours_on_meta(name: str, overrides: list[str] = ()) -> int:
    return sum(p.numel() for p in seqzoo.build(name, overrides, device="meta").parameters())


@pytest.mark.parametrize("name, card", [("qwen3-next-80b-a3b", QWEN3_NEXT_80B), ("qwen3.5-0.8b", QWEN3_5_0_8B)])
def test_shipped_recipe_is_the_converters_recipe_of_the_model_card(name, card):
    converter = seqzoo.registry().get("converter", card["model_type"]).cls()
    config = hf_config(card).to_dict()
    theirs = resolve({**converter.recipe(config), "tokenizer": "bytes"}).data["model"]
    assert resolve(name).data["model"] == theirs


def test_qwen3_5_0_8b_has_the_parameters_of_transformers_model(capsys):
    assert ours_on_meta("qwen3.5-0.8b") == count_on_meta(QWEN3_5_0_8B) == 752_393_024
    assert main(["show", "qwen3.5-0.8b"]) == 0
    assert "parameters: 752,393,024" in capsys.readouterr().out


def test_qwen3_next_80b_layers_have_the_parameters_of_transformers_layers():
    """One round of the pattern (four layers of 512 experts); the whole model is the slow test."""
    assert ours_on_meta("qwen3-next-80b-a3b", ["model.layers=4"]) == count_on_meta(QWEN3_NEXT_80B,
                                                                                    num_hidden_layers=4)


@pytest.mark.slow
def test_qwen3_next_80b_has_the_parameters_of_transformers_model(capsys):
    assert ours_on_meta("qwen3-next-80b-a3b") == count_on_meta(QWEN3_NEXT_80B) == 79_674_391_296
    assert main(["show", "qwen3-next-80b-a3b"]) == 0
    assert "parameters: 79,674,391,296" in capsys.readouterr().out
