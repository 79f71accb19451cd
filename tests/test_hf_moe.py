"""The mixture-of-experts families against transformers: small random models with configs chosen
to exercise routing — top-k > 1, more experts than the batch has tokens (so some receive none),
odd head counts and GQA, windows shorter than the sequence, dense layers among sparse ones —
imported with ``seqzoo.from_hf`` and checked with the converter kit (logits ≤ 1e-4 float32 plain
and left-padded, 32 greedy steps with and without the KV cache, an exported folder transformers
loads)."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.testing import parity

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.filterwarnings("ignore:.*no tokenizer written")  # random models have none

V = 128   # vocabulary of every test model
T = 20    # test sequence length: longer than every window below
IDS = dict(vocab_size=V, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def mixtral(**kw):
    # 5 heads over 1 kv head (D = 8), 6 experts of width 24, 2 per token, 3 layers
    config = {**IDS, "hidden_size": 40, "num_attention_heads": 5, "num_key_value_heads": 1, "num_hidden_layers": 3,
              "intermediate_size": 24, "num_local_experts": 6, "num_experts_per_tok": 2, **kw}
    return parity.randomised(transformers.MixtralForCausalLM(transformers.MixtralConfig(**config)))


def qwen3_moe(**kw):
    config = {**IDS, "hidden_size": 40, "num_attention_heads": 5, "num_key_value_heads": 1, "head_dim": 8,
              "num_hidden_layers": 4, "intermediate_size": 24, "moe_intermediate_size": 16, "num_experts": 6,
              "num_experts_per_tok": 2, **kw}
    return parity.randomised(transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**config)))


def qwen2_moe(**kw):
    config = {**IDS, "hidden_size": 40, "num_attention_heads": 5, "num_key_value_heads": 5, "num_hidden_layers": 3,
              "intermediate_size": 24, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 20,
              "num_experts": 6, "num_experts_per_tok": 2, **kw}
    return parity.randomised(transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(**config)))


def olmoe(**kw):
    config = {**IDS, "hidden_size": 40, "num_attention_heads": 5, "num_key_value_heads": 1, "num_hidden_layers": 3,
              "intermediate_size": 16, "num_experts": 6, "num_experts_per_tok": 3, **kw}
    return parity.randomised(transformers.OlmoeForCausalLM(transformers.OlmoeConfig(**config)))


def deepseek_v3(**kw):
    # MLA: 3 heads, a 12-wide query latent, a 10-wide KV latent, d_nope 6, d_rope 4, d_v 5; 8 routed
    # experts in 4 groups (2 kept), 2 per token, a shared expert; layer 0 dense
    config = {**IDS, "hidden_size": 40, "num_attention_heads": 3, "num_key_value_heads": 3, "num_hidden_layers": 3,
              "q_lora_rank": 12, "kv_lora_rank": 10, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4, "v_head_dim": 5,
              "intermediate_size": 24, "moe_intermediate_size": 8, "n_routed_experts": 8, "num_experts_per_tok": 2,
              "n_group": 4, "topk_group": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, **kw}
    model = parity.randomised(transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**config)))
    with torch.no_grad():  # a selection bias that changes choices (zeros as initialised would not)
        for layer in model.model.layers[config["first_k_dense_replace"]:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.5)
    return model


def gpt_oss(**kw):
    # 4 heads of 8 over 2 kv heads, sinks, windows of 6 on layers 0 and 2, 6 experts of 16, top-2
    config = {**IDS, "hidden_size": 40, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
              "num_hidden_layers": 3, "intermediate_size": 16, "num_local_experts": 6, "num_experts_per_tok": 2,
              "sliding_window": 6, "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                        "original_max_position_embeddings": 16, "truncate": False,
                                                        "beta_fast": 32.0, "beta_slow": 1.0}, **kw}
    model = parity.randomised(transformers.GptOssForCausalLM(transformers.GptOssConfig(**config)))
    with torch.no_grad():  # sinks start at zero logits; expert weights large enough to reach the clamps
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
            layer.mlp.experts.gate_up_proj.normal_(0.0, 2.0)
    return model


def jamba(**kw):
    # [mamba + experts, attention, mamba + experts, attention]: 4 heads over 2 (D = 8), 6 experts
    config = {**IDS, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4,
              "intermediate_size": 16, "num_experts": 6, "num_experts_per_tok": 2, "attn_layer_period": 2,
              "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 0, "mamba_d_state": 8, **kw}
    return parity.randomised(transformers.JambaForCausalLM(transformers.JambaConfig(**config)))


MODELS = {
    "mixtral": lambda: mixtral(),
    # a window of 6 < T; 48 experts for the 40 tokens of a test batch, 3 per token: some get none
    "mixtral-window-many-experts": lambda: mixtral(sliding_window=6, num_local_experts=48, num_experts_per_tok=3,
                                                   intermediate_size=8, tie_word_embeddings=True),
    # layer 1 dense among sparse ones (mlp_only_layers), unnormalised top-2, 5 heads over 1, D = 8
    "qwen3_moe-dense-layer": lambda: qwen3_moe(mlp_only_layers=[1]),
    # every other layer sparse (decoder_sparse_step 2), renormalised top-3 of 48 experts, tied head
    "qwen3_moe-step-many-experts": lambda: qwen3_moe(decoder_sparse_step=2, norm_topk_prob=True, num_experts=48,
                                                     num_experts_per_tok=3, moe_intermediate_size=8,
                                                     tie_word_embeddings=True),
    # q/k/v biases, a sigmoid-gated shared expert beside the routed ones
    "qwen2_moe-shared": lambda: qwen2_moe(),
    # whole-projection QK-norm, top-3 of 6 unnormalised, 5 heads over 1
    "olmoe": lambda: olmoe(),
    # renormalised, with attention biases and linear RoPE scaling
    # the latent attention with a low-rank query, interleaved RoPE, group-limited sigmoid routing
    "deepseek_v3": lambda: deepseek_v3(),
    # no query latent, rotate-half RoPE, YaRN with mscale (the softmax scale's m²), two dense
    # layers first, no renormalisation, a scale of 2.5, attention biases, tied head
    "deepseek_v3-yarn-plain-query": lambda: deepseek_v3(
        q_lora_rank=None, rope_interleave=False, first_k_dense_replace=2, num_hidden_layers=4, norm_topk_prob=False,
        routed_scaling_factor=2.5, attention_bias=True, tie_word_embeddings=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 16}),
    # sinks, windows on layers 0 and 2, YaRN without truncation, clamped SwiGLU experts with biases
    "gpt_oss": lambda: gpt_oss(),
    # 5 layers with full attention at 1 and 4 only, top-3 of 48 experts, tied head
    "gpt_oss-irregular-many-experts": lambda: gpt_oss(
        num_hidden_layers=5, num_local_experts=48, num_experts_per_tok=3, intermediate_size=8, tie_word_embeddings=True,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                     "full_attention"]),
    # Mamba layers with weighted Δ/B/C norms, attention without RoPE, experts every other layer
    "jamba": lambda: jamba(),
    # 6 layers: attention at 2 and 5 (period 3), experts at 1, 3, 5 (period 2, offset 1), top-3 of 8,
    # a conv kernel of 3 without a bias, dt_rank 3, a tied head
    "jamba-periods": lambda: jamba(num_hidden_layers=6, attn_layer_period=3, attn_layer_offset=2,
                                   expert_layer_offset=1, num_experts=8, num_experts_per_tok=3, mamba_d_conv=3,
                                   mamba_conv_bias=False, mamba_dt_rank=3, tie_word_embeddings=True),
    "olmoe-normalised-bias": lambda: olmoe(norm_topk_prob=True, attention_bias=True,
                                           rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                            "factor": 2.0}),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    return parity.cached_imports(lambda name: MODELS[name](), tmp_path_factory)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_family_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    parity.check_causal_lm(imported(name), tmp_path / "out", T)


def test_some_experts_get_no_token_in_the_many_experts_model(imported):
    model = imported("mixtral-window-many-experts").model
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        tokens = model.decoder.blocks[0].ffn  # the first layer's routing of its inputs
        hidden = model.embed(ids)
        chosen = tokens.router(model.decoder.blocks[0].ffn_norm(hidden).reshape(-1, 40)).experts
    assert len(set(chosen.flatten().tolist())) < 48


def test_mixtral_recipe_reads_as_a_mixture_of_swiglu_experts(imported):
    m = imported("mixtral").model.recipe["model"]
    assert m["ffn"]["kind"] == "moe" and m["ffn"]["experts"] == 6 and m["ffn"]["top_k"] == 2
    assert m["ffn"]["router"]["kind"] == "softmax_topk" and m["ffn"]["router"]["normalize"] is True
    assert m["ffn"]["expert"]["kind"] == "swiglu" and m["ffn"]["expert"]["hidden"] == 24
    assert m["ffn"]["balance_loss"] == 0.001


def test_mixtral_refuses_router_jitter_noise(imported, tmp_path):
    parity.check_refused(imported("mixtral").folder, tmp_path / "bad", {"router_jitter_noise": 0.1},
                         r"router_jitter_noise 0.1 is not supported")


def test_a_seqzoo_moe_exports_as_mixtral_and_transformers_gives_its_logits(tmp_path):
    model = seqzoo.build("tiny-moe", ["model.attention.bias=false", "model.position.scaling=null"], device="cpu")
    out = seqzoo.to_hf(model.eval(), tmp_path / "out")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "MixtralForCausalLM"
    ids = torch.randint(3, 259, (2, 12))
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL


def test_deepseek_v3_recipe_reads_latent_attention_and_grouped_sigmoid_experts(imported):
    m = imported("deepseek_v3").model.recipe["model"]
    assert m["mixer"]["kind"] == "mla" and m["mixer"]["kv_lora_rank"] == 10 and m["mixer"]["q_lora_rank"] == 12
    assert m["position"]["interleaved"] is True
    router = m["ffn"]["router"]
    assert router["kind"] == "sigmoid_grouped" and router["groups"] == 4 and router["topk_groups"] == 2
    assert m["ffn"]["shared"]["hidden"] == 8 and m["layer_overrides"] == {"0": "dense"}
    yarn = imported("deepseek_v3-yarn-plain-query").model.recipe["model"]["mixer"]
    m_factor = 0.1 * 1.0 * __import__("math").log(4.0) + 1.0
    assert yarn["scale"] == pytest.approx(10 ** -0.5 * m_factor ** 2)
