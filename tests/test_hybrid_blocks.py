"""The block options the hybrid families need, as recipe options any recipe can use (§14.9–14.12):
a parallel-mixer layer (Falcon-H1), FFN-only layers (Nemotron-H), and μP multipliers (Granite,
Falcon-H1). Each against its formula written out, and each model decoding from its cache exactly
as it computes whole."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.testing._shared import kv_cache_equivalence, left_padding_equivalence

PARALLEL = ("model.mixer={kind: parallel, mixers: [{kind: attention, heads: 4, kv_heads: 2}, "
            "{kind: mamba2, state: 8, head_dim: 16, groups: 2}], in_multipliers: [0.5, 1.0], "
            "out_multipliers: [2.0, 0.25]}")
FFN_ONLY = ["model.layers=4", "model.layer_types={mixer: {}, ffn: {mixer: none}}", "model.pattern=[mixer, ffn]"]


def test_a_parallel_layer_sums_its_branches_each_scaled_in_and_out():
    """§14.10: out = Σ_i m_out,i · mixer_i(m_in,i · x)."""
    model = seqzoo.build("tiny-llama", [PARALLEL, "model.layers=2"], device="cpu").eval()
    layer = model.decoder.blocks[0].mixer
    attention, ssm = layer.mixers
    assert type(attention).__name__ == "AttentionMixer" and type(ssm).__name__ == "Mamba2"
    x = torch.randn(2, 9, 64)
    context = seqzoo.nn.attention.self_attention_inputs(model.decoder.schemes[model.decoder.layer_scheme[0]],
                                                       torch.arange(9)[None], causal=True)
    with torch.no_grad():
        expected = 2.0 * attention(0.5 * x, context) + 0.25 * ssm(x, context)
        torch.testing.assert_close(layer(x, context), expected)
    names = list(model.state_dict())
    assert "decoder.blocks.0.mixer.mixers.0.qkv_proj.weight" in names
    assert "decoder.blocks.0.mixer.mixers.1.A_log" in names


@pytest.mark.parametrize("overrides", [[PARALLEL], FFN_ONLY, ["model.embedding_multiplier=3.0",
                                                              "model.residual_multiplier=0.5",
                                                              "model.logits_multiplier=0.125"]],
                         ids=["parallel", "ffn-only", "multipliers"])
def test_the_model_decodes_from_its_cache_as_it_computes_whole(overrides):
    model = seqzoo.build("tiny-llama", overrides, device="cpu").eval()
    kv_cache_equivalence(model)
    left_padding_equivalence(model)


def test_an_ffn_only_layer_has_no_mixer_norm_and_adds_only_its_ffn():
    """§14.11: y = x + FFN(n(x)) — no mixer sublayer, no norm for one."""
    model = seqzoo.build("tiny-llama", FFN_ONLY, device="cpu").eval()
    block = model.decoder.blocks[1]
    assert block.mixer.empty and block.mixer_norm is None and not [n for n in model.state_dict()
                                                                   if n.startswith("decoder.blocks.1.mixer")]
    assert model.decoder.residual_branches == 2 * 2 + 2  # two full layers, two FFN-only ones
    x = torch.randn(2, 5, 64)
    context = seqzoo.nn.attention.self_attention_inputs(model.decoder.position, torch.arange(5)[None], causal=True)
    with torch.no_grad():
        torch.testing.assert_close(block(x, context), x + block.ffn(block.ffn_norm(x)))


@pytest.mark.parametrize("override, message", [
    ("model.layer_types={a: {}, b: {mixer: none, ffn: null}}", r"model\.layer_types\.b\.ffn: a layer with mixer none "
                                                                r"needs an ffn"),
    ("model.layer_types={a: {}, b: {mixer: none, residual: parallel}}", r"model\.layer_types\.b\.residual: parallel "
                                                                         r"residuals run a mixer beside the FFN"),
])
def test_a_layer_without_mixer_must_have_an_ffn_in_sequence(override, message):
    with pytest.raises(seqzoo.RecipeError, match=message):
        seqzoo.build("tiny-llama", [override, "model.pattern=[a, b]"], device="meta")


@pytest.mark.parametrize("override, message", [
    ("model.mixer={kind: parallel, mixers: [{kind: attention, heads: 4}]}", r"mixers has 1 branch\(es\); give two"),
    ("model.mixer={kind: parallel, mixers: [{kind: attention, heads: 4}, {kind: mamba2, head_dim: 16}], "
     "out_multipliers: [1.0]}", r"out_multipliers has 1 entries for 2 mixers"),
])
def test_a_malformed_parallel_layer_is_refused(override, message):
    with pytest.raises(seqzoo.RecipeError, match=message):
        seqzoo.build("tiny-llama", [override], device="meta")


def test_the_multipliers_scale_the_embeddings_each_sublayer_and_the_logits():
    """§14.12: h_0 = m_e · E[ids]; h ← h + m_r · F(n(h)) for every sublayer; logits = m_l · W h."""
    plain = seqzoo.build("tiny-llama", ["model.position=none"], device="cpu").eval()
    scaled = seqzoo.build("tiny-llama", ["model.position=none", "model.embedding_multiplier=3.0",
                                         "model.residual_multiplier=0.5", "model.logits_multiplier=0.125"],
                          device="cpu").eval()
    scaled.load_state_dict(plain.state_dict())
    ids = torch.randint(3, 259, (2, 7))
    with torch.no_grad():
        h = plain.embed(ids) * 3.0
        context = seqzoo.nn.attention.self_attention_inputs(plain.decoder.position, torch.arange(7)[None],
                                                           causal=True)
        for block in plain.decoder.blocks:
            h = h + 0.5 * block.mixer(block.mixer_norm(h), context)
            h = h + 0.5 * block.ffn(block.ffn_norm(h))
        expected = 0.125 * plain.lm_head(plain.decoder.final_norm(h))
        torch.testing.assert_close(scaled(ids), expected, atol=1e-5, rtol=1e-5)
        loss = scaled(ids[:, :-1], targets=ids[:, 1:])  # the fused loss sees the scaled logits
        reference = torch.nn.functional.cross_entropy(expected[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        torch.testing.assert_close(loss, reference, atol=1e-5, rtol=1e-5)
