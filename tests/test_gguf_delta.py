"""GGUF for the gated-delta families (docs/gguf.md): Qwen3-Next as llama.cpp's qwen3next, Qwen3.5 as
qwen35 and qwen35moe, Kimi Linear as kimi-linear. seqzoo -> GGUF -> seqzoo is exact in F32, each file
holds the keys and tensor layouts llama.cpp's own converter writes, what llama.cpp hard-codes is
refused by name, and (slow, with llama-cpp-python) llama.cpp computes what seqzoo computes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import GGUFFile, from_gguf, to_gguf
from seqzoo.plugins.converter._delta_gguf import delta_config, sections
from seqzoo.testing.gguf import from_config

pytest.importorskip("gguf")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

#: Gated delta and gated attention with more value heads than key heads (6 over 2) and layer kinds
#: that no interval gives.
DELTA = {"head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "linear_num_key_heads": 2,
         "linear_num_value_heads": 6, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
         "linear_conv_kernel_dim": 3, "num_hidden_layers": 5,
         "layer_types": ["linear_attention", "full_attention", "linear_attention", "linear_attention",
                         "full_attention"]}
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48}
#: KDA and NoPE latent attention at irregular layers, two dense layers first, grouped experts beside
#: two shared ones' width, a value head wider than the key's nope part.
KIMI = {"num_hidden_layers": 5, "num_attention_heads": 4, "kv_lora_rank": 16, "q_lora_rank": None,
        "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12, "num_experts": 6, "num_experts_per_token": 2,
        "moe_intermediate_size": 16, "num_shared_experts": 2, "first_k_dense_replace": 2, "num_expert_group": 2,
        "topk_group": 1, "linear_attn_config": {"num_heads": 4, "head_dim": 8, "short_conv_kernel_size": 3,
                                                "full_attn_layers": [2, 5], "kda_layers": [1, 3, 4]}}

#: llama.cpp architecture -> (a small random model, the HF family to write it as).
FAMILIES = {
    "qwen3next": (lambda **c: from_config("qwen3_next", **{**DELTA, **MOE, **c}), None),
    "qwen35": (lambda **c: from_config("qwen3_5_text", **{**DELTA, **c}), None),
    "qwen35moe": (lambda **c: from_config("qwen3_5_moe_text", **{**DELTA, **MOE, **c}), "qwen3_5_moe_text"),
    "kimi-linear": (lambda **c: from_config("kimi_linear", **{**KIMI, **c}), None),
}


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_each_gated_delta_family_round_trips_exactly_in_f32(arch, tmp_path):
    make, model_type = FAMILIES[arch]
    model = make()
    path = to_gguf(model, tmp_path / "m.gguf", model_type=model_type)
    assert GGUFFile(path).architecture == arch
    again = from_gguf(path)
    assert set(again.state_dict()) == set(model.state_dict())
    for name, tensor in again.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    ids = torch.randint(0, 256, (2, 70))  # past one chunk of the delta rule (64), not a multiple of it
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))


def test_an_a_log_the_file_cannot_tell_apart_comes_back_with_the_same_decay(tmp_path):
    # The file holds A = -exp(A_log) (llama.cpp's ssm_a): A_log's below 1 have float32 neighbours of
    # the same exp, and log(-A) may land on one; the import picks one whose exp is -A exactly.
    model = FAMILIES["qwen35"][0]()
    a_log = model.decoder.blocks[0].mixer.A_log
    with torch.no_grad():
        a_log.copy_(torch.tensor([0.6037845, 0.4313721, 0.8617899, 0.5508173, 0.9973282, 0.9941938]))
    again = from_gguf(to_gguf(model, tmp_path / "m.gguf"))
    assert torch.equal(torch.exp(again.decoder.blocks[0].mixer.A_log), torch.exp(a_log))
    ids = torch.randint(0, 256, (1, 20))
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))


def meta(path, key: str):
    source = GGUFFile(path)
    return source.meta[f"{source.architecture}.{key}"]


def test_qwen3_next_files_hold_llama_cpps_keys_and_layouts(tmp_path):
    model = FAMILIES["qwen3next"][0]()
    path = to_gguf(model, tmp_path / "q.gguf")
    source = GGUFFile(path)
    assert meta(path, "attention.recurrent_layers") == [True, False, True, True, False]
    assert meta(path, "full_attention_interval") == 4  # llama.cpp's converter writes its default
    assert (meta(path, "ssm.state_size"), meta(path, "ssm.group_count"), meta(path, "ssm.time_step_rank"),
            meta(path, "ssm.inner_size"), meta(path, "ssm.conv_kernel")) == (8, 2, 6, 48, 3)
    assert meta(path, "rope.dimension_count") == 4  # head_dim 16 · partial_rotary_factor 0.25
    assert meta(path, "expert_shared_feed_forward_length") == 48
    mixer = model.decoder.blocks[0].mixer  # seqzoo's in_proj rows: q, k (2·8 each), v, z (6·8 each), b, a (6)
    q, k, v, z, _, _ = mixer.in_proj.weight.split([16, 16, 48, 48, 6, 6])
    assert torch.equal(source.tensor("blk.0.attn_qkv.weight"), torch.cat([q, k, v]))  # every head's q, k, v
    assert torch.equal(source.tensor("blk.0.attn_gate.weight"), z)
    assert torch.equal(source.tensor("blk.0.ssm_a"), -torch.exp(mixer.A_log))
    assert source.shape("blk.0.ssm_conv1d.weight") == (80, 3) and "blk.0.ssm_ba.weight" in source.tensors
    assert torch.equal(source.tensor("blk.0.ssm_norm.weight"), mixer.norm.weight)  # the gated norm: plain w
    attention = model.decoder.blocks[1]  # (1 + w) norms are stored as 1 + w
    assert torch.equal(source.tensor("blk.1.attn_norm.weight"), attention.mixer_norm.weight + 1)
    assert source.shape("blk.1.attn_q.weight") == (2 * 4 * 16, 64)  # [q_h | gate_h] per head, as HF's
    assert source.shape("blk.1.ffn_gate_inp_shexp.weight") == (64,)


def test_qwen3_5_files_hold_value_heads_in_llama_cpps_tiled_order(tmp_path):
    model = FAMILIES["qwen35"][0]()
    path = to_gguf(model, tmp_path / "q.gguf")
    source = GGUFFile(path)
    assert meta(path, "rope.dimension_sections") == [1, 1, 0, 0]  # its 2 rotary pairs, split as Qwen3.5's 32
    assert sections(32) == [11, 11, 10]  # what llama.cpp's converter writes when config.json names none
    mixer = model.decoder.blocks[0].mixer
    # llama.cpp's converter: file head h is value head (h mod G)·R + h div G (G = 2 key heads, R = 3)
    order = torch.tensor([(h % 2) * 3 + h // 2 for h in range(6)])
    assert torch.equal(source.tensor("blk.0.ssm_a"), -torch.exp(mixer.A_log)[order])
    _, _, _, z, b, a = mixer.in_proj.weight.split([16, 16, 48, 48, 6, 6])
    assert torch.equal(source.tensor("blk.0.ssm_beta.weight"), b[order])
    assert torch.equal(source.tensor("blk.0.ssm_alpha.weight"), a[order])
    assert torch.equal(source.tensor("blk.0.attn_gate.weight"), z.view(6, 8, 64)[order].reshape(48, 64))
    assert torch.equal(source.tensor("blk.0.ssm_out.weight"),
                       mixer.out_proj.weight.view(64, 6, 8)[:, order].reshape(64, 48))
    conv = mixer.conv1d.weight.squeeze(1)  # q and k channels as they are, v's by head
    assert torch.equal(source.tensor("blk.0.ssm_conv1d.weight"),
                       torch.cat([conv[:32], conv[32:].view(6, 8, 3)[order].reshape(48, 3)]))
    assert "qwen35moe.expert_count" in GGUFFile(to_gguf(FAMILIES["qwen35moe"][0](), tmp_path / "m.gguf",
                                                        model_type="qwen3_5_moe_text")).meta


def test_kimi_linear_files_hold_llama_cpps_keys_and_split_latent_kv(tmp_path):
    model = FAMILIES["kimi-linear"][0]()
    path = to_gguf(model, tmp_path / "k.gguf")
    source = GGUFFile(path)
    assert meta(path, "attention.head_count_kv") == [0, 1, 0, 0, 1]  # 0: a KDA layer
    assert (meta(path, "kda.head_dim"), meta(path, "ssm.conv_kernel")) == (8, 3)
    assert (meta(path, "attention.kv_lora_rank"), meta(path, "attention.key_length"),
            meta(path, "attention.key_length_mla"), meta(path, "attention.value_length_mla")) == (16, 20, 12, 12)
    assert (meta(path, "leading_dense_block_count"), meta(path, "expert_shared_count"),
            meta(path, "expert_gating_func"), meta(path, "expert_group_count")) == (2, 2, 2, 2)
    assert meta(path, "expert_weights_scale") == pytest.approx(2.446)
    kv_b = model.decoder.blocks[1].mixer.kv_b_proj.weight.view(4, 8 + 12, 16)  # per head: k's nope rows, v's
    assert torch.equal(source.tensor("blk.1.attn_k_b.weight"), kv_b[:, :8].transpose(1, 2))
    assert torch.equal(source.tensor("blk.1.attn_v_b.weight"), kv_b[:, 8:])
    assert "blk.1.attn_kv_b.weight" not in source.tensors
    assert source.shape("blk.0.ssm_conv1d_q.weight") == (1, 32, 1, 3)
    assert source.shape("blk.0.ssm_a") == (1, 1, 4, 1) and "blk.2.exp_probs_b.bias" in source.tensors
    types = {name: t.tensor_type.name for name, t in GGUFFile(to_gguf(model, tmp_path / "h.gguf",
                                                                      dtype="F16")).tensors.items()}
    assert types["blk.0.ssm_conv1d_q.weight"] == "F32"  # ggml's conv reads float32 kernels only


def test_a_file_without_the_recurrent_layer_list_reads_them_from_the_interval():
    keys = {"block_count": 8, "full_attention_interval": 4, "embedding_length": 64, "attention.head_count": 4,
            "ssm.inner_size": 48, "ssm.time_step_rank": 6, "rope.dimension_count": 4}
    kinds = delta_config(lambda key, default=None: keys.get(key, default))["layer_types"]
    assert [kind == "full_attention" for kind in kinds] == [False, False, False, True] * 2


@pytest.mark.parametrize("arch, config, message", [
    ("qwen3next", {"linear_value_head_dim": 12}, r"sizes the gated-delta value heads by linear_key_head_dim"),
    ("qwen35", {"attention_bias": True}, r"attention has no biases"),
    ("qwen35", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
     r"unscaled RoPE only"),
    ("qwen3next", {"norm_topk_prob": False}, r"renormalises the top-k routing weights"),
    ("qwen3next", {"mlp_only_layers": [2], "intermediate_size": 96}, r"make every layer sparse"),
    ("kimi-linear", {"q_lora_rank": 24}, r"projects queries with q_proj alone"),
    ("kimi-linear", {"mlp_layer_types": ["dense", "sparse", "dense", "sparse", "sparse"]},
     r"dense FFNs in the first layers and experts in all the rest"),
    ("kimi-linear", {"linear_attn_config": {**KIMI["linear_attn_config"], "num_heads": 2, "head_dim": 16}},
     r"gives its KDA layers the attention's head count"),
    ("kimi-linear", {"moe_renormalize": False}, r"renormalises the top-k routing weights"),
])
def test_what_llama_cpp_hard_codes_is_refused_by_name(arch, config, message, tmp_path):
    make, model_type = FAMILIES[arch]
    with pytest.raises(CheckpointError, match=message):
        to_gguf(make(**config), tmp_path / "no.gguf", model_type=model_type)
    assert not (tmp_path / "no.gguf").exists()


def test_a_norm_epsilon_llama_cpp_reads_otherwise_is_named_in_a_warning(tmp_path):
    with pytest.warns(UserWarning, match=r"llama\.cpp computes the L2 norm of the KDA layers' q and k and the latent "
                                         r"attention's latent norm with ε = rms_norm_eps \(1e-05\)"):
        to_gguf(FAMILIES["kimi-linear"][0](), tmp_path / "k.gguf")  # Kimi Linear's own ε


# -- llama.cpp as the judge (slow) ----------------------------------------------------------------
def alike_experts(model: torch.nn.Module) -> torch.nn.Module:
    """Every expert a copy of the first: the routing still runs, but a token whose router scores
    nearly tie computes the same whichever way they fall."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".ffn.experts." in name:
                parameter.copy_(parameter[:1].expand_as(parameter))
    return model


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["F32", "F16", "Q8_0"])
@pytest.mark.parametrize("arch", list(FAMILIES))
def test_llama_cpp_computes_what_seqzoo_computes(arch, kind, tmp_path):
    pytest.importorskip("llama_cpp")
    from seqzoo.testing.llama_cpp import PROMPT, decisive, judge, llama_cpp_run, seqzoo_run

    make, model_type = FAMILIES[arch]
    model = decisive(make(rms_norm_eps=1e-6))  # the ε llama.cpp's norms then share with transformers' (below)
    if kind == "Q8_0":
        # Routed this sharply, a random model re-routes tokens under Q8_0's rounding alone: seqzoo's
        # own Q8_0 weights move qwen3next's logits by up to 0.40 of the largest and Kimi Linear's by
        # 1.16 (top-1 kept at 92% and 87% of the positions), wherever llama.cpp's rounding of the
        # activations lands. The routing itself is judged in F32 and F16.
        model = alike_experts(model)
    path = to_gguf(model, tmp_path / "m.gguf", dtype=kind, model_type=model_type)
    logits, greedy = seqzoo_run(model if kind == "F32" else from_gguf(path), PROMPT)
    theirs, their_greedy = llama_cpp_run(path, PROMPT, logits.shape[-1])
    judge(arch, kind, logits, greedy, theirs, their_greedy)


@pytest.mark.slow
def test_llama_cpp_takes_the_models_epsilon_where_transformers_takes_1e_6(tmp_path, monkeypatch):
    """llama.cpp L2-normalises the delta layers' q and k with ε = rms_norm_eps, and so RMS-normalises
    Kimi Linear's latent, where transformers adds 1e-6 to both. At Kimi Linear's own ε, 1e-5, that
    moves this model's logits by 2.5e-3 of the largest (the same greedy tokens); seqzoo computing
    with llama.cpp's ε agrees with it to 1e-5."""
    pytest.importorskip("llama_cpp")
    from seqzoo.testing.llama_cpp import PROMPT, decisive, llama_cpp_run, seqzoo_run

    model = decisive(FAMILIES["kimi-linear"][0](rms_norm_eps=1e-5))
    theirs, their_greedy = llama_cpp_run(to_gguf(model, tmp_path / "k.gguf"), PROMPT, 320)
    logits, greedy = seqzoo_run(model, PROMPT)
    difference = np.abs(theirs - logits).max() / np.abs(logits).max()
    assert 1e-3 < difference < 5e-3 and their_greedy == greedy
    monkeypatch.setattr("seqzoo.plugins.mixer._delta_rule.L2_EPS", 1e-5)
    for name, module in model.named_modules():
        if name.endswith("mixer.kv_a_norm"):
            monkeypatch.setattr(module, "eps", 1e-5)
    logits, _ = seqzoo_run(model, PROMPT)
    assert np.abs(theirs - logits).max() / np.abs(logits).max() < 1e-5
