"""Kimi Linear (``kimi_linear``) against transformers: small random models chosen to exercise what
sets the family apart — Kimi Delta Attention layers (3 heads of 8, short convs of 3, over C = 48)
beside multi-head latent attention layers without positions, at the layer ``linear_attn_config``
numbers from 1 or ``layer_types`` lists; MLA with a full q projection and with a low-rank one,
keys of 6 + a shared, never rotated 4, values of 5, biases; dense first layers
(``first_k_dense_replace``) and a dense layer between sparse ones (``mlp_layer_types``); DeepSeek-V3's
routing (sigmoid scores, a random selection bias, 3 expert groups of which 2 are kept, a routed
scale ≠ 1, renormalised or not) over 6 SwiGLU experts beside a shared expert two experts wide;
sequences of T = 70, longer than one KDA chunk of 64 and no multiple of it; random norms, A_log,
Δ bias — imported with ``seqzoo.from_hf`` and checked with the converter kit: logits ≤ 1e-4 in
float32 plain and left-padded (measured ≤ 3e-5 on logits of order 3: seqzoo's and transformers'
chunked KDA forms round differently in float32, which the random layers amplify; MLA and dense
layers alone agree exactly),
32 greedy steps with and without the state cache equal to transformers' own cached generation, and
an exported folder transformers loads with the same logits.

transformers' class never ties the head to the embedding, whatever ``tie_word_embeddings`` says: a
stored head is imported as its own, and a tied seqzoo model exports its head written out.
transformers 5 cannot decode a Kimi Linear without attention layers from its cache
(``get_mask_sizes`` wants an attention layer); that model's decoding, cached and not, is checked
against transformers' generation without a cache (a full forward per step).
"""
from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file

import seqzoo
from seqzoo.builder import layer_plan
from seqzoo.cli import main
from seqzoo.nn.generation import generate
from seqzoo.recipe import resolve
from seqzoo.testing import parity

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.filterwarnings("ignore:.*no tokenizer written")  # random models have none

V = 128   # vocabulary of every test model
T = 70    # test sequence length: longer than one KDA chunk of 64, not a multiple of it
IDS = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0)
KIMI = seqzoo.registry().get("converter", "kimi_linear").cls()
LINEAR = {"num_heads": 3, "head_dim": 8, "short_conv_kernel_size": 3}
ABSENT = object()  # a key left out of config.json


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def kimi(**kw):
    # KDA: 3 heads of 8, convs of 3; MLA: 3 heads, latent 10, keys 6 + 4, values 5; a dense SwiGLU of 56;
    # 6 experts of 12 in 3 groups (2 kept), top 3, scaled by 1.7, beside a shared expert of 2 · 12
    config = {**IDS, "hidden_size": 48, "intermediate_size": 56, "num_hidden_layers": 5, "num_attention_heads": 3,
              "num_key_value_heads": 3, "kv_lora_rank": 10, "q_lora_rank": None, "qk_nope_head_dim": 6,
              "qk_rope_head_dim": 4, "v_head_dim": 5, "moe_intermediate_size": 12, "num_experts": 6,
              "num_experts_per_token": 3, "num_shared_experts": 2, "num_expert_group": 3, "topk_group": 2,
              "routed_scaling_factor": 1.7, "first_k_dense_replace": 2, "model_max_length": 128,
              "linear_attn_config": {"full_attn_layers": [3], "kda_layers": [1, 2, 4, 5], **LINEAR},
              "initializer_range": 0.1, **kw}  # logits of order 1
    config = {k: v for k, v in config.items() if v is not ABSENT}
    model = transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(**config))
    with torch.no_grad():
        for name, buffer in model.named_buffers():  # the selection bias is a buffer, zero at init
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.1)
        for name, parameter in model.named_parameters():  # A_log and the Δ bias start in narrow ranges
            if name.endswith(("A_log", "dt_bias")):
                parameter.add_(0.3 * torch.randn_like(parameter))
    return parity.randomised(model)


MODELS = {
    # [kda, kda, mla, kda, kda] by linear_attn_config, the first two dense; a full q projection
    "kimi-moe": lambda: kimi(),
    # transformers' own spelling: layer_types (MLA at 0 and 3), mlp_layer_types with a dense layer
    # between sparse ones, linear_num_heads & co., num_local_experts & co.; a low-rank q (12) and
    # biases on q_a, kv_a and o; one expert group, weights not renormalised; a tied head
    "kimi-transformers-names": lambda: kimi(
        linear_attn_config=ABSENT, layer_types=["full_attention", "linear_attention", "linear_attention",
                                              "full_attention", "linear_attention"],
        mlp_layer_types=["sparse", "dense", "sparse", "sparse", "sparse"], linear_num_heads=2, linear_head_dim=12,
        linear_conv_kernel_dim=4, first_k_dense_replace=ABSENT, num_experts=ABSENT, num_local_experts=6,
        num_experts_per_token=ABSENT, num_experts_per_tok=2, num_expert_group=ABSENT, n_group=1, topk_group=ABSENT,
        moe_renormalize=ABSENT, norm_topk_prob=False, q_lora_rank=12, attention_bias=True, tie_word_embeddings=True),
}
KDA_ONLY = lambda: kimi(linear_attn_config={"full_attn_layers": [], "kda_layers": [1, 2, 3], **LINEAR},  # noqa: E731
                        num_hidden_layers=3, first_k_dense_replace=1)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    models = {**MODELS, "kimi-kda-only": KDA_ONLY}
    return parity.cached_imports(lambda name: models[name](), tmp_path_factory)


@pytest.mark.parametrize("name", list(MODELS))
def test_family_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits plain and left-padded, 32 greedy steps with and without the state cache, the export."""
    parity.check_causal_lm(imported(name), tmp_path / "out", T, model_type="kimi_linear")


def test_a_model_without_attention_decodes_as_transformers_computes_whole(imported, tmp_path):
    pair = imported("kimi-kda-only")
    for pad in (0, 3):  # plain and left-padded
        ids, mask = parity.left_padded(V, T, pad=pad)
        with torch.no_grad():
            theirs = pair.hf(ids, attention_mask=mask, use_cache=False).logits
            assert parity.max_difference(pair.model(ids, attention_mask=mask), theirs, mask.bool()) < parity.TOL
    parity.check_export(pair, tmp_path / "out", T, model_type="kimi_linear",
                        run=lambda model, ids: model(ids, use_cache=False).logits)
    ids, mask = parity.left_padded(V, 8, pad=2)
    theirs = parity.hf_greedy(pair.hf, ids, mask, 32, use_cache=False)
    for use_cache in (True, False):
        ours = generate(pair.model, ids, 32, attention_mask=mask, eos_id=None, use_cache=use_cache)
        assert torch.equal(ours, theirs), f"use_cache={use_cache}"


def test_a_config_in_moonshots_form_reads_the_same(imported, tmp_path):
    """The original config.json names the experts' options its own way and lists no layer_types,
    mlp_layer_types or linear_* keys; its dense MLP tensors are ``mlp.``, not ``block_sparse_moe.``."""
    hf, model, folder = imported("kimi-moe")
    config = json.loads((folder / "config.json").read_text())
    for key in ("layer_types", "mlp_layer_types", "linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim"):
        config.pop(key)
    config.update(mla_use_nope=True, moe_router_activation_func="sigmoid", moe_layer_freq=1, use_grouped_topk=True)
    moonshot = parity.edited_copy(folder, tmp_path / "moonshot", config, rename=lambda n: re.sub(
        r"(layers\.[01])\.block_sparse_moe\.", r"\1.mlp.", n))
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        assert torch.equal(seqzoo.from_hf(moonshot, device="cpu")(ids), model(ids))


def test_a_tied_seqzoo_model_writes_its_head_out(imported, tmp_path):
    """transformers never ties Kimi Linear's head (a config's tie_word_embeddings true leaves a
    stored head its own): a tied seqzoo model exports the embedding twice."""
    assert imported("kimi-transformers-names").model.recipe["model"]["tie_embeddings"] is False
    recipe = imported("kimi-moe").model.recipe
    model = seqzoo.build({**recipe, "model": {**recipe["model"], "tie_embeddings": True}}, device="cpu").eval()
    out = seqzoo.to_hf(model, tmp_path / "out", model_type="kimi_linear")
    hf = transformers.KimiLinearForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL


# -- what the imported recipes say -------------------------------------------------------------------
def test_recipe_reads_the_layers_experts_and_latent_attention(imported):
    m = imported("kimi-moe").model.recipe["model"]
    assert m["position"]["kind"] == "none" and m["mixer"]["kind"] == "kda"
    assert (m["mixer"]["heads"], m["mixer"]["head_dim"], m["mixer"]["conv"]) == (3, 8, 3)
    assert [p.mixer["kind"] for p in layer_plan(m)] == ["kda", "kda", "mla", "kda", "kda"]
    assert [p.ffn["kind"] for p in layer_plan(m)] == ["swiglu", "swiglu", "moe", "moe", "moe"]
    mla = layer_plan(m)[2].mixer
    assert (mla["qk_nope_head_dim"], mla["qk_rope_head_dim"], mla["v_head_dim"], mla["norm_eps"]) == (6, 4, 5, 1e-6)
    ffn = m["ffn"]
    assert (ffn["experts"], ffn["top_k"], ffn["routed_scale"], ffn["shared"]["hidden"]) == (6, 3, 1.7, 24)
    assert ffn["router"] == {"kind": "sigmoid_grouped", "groups": 3, "topk_groups": 2, "normalize": True,
                             "bias_update": 0.0}
    m = imported("kimi-transformers-names").model.recipe["model"]
    assert [p.mixer["kind"] for p in layer_plan(m)] == ["mla", "kda", "kda", "mla", "kda"]
    assert [p.ffn["kind"] for p in layer_plan(m)] == ["moe", "swiglu", "moe", "moe", "moe"]
    assert layer_plan(m)[0].mixer["q_lora_rank"] == 12 and m["ffn"]["router"]["normalize"] is False
    assert (m["mixer"]["heads"], m["mixer"]["head_dim"], m["mixer"]["conv"]) == (2, 12, 4)


def test_the_published_layout_is_a_pattern_and_two_exceptions():
    """Kimi-Linear-48B's 27 layers: three KDA to one MLA, a dense first layer, MLA again at the last."""
    m = KIMI.recipe(KIMI_LINEAR_48B)["model"]
    assert m["pattern"] == ["kda", "kda", "kda", "mla"] and m["layer_overrides"] == {0: "kda_dense", 26: "mla"}


@pytest.mark.parametrize("name", list(MODELS))
def test_export_writes_both_spellings_and_moonshots_tensor_names(imported, name, tmp_path):
    hf, model, _ = imported(name)
    out = seqzoo.to_hf(model, tmp_path / "out", model_type="kimi_linear")
    config = json.loads((out / "config.json").read_text())
    assert config["layer_types"] == hf.config.layer_types and config["mlp_layer_types"] == hf.config.mlp_layer_types
    linear = config["linear_attn_config"]
    assert linear["full_attn_layers"] == [i + 1 for i, k in enumerate(hf.config.layer_types) if k == "full_attention"]
    assert (linear["num_heads"], linear["head_dim"]) == (hf.config.linear_num_heads, hf.config.linear_head_dim)
    for key in ("num_experts", "num_experts_per_token", "num_shared_experts", "num_expert_group", "topk_group",
                "moe_renormalize", "routed_scaling_factor", "q_lora_rank"):
        assert config[key] == getattr(hf.config, key), key
    assert config["tie_word_embeddings"] is False  # transformers never ties the head: it is written out
    assert config["mla_use_nope"] is True and config["moe_router_activation_func"] == "sigmoid"
    names = load_file(out / "model.safetensors")
    assert "lm_head.weight" in names
    dense = [i for i, k in enumerate(hf.config.mlp_layer_types) if k == "dense"]
    assert all(f"model.layers.{i}.mlp.gate_proj.weight" in names for i in dense)
    assert ("first_k_dense_replace" in config) == (dense == list(range(len(dense))))


# -- refusals ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, match", [
    ({"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported; the KDA convs and the MLPs"),
    ({"mla_use_nope": False}, r"mla_use_nope False is not supported; transformers runs Kimi Linear as if it were "
                              r"True"),
    ({"moe_router_activation_func": "softmax"}, r"moe_router_activation_func 'softmax' is not supported"),
    ({"moe_layer_freq": 2}, r"moe_layer_freq 2 is not supported"),
    ({"num_local_experts": 8}, r"num_local_experts 8 is not supported; config.json also says num_experts 6"),
    ({"layer_types": ["linear_attention"] * 4}, r"layer_types .* it must list 5 entries, each linear_attention or"),
    ({"layer_types": None, "linear_attn_config": {"full_attn_layers": [3], "kda_layers": [1, 2], **LINEAR}},
     r"linear_attn_config .* its full_attn_layers and kda_layers must number the layers 1..5"),
    ({"num_shared_experts": 0}, r"num_shared_experts 0 is not supported; Kimi Linear's experts sit beside"),
    ({"attention_dropout": 0.1}, r"attention_dropout 0.1 is not supported; seqzoo's latent attention has no"),
    ({"qk_rope_head_dim": 0}, r"qk_rope_head_dim 0 is not supported; it must be a positive integer"),
])
def test_unsupported_config_option_is_refused_in_one_line(imported, tmp_path, change, match):
    parity.check_refused(imported("kimi-moe").folder, tmp_path / "bad", change, match)


def with_type(recipe: dict, name: str, part: str, **changes) -> dict:
    """The recipe with layer type ``name``'s ``part`` (mixer or ffn; the model's unless it has its own)
    changed."""
    m = recipe["model"]
    types = m["layer_types"]
    spec = types[name].get(part) or m[part]
    return {**recipe, "model": {**m, "layer_types": {**types, name: {**types[name], part: {**spec, **changes}}}}}


def with_model(recipe: dict, **changes) -> dict:
    return {**recipe, "model": {**recipe["model"], **changes}}


@pytest.mark.parametrize("change, match", [
    (lambda r: with_model(r, mixer={"kind": "mamba2", "head_dim": 8}), r"Kimi Linear's layers are kda or mla"),
    (lambda r: with_type(r, "kda_dense", "mixer", heads=2), r"KDA layers are alike, and its MLA"),
    (lambda r: with_model(r, mixer={**r["model"]["mixer"], "conv_bias": True}), r"no conv or gate bias"),
    (lambda r: with_model(r, mixer={**r["model"]["mixer"], "rank": 4}), r"rank must equal head_dim"),
    (lambda r: with_model(r, mixer={**r["model"]["mixer"], "norm_eps": 1e-6}), r"norm_eps 1e-06 must be model"),
    (lambda r: with_type(r, "mla", "mixer", norm_eps=1e-5), r"normalises its latent with ε 1e-06"),
    (lambda r: with_type(r, "mla", "mixer", scale=0.5), r"scales its scores by \(d_n \+ d_r\)\^-1/2"),
    (lambda r: with_model(r, position={"kind": "rope", "base": 10000.0}), r"model.position is rope; Kimi Linear has"),
    (lambda r: with_type(r, "kda_dense", "ffn", bias=True), r"dense FFNs are swiglu without biases"),
    (lambda r: with_model(r, ffn={**r["model"]["ffn"], "router": {"kind": "softmax_topk"}}), r"needs sigmoid_grouped"),
    (lambda r: with_model(r, ffn={**r["model"]["ffn"], "shared": None}), r"a whole number of experts wide"),
    (lambda r: with_model(r, ffn={**r["model"]["ffn"], "shared_gate": True}), r"no shared gate"),
    (lambda r: with_model(r, norm={"kind": "layernorm"}), r"model.norm is layernorm, needs rmsnorm"),
    (lambda r: with_model(r, embedding_multiplier=2.0), r"no embedding norm or scale, final softcap or multipliers"),
])
def test_exporter_refuses_what_kimi_linear_cannot_express(imported, change, match):
    reason = KIMI.accepts(change(imported("kimi-moe").model.recipe))
    assert reason is not None and re.search(match, reason), reason


# -- the shipped recipe ------------------------------------------------------------------------------
#: Kimi-Linear-48B-A3B's config.json (moonshotai/Kimi-Linear-48B-A3B-Instruct), as the recipe's comment says.
KIMI_LINEAR_48B = {
    "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 27,
    "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 72, "hidden_act": "silu", "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "model_max_length": 1048576, "q_lora_rank": None,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "moe_intermediate_size": 1024, "num_experts": 256,
    "num_experts_per_token": 8, "num_shared_experts": 1, "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 2.446, "use_grouped_topk": True,
    "num_expert_group": 1, "topk_group": 1, "num_nextn_predict_layers": 0,
    "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128, "num_heads": 32,
                           "short_conv_kernel_size": 4,
                           "kda_layers": [i for i in range(1, 28) if i not in (4, 8, 12, 16, 20, 24, 27)]},
}


def test_kimi_linear_48b_has_transformers_parameter_count_and_is_its_config():
    """The shipped recipe builds on the meta device to the count transformers gives the published
    config (49,122,675,072), and is what the converter makes of that config, layer by layer."""
    with torch.device("meta"):
        reference = transformers.AutoModelForCausalLM.from_config(transformers.KimiLinearConfig(**KIMI_LINEAR_48B))
    model = seqzoo.build("kimi-linear-48b-a3b", device="meta")
    count = sum(p.numel() for p in model.parameters())
    assert count == sum(p.numel() for p in reference.parameters()) == 49_122_675_072
    converted = resolve(KIMI.recipe(KIMI_LINEAR_48B)).data
    ours, theirs = layer_plan(model.recipe["model"]), layer_plan(converted["model"])
    assert [(p.mixer_spec, p.ffn, p.norm) for p in ours] == [(p.mixer_spec, p.ffn, p.norm) for p in theirs]
    for key in ("vocab_size", "max_seq_len", "position", "tie_embeddings"):
        assert model.recipe["model"][key] == converted["model"][key], key


def test_show_counts_kimi_linear_48b_without_allocating(capsys):
    assert main(["show", "kimi-linear-48b-a3b"]) == 0
    assert "parameters: 49,122,675,072 (3,484,453,248 active per token)" in capsys.readouterr().out
