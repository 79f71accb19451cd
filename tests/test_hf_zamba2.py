"""Zamba2 (``zamba2``) against transformers: small random models chosen to exercise what sets the
family apart — Mamba-2 layers (6 heads of 8 in 2 groups, SSD chunks of 8 crossed by every T = 20
sequence) and hybrid layers that first run a shared attention + MLP block on [x; e] (docs/formulas.md
§14.13): two blocks round-robin over three hybrid layers, q/k/v and gate_up LoRA adapters of rank 3
per site, RoPE on heads of 2C / H with the logit scale (D / 2)^-½, GQA (4 heads over 2) where
transformers allows it (without q/k/v adapters), MLP and Mamba biases, random norms, biases and A / D
/ Δ-bias — imported with ``seqzoo.from_hf`` and checked with the converter kit: logits ≤ 1e-4 plain
and left-padded (measured ≤ 4e-6), 32 greedy steps with and without the state cache, an exported
folder transformers loads with the same logits.

transformers clamps Δ below at ``time_step_min`` in its chunked scan but not in its decode step, so
where the clamp binds its cached decoding departs from its own full forward; the reference for
seqzoo's decoding, cached and not, is transformers' uncached generation (a full forward per step).
With ``add_bias_linear`` transformers zeroes padding before the Mamba in_proj, whose bias its conv then
carries into the first real tokens (as for Mamba-2); that model is compared unpadded.
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

V, T = 128, 20
IDS = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0)
ZAMBA2 = seqzoo.registry().get("converter", "zamba2").cls()
KINDS = ["mamba", "hybrid", "mamba", "hybrid", "hybrid", "mamba"]


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def zamba2(**kw):
    # C = 24; Mamba-2: 6 heads of 8, 2 groups, state 8, chunk 8; the shared attention reads 48: 4 heads
    # of 12; MLP 20; two blocks over the hybrid layers 1, 3, 4 (blocks 0, 1, 0); adapters of rank 3
    config = {**IDS, "hidden_size": 24, "num_hidden_layers": len(kw.get("layers_block_type", KINDS)),
              "layers_block_type": KINDS, "num_attention_heads": 4, "n_mamba_heads": 6, "mamba_d_state": 8,
              "mamba_ngroups": 2, "chunk_size": 8, "intermediate_size": 20, "num_mem_blocks": 2,
              "use_shared_attention_adapter": True, "adapter_rank": 3, "use_mem_rope": True,
              "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}, "max_position_embeddings": 64,
              "initializer_range": 0.1, **kw}
    model = transformers.Zamba2ForCausalLM(transformers.Zamba2Config(**config))
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # A_log, D and Δ bias start at fixed values
            if name.endswith(("A_log", ".D", "dt_bias")):
                parameter.add_(0.3 * torch.randn_like(parameter))
    return parity.randomised(model)


MODELS = {
    "zamba2": lambda: zamba2(),
    # one block, no q/k/v adapters, so GQA (4 heads over 2); no RoPE; SwiGLU; Δ clamped below at 0.7,
    # where about half the initial Δ lie, and where transformers' decode step does not clamp
    "zamba2-gqa": lambda: zamba2(num_key_value_heads=2, use_shared_attention_adapter=False, use_mem_rope=False,
                                 num_mem_blocks=1, hidden_act="silu", time_step_min=0.7, time_step_max=1.0,
                                 layers_block_type=["hybrid", "mamba", "mamba", "hybrid"]),
    # biases on the Mamba projections and the MLP (add_bias_linear), tanh GELU, three blocks
    "zamba2-bias": lambda: zamba2(add_bias_linear=True, hidden_act="gelu_pytorch_tanh", num_mem_blocks=3),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    return parity.cached_imports(lambda name: MODELS[name](), tmp_path_factory)


def check_greedy_against_full_forward(pair, pad: int = 2) -> None:
    ids, mask = parity.left_padded(V, 8, pad=pad)
    theirs = parity.hf_greedy(pair.hf, ids, mask, 32, use_cache=False)
    for use_cache in (True, False):
        ours = generate(pair.model, ids, 32, attention_mask=mask, eos_id=None, use_cache=use_cache)
        assert torch.equal(ours, theirs), f"use_cache={use_cache}"


@pytest.mark.parametrize("name", ["zamba2", "zamba2-gqa"])
def test_family_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    pair = imported(name)
    assert parity.check_logits(pair, T) < 1e-5
    assert parity.check_padded_logits(pair, T) < 1e-5
    parity.check_export(pair, tmp_path / "out", T)
    check_greedy_against_full_forward(pair)


def test_transformers_cached_decoding_skips_the_clamp_its_full_forward_applies(imported):
    """Why the reference is the full forward: with Δ clamped at 0.7, transformers' cached step
    departs from its own full forward; seqzoo's cached step does not."""
    pair = imported("zamba2-gqa")
    ids = torch.randint(3, V, (2, 12))
    with torch.no_grad():
        full = pair.hf(ids).logits[:, -1]
        prefix = pair.hf(ids[:, :-1], use_cache=True)
        step = pair.hf(ids[:, -1:], cache=prefix.cache, use_cache=True).logits[:, -1]
        cache = pair.model.new_cache(2, 12)
        pair.model(ids[:, :-1], cache=cache)
        ours = pair.model(ids[:, -1:], cache=cache)[:, -1]
    assert parity.max_difference(step, full) > 1e-3
    assert parity.max_difference(ours, full) < 1e-5


def test_biases_match_transformers_unpadded(imported, tmp_path):
    pair = imported("zamba2-bias")
    parity.check_logits(pair, T)
    parity.check_export(pair, tmp_path / "out", T)
    check_greedy_against_full_forward(pair, pad=0)


# -- what the imported recipes say -------------------------------------------------------------------
def test_recipe_runs_the_blocks_round_robin_with_zamba2s_attention(imported):
    m = imported("zamba2").model.recipe["model"]
    assert m["pattern"] == ["mamba", "hybrid", "mamba", "hybrid_1", "hybrid"]
    assert m["layer_types"] == {"mamba": {}, "hybrid": {"shared_block": 0}, "hybrid_1": {"shared_block": 1}}
    assert [p.shared_block for p in layer_plan(m)] == [None, 0, None, 1, 0, None]
    block = m["shared_blocks"][0]
    assert m["shared_blocks"] == [block, block] and block["concat_embeddings"] is True
    assert block["adapters"] == ["q", "k", "v", "ffn"] and block["adapter_rank"] == 3
    attention = block["attention"]
    assert (attention["heads"], attention["kv_heads"], attention["head_dim"]) == (4, 4, 12)  # 2C / H
    assert attention["score"] == {"kind": "scaled_dot", "scale": 6 ** -0.5}  # (D / 2)^-½
    assert block["position"] == {**block["position"], "kind": "rope", "base": 500.0}
    assert block["ffn"] == {**block["ffn"], "kind": "geglu", "hidden": 20, "approximate": "none"}
    assert m["position"]["kind"] == "none" and m["ffn"] is None
    mixer = m["mixer"]
    assert (mixer["head_dim"], mixer["groups"], mixer["norm_eps"], mixer["dt_limit"]) == (8, 2, 1e-5, [0.001, 65504.0])
    gqa = imported("zamba2-gqa").model.recipe["model"]
    assert gqa["shared_blocks"][0]["adapters"] == ["ffn"] and gqa["shared_blocks"][0]["position"] is None
    assert gqa["shared_blocks"][0]["attention"]["kv_heads"] == 2 and gqa["shared_blocks"][0]["ffn"]["kind"] == "swiglu"


def test_each_site_keeps_its_adapters_and_transformers_linear(imported):
    hf, model, _ = imported("zamba2")
    theirs = hf.model.layers[4]  # the third hybrid layer: block 0 again, adapters at index 2
    site = model.decoder.blocks[4].site
    assert site.block == 0
    assert torch.equal(site.proj.weight, theirs.linear.weight)
    adapter = theirs.shared_transformer.self_attn.linear_k_adapter_list[2]
    assert torch.equal(site.adapters["k"].down.weight, adapter[0].weight)
    assert torch.equal(site.adapters["ffn"].up.weight, theirs.shared_transformer.feed_forward.
                       gate_up_proj_adapter_list[2][1].weight)
    assert len(model.decoder.shared_blocks) == 2


def test_a_checkpoint_storing_the_block_at_every_site_loads_and_its_copies_must_agree(imported, tmp_path):
    """transformers' own state_dict (and older checkpoints) hold each block at every site it serves;
    save_pretrained keeps the first. The copies are read as the one block, and must equal it."""
    hf, _, folder = imported("zamba2")
    config = json.loads((folder / "config.json").read_text())
    copies = {n: t.clone() for n, t in hf.state_dict().items() if n.startswith("model.layers.4.shared_transformer.")}
    model = seqzoo.from_hf(parity.edited_copy(folder, tmp_path / "all", config, extra=copies))
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL
    name = "model.layers.4.shared_transformer.self_attn.linear_q_adapter_list.2.1.weight"
    copies[name] = copies[name] + 1.0
    with pytest.raises(CheckpointError, match=re.escape(name) + r" differs from model\.layers\.1\."):
        seqzoo.from_hf(parity.edited_copy(folder, tmp_path / "differs", config, extra=copies))


# -- refusals ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, match", [
    ({"layers_block_type": ["mamba", "attention", "mamba", "hybrid", "hybrid", "mamba"]},
     r"config\.json: layers_block_type .* is not supported; each layer must be one of mamba, linear_attention, hybrid"),
    ({"num_key_value_heads": 2}, r"config\.json: use_shared_attention_adapter True is not supported; its q/k/v "
                                 r"adapters write 2·hidden_size features"),
    ({"time_step_min": 0.0}, r"config\.json: time_step_min 0\.0 is not supported; it must be a positive number"),
    ({"hidden_act": "swiglu"}, r"config\.json: hidden_act: activation 'swiglu' has no seqzoo equivalent"),
    ({"n_mamba_heads": 5}, r"config\.json: n_mamba_heads 5 × mamba_headdim 9 = 45 must equal mamba_expand·hidden_size"),
])
def test_a_config_seqzoo_cannot_express_is_refused(imported, tmp_path, change, match):
    parity.check_refused(imported("zamba2").folder, tmp_path / "edited", change, match)


def with_model(recipe: dict, **changes) -> dict:
    return resolve({**recipe, "model": {**recipe["model"], **changes}}).data


def with_block(recipe: dict, **changes) -> dict:
    block = recipe["model"]["shared_blocks"][0]
    return with_model(recipe, shared_blocks=[{**block, **changes}] * len(recipe["model"]["shared_blocks"]))


@pytest.mark.parametrize("edit, match", [
    (lambda r: with_block(r, concat_embeddings=False), r"concat_embeddings is false; Zamba2's block reads \[x; e\]"),
    (lambda r: with_block(r, adapters=["q", "ffn"]), r"adapters \['ffn', 'q'\]: Zamba2 adapts the MLP, and q, k and v"),
    (lambda r: with_block(r, attention={**r["model"]["shared_blocks"][0]["attention"], "score": "scaled_dot"}),
     r"score: Zamba2's is scaled_dot with scale \(head_dim / 2\)\^-0\.5"),
    (lambda r: with_block(r, ffn={"kind": "gelu", "hidden": 20}), r"ffn: Zamba2's MLP is gated"),
    (lambda r: with_model(r, pattern=["mamba", "hybrid_1", "mamba", "hybrid", "hybrid"]),
     r"runs its 2 shared block\(s\) round-robin over the hybrid layers"),
    (lambda r: with_model(r, mixer={**r["model"]["mixer"], "dt_limit": None}),
     r"model\.mixer\.dt_limit None: Zamba2 clamps Δ below only, at time_step_min > 0"),
    (lambda r: with_model(r, mixer={**r["model"]["mixer"], "norm_eps": 1e-6}), r"norm_eps 1e-06 must be 1e-05"),
    (lambda r: with_model(r, layer_types={**r["model"]["layer_types"], "mamba": {"residual_multiplier": 2.0}}),
     r"Zamba2's layers differ only in their shared block"),
])
def test_exporter_refuses_what_zamba2_cannot_hold(imported, edit, match):
    recipe = edit(imported("zamba2").model.recipe)
    reason = ZAMBA2.accepts(recipe)
    assert reason is not None and re.search(match, reason), reason


def test_a_model_without_shared_blocks_is_not_exported_as_zamba2():
    model = seqzoo.build("tiny-mamba2", device="meta")
    assert ZAMBA2.accepts(model.recipe) == "model.shared_blocks: none; Zamba2's hybrid layers run a shared block"
    with pytest.raises(CheckpointError, match="cannot export as zamba2"):
        seqzoo.to_hf(model, "unused", model_type="zamba2")


# -- the shipped recipe ------------------------------------------------------------------------------
#: Zamba2-1.2B's architecture (Zyphra/Zamba2-1.2B), as the recipe's comment says.
ZAMBA2_1_2B = {
    "vocab_size": 32000, "hidden_size": 2048, "num_hidden_layers": 38,
    "layers_block_type": (["mamba"] * 5 + ["hybrid"]) * 6 + ["mamba"] * 2, "num_attention_heads": 32,
    "num_key_value_heads": 32, "intermediate_size": 8192, "hidden_act": "gelu", "mamba_d_state": 128,
    "n_mamba_heads": 64, "mamba_ngroups": 1, "mamba_d_conv": 4, "mamba_expand": 2, "chunk_size": 256,
    "num_mem_blocks": 1, "use_shared_attention_adapter": True, "adapter_rank": 128, "use_mem_rope": True,
    "rope_theta": 10000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "add_bias_linear": False,
    "use_conv_bias": True, "time_step_min": 0.001, "tie_word_embeddings": True,
}


def test_zamba2_1_2b_has_transformers_parameter_count_and_is_its_config():
    """The shipped recipe builds on the meta device to the count transformers gives the config
    (1,215,064,704), and is what the converter makes of it, layer by layer."""
    with torch.device("meta"):
        reference = transformers.AutoModelForCausalLM.from_config(transformers.Zamba2Config(**ZAMBA2_1_2B))
    model = seqzoo.build("zamba2-1.2b", device="meta")
    count = sum(p.numel() for p in model.parameters())
    assert count == sum(p.numel() for p in reference.parameters()) == 1_215_064_704
    converted = resolve(ZAMBA2.recipe(ZAMBA2_1_2B)).data["model"]
    shipped = model.recipe["model"]
    ours, theirs = layer_plan(shipped), layer_plan(converted)
    assert [(p.mixer_spec, p.shared_block, p.norm) for p in ours] == [(p.mixer_spec, p.shared_block, p.norm)
                                                                       for p in theirs]
    assert shipped["shared_blocks"] == converted["shared_blocks"] and ZAMBA2.accepts(model.recipe) is None


def test_zamba2_1_2b_shrunk_exports_and_loads_in_transformers(tmp_path):
    """The shipped recipe's layout (38 layers, a hybrid one every sixth) at a test width, exported,
    is a Zamba2ForCausalLM with the same logits."""
    block = ("model.shared_blocks=[{attention: {heads: 2, kv_heads: 2, head_dim: 16, score: {kind: scaled_dot, "
             "scale: 0.3535533905932738}, bias: false, out_bias: false}, ffn: {kind: geglu, hidden: 24}, position: "
             "{kind: rope, base: 10000.0}, concat_embeddings: true, adapters: [q, k, v, ffn], adapter_rank: 4}]")
    model = seqzoo.build("zamba2-1.2b", ["model.vocab_size=300", "model.dim=16", "model.mixer.head_dim=8",
                                         "model.mixer.state=4", "model.mixer.chunk=8", block, "runtime.dtype=float32"],
                         device="cpu").eval()
    out = seqzoo.to_hf(model, tmp_path / "out")
    hf = transformers.Zamba2ForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(3, 300, (2, T))
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL


def test_show_counts_zamba2_1_2b_without_allocating(capsys):
    assert main(["show", "zamba2-1.2b"]) == 0
    assert "parameters: 1,215,064,704" in capsys.readouterr().out
