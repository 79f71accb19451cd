"""LFM2 and LFM2-MoE against transformers: small random models of each family with configs chosen to
exercise what sets them apart — short-conv layers of kernel 3 and 4 among attention layers (a
pattern cut short, and the legacy ``full_attn_idxs``), GQA over an odd head count with head_dim ≠
C / H, q/k RMSNorms drawn at random, the FFN width transformers derives from intermediate_size
(⌊2/3·F⌋, a multiplier, a multiple), the legacy ``block_ff_dim`` / ``tie_embedding`` keys, conv
biases, dense layers before sigmoid-routed experts with a random expert bias, a routed scale ≠ 1,
unnormalised and normalised top-k — imported with ``seqzoo.from_hf`` and checked with the
converter kit (logits ≤ 1e-4 float32 plain and left-padded, 32 greedy steps with and without the
conv/KV cache against transformers' cached greedy decoding, an exported folder transformers loads).

transformers runs its PyTorch conv path here (no causal_conv1d kernels on this CPU)."""
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
pytestmark = pytest.mark.filterwarnings("ignore:.*no tokenizer written")  # random models have none

V = 128   # vocabulary of every test model
T = 20    # test sequence length
IDS = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=256)
# 3 attention heads of 24 over 1 KV head (24 ≠ 48 / 3)
SHAPE = dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=1, head_dim=24)
CONV, ATTN = "conv", "full_attention"


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def lfm2(bias_std: float = 0.1, **kw):
    config = {**IDS, **SHAPE, "num_hidden_layers": 5, "layer_types": [CONV, CONV, ATTN, CONV, CONV],
              "intermediate_size": 100, "block_multiple_of": 16, "block_ffn_dim_multiplier": 1.3, "conv_L_cache": 4,
              "tie_word_embeddings": False, "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}, **kw}
    return parity.randomised(transformers.Lfm2ForCausalLM(transformers.Lfm2Config(**config)), bias_std=bias_std)


def lfm2_moe(expert_bias: bool = True, **kw):
    config = {**IDS, **SHAPE, "num_hidden_layers": 5, "layer_types": [CONV, ATTN, CONV, CONV, ATTN],
              "intermediate_size": 72, "moe_intermediate_size": 20, "num_experts": 5, "num_experts_per_tok": 2,
              "num_dense_layers": 1, "routed_scaling_factor": 1.5, "use_expert_bias": expert_bias, **kw}
    hf = parity.randomised(transformers.Lfm2MoeForCausalLM(transformers.Lfm2MoeConfig(**config)))
    with torch.no_grad():  # transformers starts the selection bias at zero, where it changes no choice
        for layer in hf.model.layers[config["num_dense_layers"]:]:
            if expert_bias:
                layer.feed_forward.expert_bias.normal_(0.0, 0.2)
    return hf


MODELS = {
    # [conv, conv, attention, conv, conv]: the pattern [conv, conv, attention] cut short; conv kernel 4;
    # FFN ⌊2/3·100⌋ = 66, ×1.3 = 85, up to a multiple of 16 = 96; θ = 5000; an untied head
    "lfm2": lambda: lfm2(),
    # the legacy keys: attention at full_attn_idxs [1, 3] (no layer_types), block_ff_dim 90 (⌊2/3·90⌋
    # = 60, a multiple of 1), tie_embedding; 4 heads of 12 over 2, linear RoPE scaling
    "lfm2-legacy": lambda: lfm2(num_hidden_layers=4, layer_types=None, full_attn_idxs=[1, 3], block_ff_dim=90,
                                block_ffn_dim_multiplier=1.0, block_multiple_of=1, tie_embedding=True,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=12, conv_L_cache=3,
                                rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}),
    # one dense layer, then top-2 of 5 experts chosen by σ + a random bias, renormalised, × 1.5
    "lfm2-moe": lambda: lfm2_moe(),
    # no expert bias, unnormalised weights, two dense layers, a tied head
    "lfm2-moe-plain": lambda: lfm2_moe(expert_bias=False, norm_topk_prob=False, num_dense_layers=2,
                                       routed_scaling_factor=1.0, tie_word_embeddings=True),
    # conv_bias: biases on in_proj, conv and out_proj, large enough that transformers' padding shows
    "lfm2-bias": lambda: lfm2(bias_std=1.0, conv_bias=True, num_hidden_layers=3, layer_types=[CONV, ATTN, CONV]),
}
FAMILY = {name: "lfm2_moe" if "moe" in name else "lfm2" for name in MODELS}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    return parity.cached_imports(lambda name: MODELS[name](), tmp_path_factory)


@pytest.mark.parametrize("name", [n for n in MODELS if n != "lfm2-bias"])
def test_family_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits plain and left-padded, 32 greedy steps with and without the state cache, the export
    (picked by itself: no other family has short-conv layers or sigmoid-routed LFM2 experts)."""
    out = parity.check_causal_lm(imported(name), tmp_path / "out", T)
    assert json.loads((out / "config.json").read_text())["model_type"] == FAMILY[name]


def test_conv_biases_match_transformers_unpadded_and_pad_without_leaking(imported, tmp_path):
    """With conv_bias, transformers zeroes padding before in_proj, so the conv sees in_proj's bias at
    pad positions and carries it into the first real tokens; seqzoo zeroes the conv input, so the
    padded row equals the row alone (docs/formulas.md §15.9). Unpadded, the two agree."""
    pair = imported("lfm2-bias")
    parity.check_logits(pair, T)
    parity.check_export(pair, tmp_path / "out", T)
    parity.check_greedy(pair, pad=0)
    ids, mask = parity.left_padded(V, T)
    alone = ids[-1:, 3:]
    with torch.no_grad():
        ours, ours_alone = pair.model(ids, attention_mask=mask)[-1, 3:], pair.model(alone)[0]
        theirs = pair.hf(ids, attention_mask=mask).logits[-1, 3:]
    assert parity.max_difference(ours, ours_alone) < parity.TOL
    assert parity.max_difference(theirs, ours_alone) > 1e-3  # transformers' leak, not seqzoo's


# -- what the imported recipes say -------------------------------------------------------------------
def test_lfm2_recipe_reads_layers_ffn_width_and_attention(imported):
    m = imported("lfm2").model.recipe["model"]
    assert m["layer_types"] == {"conv": {}, "attention": {"mixer": "attention"}}
    assert m["pattern"] == ["conv", "conv", "attention"] and not m["layer_overrides"]  # over 5 layers
    assert m["mixer"] == {"kind": "short_conv", "conv": 4, "conv_bias": False, "bias": False}
    assert m["ffn"]["kind"] == "swiglu" and m["ffn"]["hidden"] == 96 == imported("lfm2").hf.model.layers[0] \
        .feed_forward.w1.out_features
    attn = m["attention"]
    assert (attn["heads"], attn["kv_heads"], attn["head_dim"], attn["bias"]) == (3, 1, 24, False)
    assert attn["qk_norm"] == {"kind": "rmsnorm", "eps": 1e-5} and attn["qk_norm_scope"] == "head"
    assert m["position"]["base"] == 5000.0 and m["tie_embeddings"] is False


def test_lfm2_reads_the_legacy_keys_transformers_reads_first(imported):
    m = imported("lfm2-legacy").model.recipe["model"]
    assert m["pattern"] == ["conv", "attention"] and m["ffn"]["hidden"] == 60 and m["tie_embeddings"] is True
    assert m["position"]["scaling"]["kind"] == "linear" and m["mixer"]["conv"] == 3


def test_every_layer_attends_when_the_config_names_neither_layer_types_nor_indices():
    converter = seqzoo.registry().get("converter", "lfm2").cls()
    m = converter.recipe({**IDS, **SHAPE, "num_hidden_layers": 2, "intermediate_size": 96})["model"]
    assert "mixer" not in m and "pattern" not in m and m["ffn"]["hidden"] == 256  # ⌊64⌋ up to 256
    assert m["position"]["base"] == 1e6  # Lfm2Config's default θ


def test_lfm2_moe_recipe_reads_dense_layers_experts_and_the_router(imported):
    model = imported("lfm2-moe").model
    m = model.recipe["model"]
    assert m["layer_overrides"] == {"0": {"ffn": {"kind": "swiglu", "hidden": 72, "bias": False}}}
    assert {k: m["ffn"][k] for k in ("experts", "top_k", "routed_scale", "shared")} == {
        "experts": 5, "top_k": 2, "routed_scale": 1.5, "shared": None}
    assert m["ffn"]["router"]["kind"] == "sigmoid_grouped" and m["ffn"]["router"]["groups"] == 1
    assert m["ffn"]["router"]["normalize"] is True
    hf_bias = imported("lfm2-moe").hf.model.layers[1].feed_forward.expert_bias
    assert torch.equal(model.decoder.blocks[1].ffn.router.correction_bias, hf_bias)
    plain = imported("lfm2-moe-plain").model
    assert plain.recipe["model"]["ffn"]["router"]["normalize"] is False
    assert not plain.decoder.blocks[2].ffn.router.correction_bias.any()  # no use_expert_bias: no bias


# -- exports -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["lfm2", "lfm2-legacy"])
def test_lfm2_export_writes_the_ffn_width_itself_and_the_layer_types(imported, name, tmp_path):
    hf, model, _ = imported(name)
    config = json.loads((seqzoo.to_hf(model, tmp_path / "out") / "config.json").read_text())
    assert config["layer_types"] == hf.config.layer_types
    assert config["intermediate_size"] == hf.model.layers[0].feed_forward.w1.out_features
    assert config["block_auto_adjust_ff_dim"] is False and config["head_dim"] == hf.config.head_dim


def test_lfm2_moe_export_writes_the_expert_bias_always(imported, tmp_path):
    hf, model, _ = imported("lfm2-moe-plain")
    out = seqzoo.to_hf(model, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["use_expert_bias"] is True and config["num_dense_layers"] == 2
    assert config["norm_topk_prob"] is False and config["layer_types"] == hf.config.layer_types
    again = transformers.Lfm2MoeForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert not again.model.layers[2].feed_forward.expert_bias.any()  # a zero bias: the same choice


def test_tiny_lfm2_exports_to_lfm2(tmp_path):
    """The shipped tiny-lfm2 recipe is an LFM2: it exports by itself and transformers computes its
    logits."""
    model = seqzoo.build("tiny-lfm2", device="cpu").eval()
    out = seqzoo.to_hf(model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["model_type"] == "lfm2"
    hf = transformers.Lfm2ForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(3, 259, (2, 40))
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL


def test_an_attention_only_stack_is_qwen3s_unless_lfm2_is_named(tmp_path):
    """Without conv layers LFM2's layout is Qwen3's (q/k RMSNorm per head, no biases): LFM2 is
    exported only when named, and then transformers' LFM2 computes the same logits."""
    hf = parity.randomised(transformers.Lfm2ForCausalLM(transformers.Lfm2Config(
        **IDS, **SHAPE, num_hidden_layers=2, intermediate_size=96, tie_word_embeddings=False)))
    pair = parity.import_reference(hf, tmp_path / "hf")
    assert seqzoo.io.hf.exporter_for(pair.model).model_type == "qwen3"
    parity.check_export(pair, tmp_path / "out", T, model_type="lfm2")


# -- refusals ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, change, match", [
    ("lfm2", {"layer_types": [CONV, "sliding_attention", CONV, CONV, CONV]},
     r"layer_types .* is not supported; it must list num_hidden_layers = 5 entries of conv or full_attention"),
    ("lfm2", {"layer_types": [CONV, ATTN]}, r"layer_types .* it must list num_hidden_layers = 5 entries"),
    ("lfm2-legacy", {"layer_types": None, "full_attn_idxs": [1, 4]},
     r"full_attn_idxs \[1, 4\] is not supported; it must list layer"),
    ("lfm2", {"conv_L_cache": 0}, r"conv_L_cache 0 is not supported; it must be a positive integer"),
    ("lfm2", {"block_auto_adjust_ff_dim": "yes"}, r"block_auto_adjust_ff_dim 'yes' is not supported; it must be"),
    ("lfm2", {"intermediate_size": 1, "block_ffn_dim_multiplier": None},
     r"intermediate_size 1 is not supported; block_auto_adjust_ff_dim makes it 0 wide"),
    ("lfm2", {"block_ffn_dim_multiplier": -1.0}, r"block_ffn_dim_multiplier -1.0 is not supported; it must be a "
                                                 r"positive number"),
    ("lfm2", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     r"partial_rotary_factor 0.5 is not supported for lfm2"),
    ("lfm2-moe", {"layer_types": None}, r"layer_types None is not supported; it must list num_hidden_layers = 5"),
    ("lfm2-moe", {"num_experts_per_tok": 6}, r"num_experts_per_tok 6 is not supported; it must be 1..num_experts"),
    ("lfm2-moe", {"num_dense_layers": -1}, r"num_dense_layers -1 is not supported; it must be 0 or more"),
    ("lfm2-moe", {"routed_scaling_factor": 0}, r"routed_scaling_factor 0 is not supported; it must be a positive"),
])
def test_unsupported_config_option_is_refused_in_one_line(imported, tmp_path, name, change, match):
    parity.check_refused(imported(name).folder, tmp_path / "bad", change, match)


def with_model(recipe: dict, **changes) -> dict:
    return {**recipe, "model": {**recipe["model"], **changes}}


@pytest.mark.parametrize("name, change, match", [
    ("lfm2", lambda m: {"mixer": "mamba2"}, r"layers use \['attention', 'mamba2'\]; LFM2's are short_conv"),
    ("lfm2", lambda m: {"mixer": {**m["mixer"], "bias": True}}, r"set bias equal to conv_bias"),
    ("lfm2", lambda m: {"layer_overrides": {3: {"mixer": {"conv": 3}}}}, r"the short_conv layers differ"),
    ("lfm2", lambda m: {"layer_overrides": {3: {"ffn": {"hidden": 32}}}}, r"the FFNs differ between layers"),
    ("lfm2", lambda m: {"layer_types": {"conv": {}, "attention": {"mixer": "attention", "norm": {"eps": 1e-6}}}},
     r"differ only in their mixer"),
    ("lfm2", lambda m: {"ffn": {"kind": "geglu", "hidden": 96}}, r"model.ffn is geglu; LFM2's is SwiGLU"),
    ("lfm2", lambda m: {"norm": {"kind": "layernorm"}}, r"model.norm is layernorm, needs rmsnorm"),
    ("lfm2", lambda m: {"position": "learned"}, r"model.position is learned, needs rope"),
    ("lfm2", lambda m: {"embedding_multiplier": 2.0}, r"no embedding or logits multiplier"),
    ("lfm2", lambda m: {"residual_multiplier": 0.5}, r"no multiplier"),
    ("lfm2", lambda m: {"attention": {**m["attention"], "qk_norm": None}}, r"qk_norm must be an rmsnorm over each"),
    ("lfm2", lambda m: {"attention": {**m["attention"], "window": 8}}, r"no biases, window, softcap"),
    ("lfm2", lambda m: {"attention": {**m["attention"], "bias": True}}, r"no biases, window, softcap"),
    ("lfm2-moe", lambda m: {"ffn": {"kind": "swiglu", "hidden": 72}}, r"no layer has experts"),
    ("lfm2-moe", lambda m: {"layer_overrides": {3: {"ffn": {"kind": "swiglu", "hidden": 72}}}},
     r"dense layers come first"),
    ("lfm2-moe", lambda m: {"ffn": {**m["ffn"], "router": {"kind": "softmax_topk"}}},
     r"model.ffn.router is softmax_topk; LFM2-MoE routes by sigmoid_grouped"),
    ("lfm2-moe", lambda m: {"ffn": {**m["ffn"], "router": {**m["ffn"]["router"], "groups": 5, "topk_groups": 5}}},
     r"sigmoid_grouped with one group"),
    ("lfm2-moe", lambda m: {"ffn": {**m["ffn"], "shared": {"kind": "swiglu", "hidden": 8}}}, r"no shared expert"),
    ("lfm2-moe", lambda m: {"ffn": {**m["ffn"], "expert": {"kind": "geglu", "hidden": 20}}},
     r"experts are SwiGLU without biases"),
])
def test_exporters_refuse_what_their_family_cannot_express(imported, name, change, match):
    recipe = imported(name).model.recipe
    converter = seqzoo.registry().get("converter", FAMILY[name]).cls()
    problem = converter.accepts(resolve(with_model(recipe, **change(recipe["model"]))).data)
    assert problem is not None and re.search(match, problem), problem


def test_a_mixture_of_experts_is_not_exported_as_lfm2(imported):
    with pytest.raises(CheckpointError, match="cannot export as lfm2: model.layer_types: the FFNs differ"):
        seqzoo.to_hf(imported("lfm2-moe").model, "unused", model_type="lfm2")


# -- the shipped recipe ------------------------------------------------------------------------------
#: LFM2-350M's config.json as the checkpoint writes it (legacy keys and all).
LFM2_350M = {"model_type": "lfm2", "vocab_size": 65536, "hidden_size": 1024, "block_ff_dim": 6656,
             "intermediate_size": 6656, "block_auto_adjust_ff_dim": True, "block_ffn_dim_multiplier": 1.0,
             "block_multiple_of": 256, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 8,
             "max_position_embeddings": 128000, "norm_eps": 1e-5, "conv_bias": False, "conv_L_cache": 3,
             "rope_theta": 1000000.0, "tie_embedding": True, "full_attn_idxs": [2, 5, 8, 10, 12, 14],
             "layer_types": [CONV, CONV, ATTN, CONV, CONV, ATTN, CONV, CONV, ATTN, CONV, ATTN, CONV, ATTN, CONV, ATTN,
                             CONV], "bos_token_id": 1, "eos_token_id": 7, "pad_token_id": 0}


def lfm2_350m_config():
    return transformers.Lfm2Config(**{k: v for k, v in LFM2_350M.items() if k != "model_type"})


def test_shipped_recipe_is_the_converters_recipe_of_the_checkpoint_config():
    converter = seqzoo.registry().get("converter", "lfm2").cls()
    for config in (LFM2_350M, lfm2_350m_config().to_dict()):  # as written, and as transformers saves it
        theirs = resolve({**converter.recipe(config), "tokenizer": "bytes"}).data["model"]
        assert resolve("lfm2-350m").data["model"] == theirs


def test_lfm2_350m_has_the_parameters_of_transformers_model(capsys):
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(lfm2_350m_config())
    ours = seqzoo.build("lfm2-350m", device="meta")
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters()) == 354_483_968
    assert main(["show", "lfm2-350m"]) == 0
    assert "parameters: 354,483,968" in capsys.readouterr().out
