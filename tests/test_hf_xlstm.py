"""xLSTM (xLSTM-7B's layout) against transformers: small random models with configs chosen to
exercise what sets the family apart — q/k heads half as wide as the value heads and value heads
wider than the model (v_dim_factor 1.5), gates soft-capped at 4 and logits at 3 so both caps bite,
gate weights drawn at random (transformers starts them at zero, where a swapped gate goes unseen),
an ε of the mLSTM's denominator ≠ its default, FFN widths by xLSTM-7B's rounding and by another
multiple, 20 tokens (two chunks of 8 and a part) — imported with ``seqzoo.from_hf`` and checked with
the converter kit: logits ≤ 1e-4 in float32, 32 greedy steps with and without the state cache
against transformers' greedy decoding, an exported folder transformers loads with the same logits;
``weight_mode: fused`` checkpoints, the shipped ``xlstm-7b`` recipe's exact parameter count, and the
refusals.

transformers runs its PyTorch mLSTM kernels here (``chunkwise--native_autograd`` for whole chunks,
the native recurrent kernel for the rest and for decoding); its ``xLSTMForCausalLM`` ignores
``attention_mask``, so padding is compared with the row alone rather than with transformers.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

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

V = 96    # vocabulary of every test model
T = 20    # test sequence length: two mLSTM chunks of 8 and 4 tokens more
IDS = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0)
XLSTM = seqzoo.registry().get("converter", "xlstm").cls()

# transformers' from_pretrained patches torch.linspace to a CPU default while it builds; torch caches
# its list of device-aware constructors on first use, so if that use falls in the patch, a later
# `with torch.device("meta")` build leaves linspace on the CPU (the mLSTM's gate start mixes the two).
# Using the cache once here, at collection, fills it with the real torch.linspace.
with torch.device("meta"):
    torch.linspace(0.0, 1.0, 2)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def xlstm(**kw):
    """4 heads over C = 128: q/k heads of 16, v heads of 32 (xLSTM-7B's proportions; widths that
    transformers' xLSTMCache, which rounds them up to 64, holds as they are)."""
    config = {**IDS, "hidden_size": 128, "num_hidden_layers": 3, "num_heads": 4, "chunk_size": 8,
              "gate_soft_cap": 4.0, "output_logit_soft_cap": 3.0, "eps": 1e-3, "norm_eps": 1e-5, **kw}
    model = transformers.xLSTMForCausalLM(transformers.xLSTMConfig(**config))
    with torch.no_grad():  # gates that move and differ by head: transformers zeroes their weights
        for name, parameter in model.named_parameters():
            if re.search(r"[if]gate_preact\.weight$", name):
                parameter.normal_(0.0, 0.3)
    return parity.randomised(model)


MODELS = {
    # C·2.667 rounded up to 64 (xLSTM-7B's FFN rule: 384); 3 blocks
    "xlstm-7b-shape": lambda: xlstm(),
    # C = 96 over 3 heads: q/k 16, v 48 (v_dim_factor 1.5, wider than the model); FFN 2·C rounded to
    # 16 (192); transformers' cache would round q/k to 64, so its config says use_cache false
    "xlstm-wide-values": lambda: xlstm(hidden_size=96, num_heads=3, v_dim_factor=1.5, ffn_proj_factor=2.0,
                                       ffn_round_up_to_multiple_of=16, num_hidden_layers=2, use_cache=False),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    return parity.cached_imports(lambda name: MODELS[name](), tmp_path_factory)


def fused_copy(folder: Path, target: Path) -> Path:
    """A copy of a ``weight_mode: single`` folder as ``fused`` stores it: [q; k; v; ogate] as
    ``qkv_opreact``, [igate; fgate] as ``ifgate_preact``, [gate; up] as ``proj_up_gate_z``.
    (transformers 5.25 cannot build a fused model itself: its _init_weights mis-sizes the gate bias.)"""
    config = {**json.loads((folder / "config.json").read_text()), "weight_mode": "fused"}
    tensors = load_file(folder / "model.safetensors")
    for i in range(config["num_blocks"]):
        block = f"backbone.blocks.{i}."
        layer = block + "mlstm_layer."
        tensors[layer + "qkv_opreact.weight"] = torch.cat([tensors.pop(f"{layer}{x}.weight")
                                                           for x in ("q", "k", "v", "ogate_preact")])
        for part in ("weight", "bias"):
            tensors[f"{layer}ifgate_preact.{part}"] = torch.cat([tensors.pop(f"{layer}{g}gate_preact.{part}")
                                                                 for g in "if"])
        tensors[block + "ffn.proj_up_gate_z.weight"] = torch.cat([tensors.pop(block + "ffn.proj_up_gate.weight"),
                                                                  tensors.pop(block + "ffn.proj_up.weight")])
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps(config))
    save_file(tensors, target / "model.safetensors")
    return target


# -- parity ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(MODELS))
def test_family_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits (max |Δ| 1.3e-5 and 4.9e-6: float32 rounding, which these random models amplify —
    a 1e-7 relative change of seqzoo's own embeddings moves its logits by 1.7e-5), the exported
    folder, and 32 greedy tokens with and without seqzoo's state cache equal to transformers' greedy
    decoding (with its cache where its config allows one)."""
    pair = imported(name)
    parity.check_logits(pair, T)
    parity.check_export(pair, tmp_path / "out", T)
    parity.check_greedy(pair, pad=0)


def test_transformers_decodes_alike_with_and_without_its_cache(imported):
    """The reference itself: transformers' cached greedy decoding equals its full-forward one."""
    hf = imported("xlstm-7b-shape").hf
    ids, mask = parity.left_padded(V, 8, pad=0)
    assert torch.equal(parity.hf_greedy(hf, ids, mask, 32), parity.hf_greedy(hf, ids, mask, 32, use_cache=False))


def test_padding_leaves_the_state_alone_where_transformers_reads_pads_as_tokens(imported):
    """A left-padded row equals the row alone in seqzoo; transformers' xLSTM ignores the mask, so
    its padded row differs from its row alone (the pads were written into its states)."""
    hf, model, _ = imported("xlstm-7b-shape")
    ids, mask = parity.left_padded(V, T)
    alone = ids[-1:, 3:]
    with torch.no_grad():
        ours, ours_alone = model(ids, attention_mask=mask)[-1, 3:], model(alone)[0]
        theirs, theirs_alone = hf(ids, attention_mask=mask).logits[-1, 3:], hf(alone).logits[0]
    assert parity.max_difference(ours, ours_alone) < parity.TOL
    assert parity.max_difference(ours_alone, theirs_alone) < parity.TOL
    assert parity.max_difference(theirs, theirs_alone) > 1e-3
    new = generate(model, ids, 8, attention_mask=mask, eos_id=None)[-1:, 3:]
    assert torch.equal(new, generate(model, alone, 8, eos_id=None))


@pytest.mark.parametrize("name", list(MODELS))
def test_fused_weights_import_as_the_same_model(imported, name, tmp_path):
    """``weight_mode: fused`` stores the same tensors stacked; imported, it gives the single model's
    logits, and exports as ``single``."""
    pair = imported(name)
    model = seqzoo.from_hf(fused_copy(pair.folder, tmp_path / "fused"))
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        assert parity.max_difference(model(ids), pair.hf(ids).logits) < parity.TOL
    config = json.loads((seqzoo.to_hf(model, tmp_path / "out") / "config.json").read_text())
    assert config["weight_mode"] == "single"


# -- what the recipes and exports say ------------------------------------------------------------------
def test_recipe_reads_the_mlstm_and_the_block(imported):
    m = imported("xlstm-7b-shape").model.recipe["model"]
    assert {k: m["mixer"][k] for k in ("kind", "heads", "head_dim", "value_head_dim", "gate_soft_cap", "norm",
                                       "norm_eps", "eps", "bias", "chunk")} == {
        "kind": "mlstm", "heads": 4, "head_dim": 16, "value_head_dim": 32, "gate_soft_cap": 4.0,
        "norm": "layernorm", "norm_eps": 1e-5, "eps": 1e-3, "bias": False, "chunk": 8}
    assert m["ffn"]["kind"] == "swiglu" and m["ffn"]["hidden"] == 384 and m["ffn"]["bias"] is False
    assert m["norm"] == {"kind": "rmsnorm", "eps": 1e-5} and m["placement"] == "pre"
    assert m["final_softcap"] == 3.0 and m["tie_embeddings"] is False and m["position"]["kind"] == "none"
    m = imported("xlstm-wide-values").model.recipe["model"]
    assert (m["mixer"]["head_dim"], m["mixer"]["value_head_dim"], m["ffn"]["hidden"]) == (16, 48, 192)


@pytest.mark.parametrize("name", list(MODELS))
def test_export_writes_the_widths_transformers_builds_and_a_cache_only_where_it_fits(imported, name, tmp_path):
    hf, model, _ = imported(name)
    config = json.loads((seqzoo.to_hf(model, tmp_path / "out") / "config.json").read_text())
    again = transformers.xLSTMConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    layer, ffn = hf.backbone.blocks[0].mlstm_layer, hf.backbone.blocks[0].ffn
    assert int(again.hidden_size * again.qk_dim_factor) == layer.qk_dim
    assert int(again.hidden_size * again.v_dim_factor) == layer.v_dim
    assert transformers.xLSTMForCausalLM(again).backbone.blocks[0].ffn.up_proj_dim == ffn.up_proj_dim
    assert config["use_cache"] is (name == "xlstm-7b-shape")
    assert config["weight_mode"] == "single" and config["tie_word_embeddings"] is False


def test_tiny_xlstm_exports_as_xlstm(tmp_path):
    """tiny-xlstm (q/k heads of 16: no cache for transformers) is an xLSTM; transformers loads it."""
    model = seqzoo.build("tiny-xlstm", device="cpu").eval()
    out = seqzoo.to_hf(model, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "xlstm" and config["use_cache"] is False
    assert (config["ffn_proj_factor"], config["ffn_round_up_to_multiple_of"]) == (2.667, 64)
    hf = transformers.xLSTMForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(3, 259, (2, 70))  # longer than one chunk of 64
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL


# -- the shipped recipe ------------------------------------------------------------------------------
def test_xlstm_7b_has_transformers_parameter_count_and_is_its_config():
    """xLSTMConfig's defaults are xLSTM-7B's (its docstring names NX-AI/xLSTM-7b): transformers builds
    6,865,424,896 parameters from them on the meta device, seqzoo as many from the shipped recipe,
    which is what the converter makes of that config; ``seqzoo show`` counts it without allocating."""
    with torch.device("meta"):
        reference = transformers.AutoModelForCausalLM.from_config(transformers.xLSTMConfig())
    model = seqzoo.build("xlstm-7b", device="meta")
    count = sum(p.numel() for p in model.parameters())
    assert count == sum(p.numel() for p in reference.parameters()) == 6_865_424_896
    converted = resolve(XLSTM.recipe({})).data["model"]
    ours = model.recipe["model"]
    assert [(p.mixer_spec, p.ffn, p.norm) for p in layer_plan(ours)] == \
        [(p.mixer_spec, p.ffn, p.norm) for p in layer_plan(converted)]
    for key in ("vocab_size", "dim", "layers", "final_softcap", "tie_embeddings", "position"):
        assert ours[key] == converted[key], key
    assert main(["show", "xlstm-7b"]) == 0


# -- refusals ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, match", [
    ({"use_bias": True}, r"config\.json: use_bias True is not supported; .*RMSNorms then carry biases"),
    ({"add_out_norm": False}, r"add_out_norm False is not supported; transformers' xLSTMModel applies out_norm"),
    ({"norm_reduction_force_float32": False}, r"norm_reduction_force_float32 False is not supported"),
    ({"embedding_dim": 64}, r"embedding_dim 64 is not supported; .*equal to hidden_size 128"),
    ({"num_blocks": 2}, r"num_blocks 2 is not supported; .*equal to num_hidden_layers 3"),
    ({"weight_mode": "mixed"}, r"weight_mode 'mixed' is not supported; it must be single or fused"),
    ({"qk_dim_factor": 0.3}, r"qk_dim_factor 0.3 is not supported; int\(hidden_size · qk_dim_factor\) = 38 must"),
    ({"num_heads": 0}, r"num_heads 0 is not supported; it must be a positive integer"),
])
def test_unsupported_config_option_is_refused_in_one_line(imported, tmp_path, change, match):
    parity.check_refused(imported("xlstm-7b-shape").folder, tmp_path / "bad", change, match)


def with_model(recipe: dict, **changes) -> dict:
    return {**recipe, "model": {**recipe["model"], **changes}}


@pytest.mark.parametrize("changes, reason", [
    ({"tie_embeddings": True}, "never ties its head"),
    ({"final_softcap": None}, "model.final_softcap is null"),
    ({"position": "rope"}, "model.position is rope, needs none"),
    ({"ffn": {"kind": "gelu", "hidden": 64}}, "model.ffn is gelu, needs swiglu"),
    ({"norm": {"kind": "layernorm", "eps": 1e-5}}, "model.norm is layernorm, needs rmsnorm"),
    ({"mixer": {"kind": "gla", "heads": 4}}, "model.mixer is gla, needs mlstm"),
    ({"residual_multiplier": 0.5}, "adds its sublayers unscaled"),
    ({"layer_overrides": {1: {"mixer": {"chunk": 16}}}}, "layers differ"),
])
def test_exporter_refuses_what_xlstm_cannot_express(imported, changes, reason):
    recipe = imported("xlstm-7b-shape").model.recipe
    found = XLSTM.accepts(with_model(recipe, **changes))
    assert found is not None and reason in found, found


@pytest.mark.parametrize("mixer, reason", [
    ({"norm": "rmsnorm"}, "a LayerNorm per head and no biases"),
    ({"norm_eps": 1e-3}, "norm_eps must equal model.norm.eps"),
    ({"gate_soft_cap": None}, "gate_soft_cap is null"),
])
def test_exporter_refuses_an_mlstm_xlstm_cannot_express(imported, mixer, reason):
    recipe = imported("xlstm-7b-shape").model.recipe
    found = XLSTM.accepts(with_model(recipe, mixer={**recipe["model"]["mixer"], **mixer}))
    assert found is not None and reason in found, found


def test_export_as_xlstm_of_another_model_says_why():
    with pytest.raises(CheckpointError, match="cannot export as xlstm: model.mixer is attention, needs mlstm"):
        seqzoo.to_hf(seqzoo.build("tiny-llama", device="meta"), "unused", model_type="xlstm")
