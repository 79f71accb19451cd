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
from seqzoo.train import parity

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
