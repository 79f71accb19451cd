"""RecurrentGemma against transformers: small random models with configs chosen to exercise what
sets it apart — RG-LRU layers narrower than the model (lru_width ≠ C) among local-attention layers
(the pattern cut short; a window shorter than the sequence), GQA and MQA, q/k/v biases beside the
o_proj bias, RoPE on half and on two fifths of each head, the exact and the tanh GELU, a softcap of
5, (1 + w) norms drawn at random, √C rounded to bfloat16 as transformers applies it, 70 tokens (more
than one 64-token chunk of the RG-LRU scan, and not a multiple of it) — imported with
``seqzoo.from_hf`` and checked with the converter kit (logits ≤ 1e-4 float32, 32 greedy steps with
and without the state cache, an exported folder transformers loads).

Padding: transformers feeds left padding into the recurrent blocks' conv (docs/formulas.md
§15.10), seqzoo does not, so padded batches are checked against the rows alone and greedy
decoding against transformers' on unpadded prompts."""
from __future__ import annotations

import json
import math
import re

import pytest
import torch

import seqzoo
from seqzoo.cli import main
from seqzoo.errors import CheckpointError
from seqzoo.nn.generation import generate
from seqzoo.recipe import resolve
from seqzoo.testing import parity

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.filterwarnings("ignore:.*no tokenizer written")  # random models have none

V = 128   # vocabulary of every test model
T = 70    # test sequence length: one 64-token chunk of the scan and part of the next
IDS = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def rope(theta: float, factor: float) -> dict:
    return {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": factor}


def griffin(**kw):
    # 4 heads of 12 over 2 KV heads; RG-LRU 40 wide in 4 gate blocks of 10; [r, r, a, r, r]
    config = {**IDS, "hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2, "lru_width": 40,
              "num_hidden_layers": 5, "intermediate_size": 60, "attention_window_size": 8, "attention_bias": True,
              "conv1d_width": 3, "logits_soft_cap": 5.0, "tie_word_embeddings": False,
              "rope_parameters": rope(5000.0, 0.5), **kw}
    return parity.randomised(transformers.RecurrentGemmaForCausalLM(transformers.RecurrentGemmaConfig(**config)))


MODELS = {
    # the layout above: GQA, q/k/v biases, an untied head, √48 → 6.9375 in bfloat16
    "griffin": lambda: griffin(),
    # [recurrent, attention] ×2: MQA over 4 heads of 10 (√40 → 6.3125), two fifths of each head
    # rotated, the exact GELU, the RG-LRU as wide as the model, conv 4, a tied head, the default cap
    "griffin-mqa": lambda: griffin(hidden_size=40, num_key_value_heads=1, lru_width=None, num_hidden_layers=4,
                                   block_types=["recurrent", "attention"], attention_bias=False, conv1d_width=4,
                                   hidden_activation="gelu", tie_word_embeddings=True, logits_soft_cap=30.0,
                                   attention_window_size=16, rope_parameters=rope(1e4, 0.4)),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    return parity.cached_imports(lambda name: MODELS[name](), tmp_path_factory)


@pytest.mark.parametrize("name", MODELS)
def test_family_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits, the export (picked by itself), and 32 greedy steps of an unpadded batch with and
    without seqzoo's state cache, equal to transformers' cached greedy decoding."""
    pair = imported(name)
    parity.check_logits(pair, T)
    out = parity.check_export(pair, tmp_path / "out", T)
    assert json.loads((out / "config.json").read_text())["model_type"] == "recurrent_gemma"
    parity.check_greedy(pair, pad=0)


@pytest.mark.parametrize("name", MODELS)
def test_a_left_padded_row_equals_the_row_alone(imported, name):
    """seqzoo's recurrent blocks keep padding out of the conv and the scan and reset at each row's
    first real token; transformers' conv reads the padding (only its reset at position 0 cuts the
    recurrence), so its padded row differs from the row alone."""
    pair = imported(name)
    ids, mask = parity.left_padded(V, T, pad=5)
    alone = ids[-1:, 5:]
    with torch.no_grad():
        ours, ours_alone = pair.model(ids, attention_mask=mask)[-1, 5:], pair.model(alone)[0]
        theirs_alone = pair.hf(alone).logits[0]
        theirs = pair.hf(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[-1, 5:]
    assert parity.max_difference(ours, ours_alone) < parity.TOL
    assert parity.max_difference(ours_alone, theirs_alone) < parity.TOL
    assert parity.max_difference(theirs, theirs_alone) > 1e-3  # transformers' leak, not seqzoo's
    steps = generate(pair.model, ids, 8, attention_mask=mask, eos_id=None)
    assert torch.equal(steps[-1:, 5:], generate(pair.model, alone, 8, eos_id=None))


# -- what the imported recipes say -------------------------------------------------------------------
def test_recipe_reads_layers_attention_and_the_recurrent_blocks(imported):
    m = imported("griffin").model.recipe["model"]
    assert m["layer_types"] == {"recurrent": {}, "attention": {"mixer": "attention"}}
    assert m["pattern"] == ["recurrent", "recurrent", "attention"] and not m["layer_overrides"]  # over 5 layers
    assert {k: m["mixer"][k] for k in ("kind", "heads", "width", "conv", "conv_bias", "bias", "c", "approximate")} == {
        "kind": "rg_lru", "heads": 4, "width": 40, "conv": 3, "conv_bias": True, "bias": True, "c": 8.0,
        "approximate": "tanh"}
    attn = m["attention"]
    assert (attn["heads"], attn["kv_heads"], attn["bias"], attn["out_bias"], attn["window"]) == (4, 2, True, True, 8)
    assert m["position"]["rotary_dim"] == 6 and m["position"]["base"] == 5000.0
    assert m["ffn"] == {**m["ffn"], "kind": "geglu", "hidden": 30, "bias": True, "approximate": "tanh"}
    assert m["norm"]["kind"] == "gemma_rmsnorm" and m["final_softcap"] == 5.0 and m["tie_embeddings"] is False
    m = imported("griffin-mqa").model.recipe["model"]
    assert m["pattern"] == ["recurrent", "attention"] and m["mixer"]["width"] is None
    assert m["mixer"]["approximate"] == m["ffn"]["approximate"] == "none" and m["position"]["rotary_dim"] == 4
    assert m["attention"]["kv_heads"] == 1 and m["attention"]["bias"] is False and m["tie_embeddings"] is True


@pytest.mark.parametrize("name, dim, scale", [("griffin", 48, 6.9375), ("griffin-mqa", 40, 6.3125)])
def test_embeddings_are_scaled_by_the_bfloat16_root_as_transformers_does(imported, name, dim, scale):
    """transformers' normalizer is √C in bfloat16 even in a float32 model: the recipe multiplies by
    that value (scale_embeddings would use √C itself, and miss by 0.1–0.2 %)."""
    hf, model, _ = imported(name)
    m = model.recipe["model"]
    assert hf.model.normalizer.item() == scale == m["embedding_multiplier"] != math.sqrt(dim)
    assert m["scale_embeddings"] is False
    rooted = seqzoo.build(resolve({**model.recipe, "model": {**m, "scale_embeddings": True,
                                                                "embedding_multiplier": 1.0}}).data, device="cpu")
    rooted.load_state_dict(model.state_dict())
    ids = torch.randint(V, (1, 12))
    with torch.no_grad():
        assert parity.max_difference(rooted.eval()(ids), hf(ids).logits) > 1e-4
    converter = seqzoo.registry().get("converter", "recurrent_gemma").cls()
    assert f"model.embedding_multiplier must be {scale}" in converter.accepts(rooted.recipe)


# -- exports -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_export_writes_the_block_types_widths_and_rotary_fraction(imported, name, tmp_path):
    hf, model, _ = imported(name)
    config = json.loads((seqzoo.to_hf(model, tmp_path / "out") / "config.json").read_text())
    c = hf.config
    assert config["block_types"] == c.block_types and config["intermediate_size"] == c.intermediate_size
    assert config["lru_width"] == c.lru_width and config["attention_window_size"] == c.attention_window_size
    assert config["rope_parameters"] == c.rope_parameters and config["hidden_activation"] == c.hidden_activation
    assert "max_position_embeddings" not in config


def test_tiny_griffin_exports_to_recurrent_gemma(tmp_path):
    """The shipped tiny-griffin recipe is a RecurrentGemma (C = 64: √C = 8 is exact in bfloat16, so
    its scale_embeddings is transformers' scale): it exports by itself and transformers computes its
    logits, past its window of 16 and a scan chunk."""
    model = seqzoo.build("tiny-griffin", device="cpu").eval()
    out = seqzoo.to_hf(model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["model_type"] == "recurrent_gemma"
    hf = transformers.RecurrentGemmaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(3, 259, (2, 70))
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL


# -- refusals ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, match", [
    ({"hidden_activation": "silu"}, r"hidden_activation 'silu' is not supported; the recurrent blocks gate with it"),
    ({"lru_width": 42}, r"lru_width 42 is not supported; it must be divisible by num_attention_heads = 4"),
    ({"head_dim": 16}, r"head_dim 16 is not supported; transformers makes it hidden_size / num_attention_heads = 12"),
    ({"block_types": ["recurrent", "mlp"]}, r"block_types \['recurrent', 'mlp'\] is not supported; it must list "
                                            r"recurrent or attention entries"),
    ({"_block_types": ["recurrent", "attention"]}, r"_block_types .* disagrees with block_types"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}},
     r"rope_type 'linear' is not supported; supported: default"),
    ({"rope_parameters": rope(1e4, 0.3)}, r"partial_rotary_factor 0.3 rotates 3 of head_dim 12"),
    ({"attention_window_size": 0}, r"attention_window_size 0 is not supported; it must be a positive integer"),
    ({"logits_soft_cap": None}, r"logits_soft_cap None is not supported; it must be a positive number"),
])
def test_unsupported_config_option_is_refused_in_one_line(imported, tmp_path, change, match):
    parity.check_refused(imported("griffin").folder, tmp_path / "bad", change, match)


def with_model(recipe: dict, **changes) -> dict:
    return {**recipe, "model": {**recipe["model"], **changes}}


@pytest.mark.parametrize("change, match", [
    (lambda m: {"mixer": "short_conv"}, r"layers use \['attention', 'short_conv'\]; RecurrentGemma's are rg_lru"),
    (lambda m: {"mixer": {**m["mixer"], "heads": 2}}, r"as many heads as the attention, c = 8"),
    (lambda m: {"mixer": {**m["mixer"], "approximate": "none"}}, r"and the MLP's GELU"),
    (lambda m: {"layer_overrides": {3: {"mixer": {"conv": 4}}}}, r"the rg_lru layers differ"),
    (lambda m: {"layer_types": {"recurrent": {}, "attention": {"mixer": "attention", "ffn": {"hidden": 16}}}},
     r"differ only in their mixer"),
    (lambda m: {"ffn": {"kind": "swiglu", "hidden": 30}}, r"model.ffn must be a geglu with biases"),
    (lambda m: {"norm": {"kind": "rmsnorm", "eps": 1e-6}}, r"model.norm is rmsnorm, needs gemma_rmsnorm"),
    (lambda m: {"attention": {**m["attention"], "window": None}}, r"window is null; RecurrentGemma's attention is"),
    (lambda m: {"attention": {**m["attention"], "out_bias": False}}, r"o_proj always has a bias"),
    (lambda m: {"attention": {**m["attention"], "head_dim": 16}}, r"head_dim must be dim / heads"),
    (lambda m: {"attention": {**m["attention"], "qk_norm": "rmsnorm"}}, r"no QK-norm, softcap, sinks or output gate"),
    (lambda m: {"final_softcap": None}, r"soft-caps its logits"),
    (lambda m: {"embedding_multiplier": 1.0}, r"embedding_multiplier must be 6.9375"),
    (lambda m: {"position": {"kind": "rope", "base": 1e4, "scaling": {"kind": "linear", "factor": 2.0}}},
     r"has no HF rope_type"),
])
def test_exporter_refuses_what_the_family_cannot_express(imported, change, match):
    recipe = imported("griffin").model.recipe
    converter = seqzoo.registry().get("converter", "recurrent_gemma").cls()
    problem = converter.accepts(resolve(with_model(recipe, **change(recipe["model"]))).data)
    assert problem is not None and re.search(match, problem), problem


def test_a_stack_without_recurrent_gemmas_layout_is_not_exported_as_it():
    with pytest.raises(CheckpointError, match="cannot export as recurrent_gemma: model.mixer: layers use"):
        seqzoo.to_hf(seqzoo.build("tiny-lfm2", device="meta"), "unused", model_type="recurrent_gemma")


# -- the shipped recipe ------------------------------------------------------------------------------
#: recurrentgemma-2b's config.json as the checkpoint writes it (transformers 4's keys and all).
RECURRENTGEMMA_2B = {"model_type": "recurrent_gemma", "vocab_size": 256000, "hidden_size": 2560,
                     "intermediate_size": 15360, "num_hidden_layers": 26, "num_attention_heads": 10,
                     "num_key_value_heads": 1, "head_dim": 256, "lru_width": 2560, "attention_window_size": 2048,
                     "conv1d_width": 4, "logits_soft_cap": 30.0, "rms_norm_eps": 1e-6,
                     "hidden_activation": "gelu_pytorch_tanh", "partial_rotary_factor": 0.5, "rope_theta": 10000.0,
                     "_block_types": ["recurrent", "recurrent", "attention"], "attention_bias": False,
                     "embeddings_scale_by_sqrt_dim": True, "final_w_init_variance_scale": 2 / 26,
                     "w_init_variance_scale": 0.01, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}


def recurrentgemma_2b_config():
    return transformers.RecurrentGemmaConfig(**{k: v for k, v in RECURRENTGEMMA_2B.items()
                                                if k not in ("model_type", "head_dim", "final_w_init_variance_scale")})


def test_shipped_recipe_is_the_converters_recipe_of_the_checkpoint_config():
    converter = seqzoo.registry().get("converter", "recurrent_gemma").cls()
    for config in (RECURRENTGEMMA_2B, recurrentgemma_2b_config().to_dict()):  # as written, as transformers saves it
        theirs = resolve({**converter.recipe(config), "tokenizer": "bytes"}).data["model"]
        assert resolve("recurrentgemma-2b").data["model"] == theirs


def test_recurrentgemma_2b_has_the_parameters_of_transformers_model(capsys):
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(recurrentgemma_2b_config())
    ours = seqzoo.build("recurrentgemma-2b", device="meta")
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters()) == 2_682_862_080
    assert main(["show", "recurrentgemma-2b"]) == 0
    assert "parameters: 2,682,862,080" in capsys.readouterr().out
