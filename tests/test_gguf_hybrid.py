"""GGUF for the Mamba-2 and short-conv hybrids (docs/gguf.md): Falcon-H1 (``falcon-h1``), Granite
4.0-H (``granitehybrid``), Nemotron-H (``nemotron_h``, with experts ``nemotron_h_moe``), LFM2
(``lfm2``) and LFM2-MoE (``lfm2moe``). Small random models with odd shapes: several layer kinds in
one stack (Mamba-2 / attention / MLP / experts, conv / attention), GQA, a head_dim that is not C / H,
two SSM groups, random norms, biases, A, D and Δ biases; μP multipliers ≠ 1.

seqzoo -> GGUF -> seqzoo is exact in F32 (tensors and logits; A_log comes back with the same exp,
as the file holds A = −exp(A_log); GGUF has no SSD chunk length, which only moves speed, so these
models keep the family's default), except Falcon-H1's multipliers, which
llama.cpp's graph does not apply: they are folded into the file's weights, and the file reads back
as that folded model, the same function. Each file carries the metadata llama.cpp reads; what
llama.cpp hard-codes and a model does not match is refused in one line.

llama.cpp as the judge (slow, skipped without llama-cpp-python): its F32 logits within 1e-3 of the
largest, 32 greedy tokens equal in F32 and F16, Q8_0 top-1 within the noise-aware rule, on the same
models with SSD chunks of 8 that the 61-token prompt crosses.
"""
from __future__ import annotations

import pytest
import torch

from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import GGUFFile, from_gguf, to_gguf
from seqzoo.testing import parity
from seqzoo.testing.gguf import from_config

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

MULTIPLIERS = dict(embedding_multiplier=1.7, lm_head_multiplier=0.6, key_multiplier=0.4,
                   attention_in_multiplier=1.3, attention_out_multiplier=0.8, ssm_in_multiplier=1.25,
                   ssm_out_multiplier=0.7, ssm_multipliers=[0.35, 0.25, 0.5, 1.5, 0.8], mlp_multipliers=[0.9, 0.6])
# attention: 4 heads of 24 over 2 KV heads (not C / H = 16); Mamba-2: 4 heads of 24 (E = 96, not 2C) in 2 groups
FALCON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              head_dim=24, mamba_d_ssm=96, mamba_n_heads=4, mamba_d_head=24, mamba_n_groups=2, mamba_d_state=8,
              mamba_rms_norm=True, mamba_norm_before_gate=False, mlp_bias=True)
# Mamba-2 8 heads of 16 (E = 2C, as llama.cpp's granitehybrid needs), experts with a shared one, NoPE
GRANITE = dict(hidden_size=64, num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "mamba"],
               num_attention_heads=4, num_key_value_heads=2, intermediate_size=32, shared_intermediate_size=48,
               num_local_experts=4, num_experts_per_tok=2, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2,
               mamba_d_state=8, embedding_multiplier=1.5, residual_multiplier=0.7, attention_multiplier=0.2,
               logits_scaling=3.0, position_embedding_type="nope")
# one sublayer per layer; Mamba-2 6 heads of 16 (E = 96 whatever expand says); attention heads of 24
NEMOTRON = dict(hidden_size=64, layers_block_type=["linear_attention", "full_attention", "mlp", "linear_attention",
                                                   "mlp"], num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                intermediate_size=96, mamba_num_heads=6, mamba_head_dim=16, n_groups=2, ssm_state_size=8, mlp_bias=True)
NEMOTRON_MOE = dict(NEMOTRON, layers_block_type=["linear_attention", "moe", "full_attention", "moe",
                                                 "linear_attention"], mlp_bias=False, n_routed_experts=8,
                    num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, n_group=2,
                    topk_group=1, routed_scaling_factor=1.5)
LFM2 = dict(hidden_size=64, num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "conv"],
            num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, block_auto_adjust_ff_dim=False)
LFM2_MOE = dict(LFM2, num_dense_layers=1, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
CHUNKS = {"falcon_h1": "mamba_chunk_size", "granitemoehybrid": "mamba_chunk_size", "nemotron_h": "chunk_size"}

#: family -> (HF model_type, config)
FAMILIES = {
    "falcon-h1": ("falcon_h1", FALCON),
    "falcon-h1 (no gated norm, tied)": ("falcon_h1", dict(FALCON, mamba_rms_norm=False, tie_word_embeddings=True)),
    "granitehybrid": ("granitemoehybrid", GRANITE),
    "granitehybrid (RoPE, dense, biases)": ("granitemoehybrid", dict(GRANITE, position_embedding_type="rope",
                                                                     num_local_experts=0, num_experts_per_tok=0,
                                                                     attention_bias=True, rope_theta=1000.0)),
    "nemotron_h": ("nemotron_h", NEMOTRON),
    "nemotron_h_moe": ("nemotron_h", NEMOTRON_MOE),
    "lfm2": ("lfm2", LFM2),
    "lfm2moe": ("lfm2_moe", LFM2_MOE),
}
#: what llama.cpp's graph does not apply, folded into the weights
FOLDED = {"falcon-h1 (μP)": ("falcon_h1", dict(FALCON, **MULTIPLIERS)),
          "falcon-h1 (μP, tied)": ("falcon_h1", dict(FALCON, **MULTIPLIERS, tie_word_embeddings=True))}


def make(family: str, chunk: int | None = None) -> torch.nn.Module:
    """The family's random model, A_log / D / Δ biases moved off their initial values (a swapped
    one must show), with SSD chunks of ``chunk`` (None: the family's default)."""
    return make_from({**FAMILIES, **FOLDED}[family], chunk)


def make_from(family: tuple[str, dict], chunk: int | None = None) -> torch.nn.Module:
    model_type, config = family
    model = from_config(model_type, **config, **({CHUNKS[model_type]: chunk} if chunk and model_type in CHUNKS else {}))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("A_log", ".D", "dt_bias")):
                parameter.add_(0.3 * torch.randn_like(parameter))
    return parity.randomised(model)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_hybrid_round_trips_exactly_in_f32(family, tmp_path):
    model = make(family)
    again = from_gguf(to_gguf(model, tmp_path / "m.gguf"))
    assert set(again.state_dict()) == set(model.state_dict())
    for name, tensor in again.state_dict().items():
        # the file holds A = −exp(A_log): A_log comes back with the same exp, which is all the mixer reads
        same = torch.exp if name.endswith("A_log") else (lambda t: t)
        assert torch.equal(same(model.state_dict()[name]), same(tensor)), name
    ids = torch.randint(0, 256, (2, 23))
    assert torch.equal(logits(again, ids), logits(model, ids))
    assert again.recipe["model"]["tie_embeddings"] == model.recipe["model"]["tie_embeddings"]


@pytest.mark.parametrize("family", list(FOLDED))
def test_falcon_h1_multipliers_are_folded_into_the_file_and_read_back_folded(family, tmp_path):
    model = make(family)
    path = to_gguf(model, tmp_path / "m.gguf")
    source, state = GGUFFile(path), model.state_dict()
    m = MULTIPLIERS
    # llama.cpp's converter folds them: the embedding, the head, q/v and k, o, out_proj
    assert torch.allclose(source.tensor("token_embd.weight"), state["embed.weight"] * m["embedding_multiplier"])
    head = state.get("lm_head.weight", state["embed.weight"])
    assert torch.allclose(source.tensor("output.weight"), head * m["lm_head_multiplier"])
    q, k, v = state["decoder.blocks.0.mixer.mixers.0.qkv_proj.weight"].split([96, 48, 48])
    assert torch.allclose(source.tensor("blk.0.attn_q.weight"), q * m["attention_in_multiplier"])
    assert torch.allclose(source.tensor("blk.0.attn_k.weight"),
                          k * m["attention_in_multiplier"] * m["key_multiplier"], rtol=1e-5)
    assert torch.allclose(source.tensor("blk.0.attn_output.weight"),
                          state["decoder.blocks.0.mixer.mixers.0.out_proj.weight"] * m["attention_out_multiplier"])
    assert torch.allclose(source.tensor("blk.0.ssm_out.weight"),
                          state["decoder.blocks.0.mixer.mixers.1.out_proj.weight"] * m["ssm_out_multiplier"])
    assert not any(key.endswith("multiplier") for key in source.meta)  # no keys: llama.cpp reads none
    again = from_gguf(path)
    a = again.recipe["model"]
    assert (a["embedding_multiplier"], a["logits_multiplier"], a["mixer"]["in_multipliers"],
            a["mixer"]["out_multipliers"]) == (1.0, 1.0, [1.0, 1.0], [1.0, 1.0])
    assert a["tie_embeddings"] is False  # the head's multiplier differs from the embedding's: its own tensor
    ids = torch.randint(0, 256, (2, 23))
    expected = logits(model, ids)
    assert (logits(again, ids) - expected).abs().max() <= 1e-5 * expected.abs().max()
    fixed = from_gguf(to_gguf(again, tmp_path / "again.gguf"))  # the folded model is written as it is
    for name, tensor in fixed.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


def meta(path, arch: str, key: str):
    return GGUFFile(path).meta[f"{arch}.{key}"]


def test_files_carry_the_per_layer_metadata_llama_cpp_reads(tmp_path):
    path = to_gguf(make("falcon-h1"), tmp_path / "f.gguf")
    source = GGUFFile(path)
    assert source.architecture == "falcon-h1"
    assert [meta(path, "falcon-h1", k) for k in ("ssm.inner_size", "ssm.time_step_rank", "ssm.group_count",
                                                 "attention.key_length")] == [96, 4, 2, 24]
    assert source.shape("blk.0.ssm_norm.weight") == (2, 48) and source.shape("blk.0.ssm_a") == (4, 1)
    assert source.shape("blk.0.ssm_conv1d.weight") == (96 + 2 * 2 * 8, 4)
    assert "blk.0.ffn_norm" in source.tensors  # llama.cpp's falcon-h1 names its FFN norm without .weight

    path = to_gguf(make("granitehybrid"), tmp_path / "g.gguf")
    assert meta(path, "granitehybrid", "attention.head_count_kv") == [0, 2, 0, 0]
    assert (meta(path, "granitehybrid", "embedding_scale"), meta(path, "granitehybrid", "residual_scale"),
            meta(path, "granitehybrid", "logit_scale")) == pytest.approx((1.5, 0.7, 3.0))
    assert meta(path, "granitehybrid", "attention.scale") == pytest.approx(0.2)
    assert meta(path, "granitehybrid", "rope.scaling.finetuned") is False  # NoPE: llama.cpp's switch for RoPE
    assert meta(path, "granitehybrid", "expert_shared_feed_forward_length") == 48
    assert GGUFFile(path).shape("blk.0.ffn_gate_exps.weight") == (4, 32, 64)
    assert "blk.0.ffn_gate_shexp.weight" in GGUFFile(path).tensors

    path = to_gguf(make("nemotron_h"), tmp_path / "n.gguf")
    assert GGUFFile(path).architecture == "nemotron_h"
    assert meta(path, "nemotron_h", "attention.head_count_kv") == [0, 2, 0, 0, 0]
    assert meta(path, "nemotron_h", "feed_forward_length") == [0, 0, 96, 0, 96]
    assert meta(path, "nemotron_h", "attention.layer_norm_epsilon") == pytest.approx(1e-5)
    path = to_gguf(make("nemotron_h_moe"), tmp_path / "e.gguf")
    assert GGUFFile(path).architecture == "nemotron_h_moe"
    assert meta(path, "nemotron_h_moe", "feed_forward_length") == [0, 32, 0, 32, 0]
    assert (meta(path, "nemotron_h_moe", "expert_count"), meta(path, "nemotron_h_moe", "expert_group_count"),
            meta(path, "nemotron_h_moe", "expert_group_used_count")) == (8, 2, 1)
    assert meta(path, "nemotron_h_moe", "expert_weights_scale") == pytest.approx(1.5)
    assert {"blk.1.exp_probs_b.bias", "blk.1.ffn_up_exps.weight", "blk.1.ffn_up_shexp.weight"} <= set(
        GGUFFile(path).tensors)

    path = to_gguf(make("lfm2moe"), tmp_path / "l.gguf")
    assert meta(path, "lfm2moe", "attention.head_count_kv") == [0, 2, 0, 0]
    assert (meta(path, "lfm2moe", "shortconv.l_cache"), meta(path, "lfm2moe", "leading_dense_block_count"),
            meta(path, "lfm2moe", "expert_gating_func")) == (3, 1, 2)
    assert GGUFFile(path).shape("blk.0.shortconv.conv.weight") == (64, 3)
    assert {"blk.1.exp_probs_b.bias", "blk.1.ffn_gate_exps.weight", "token_embd_norm.weight"} <= set(
        GGUFFile(path).tensors)
    half = GGUFFile(to_gguf(make("lfm2"), tmp_path / "h.gguf", dtype="F16")).tensors
    # llama.cpp's conv reads float32 kernels only (an F16 one aborts it), as its converter keeps them
    assert half["blk.0.shortconv.conv.weight"].tensor_type.name == "F32"
    assert half["blk.0.shortconv.in_proj.weight"].tensor_type.name == "F16"


def refused(model_type: str, config: dict, **changes):
    return lambda: from_config(model_type, **{**config, **changes})


@pytest.mark.parametrize("make_model, message", [
    (refused("falcon_h1", FALCON, attention_bias=True), r"falcon-h1 graph adds no attention output bias"),
    (refused("falcon_h1", FALCON, mamba_norm_before_gate=True), r"gates, then normalises; this model normalises"),
    (refused("falcon_h1", FALCON, mamba_proj_bias=True, projectors_bias=True), r"no in/out projection biases"),
    (refused("falcon_h1", FALCON, mamba_conv_bias=False), r"add a conv bias; this model has none"),
    (refused("falcon_h1", FALCON, time_step_limit=[0.0, 8.0]), r"does not clamp Δ; this model has time_step_limit"),
    (refused("granitemoehybrid", GRANITE, mamba_n_heads=4, mamba_expand=1),
     r"granitehybrid needs Mamba-2 layers twice as wide"),
    (refused("nemotron_h", NEMOTRON, mlp_hidden_act="silu"), r"computes relu² MLPs and experts"),
    (refused("nemotron_h", NEMOTRON_MOE, layers_block_type=["linear_attention", "moe", "full_attention", "mlp", "moe"]),
     r"makes every FFN layer a mixture of experts"),
    (refused("nemotron_h", NEMOTRON_MOE, mlp_bias=True), r"shared expert has no biases"),
    (refused("nemotron_h", NEMOTRON, layers_block_type=["full_attention", "mlp"]), r"this model has no Mamba-2 layer"),
    (refused("lfm2", LFM2, conv_bias=True), r"short convs have no biases"),
    (refused("lfm2", LFM2, head_dim=24), r"needs heads × head_dim = hidden size"),
    (refused("lfm2_moe", LFM2_MOE, norm_topk_prob=False), r"renormalises the top-k routing weights"),
    (refused("lfm2_moe", LFM2_MOE, routed_scaling_factor=2.0), r"reads no routed scale"),
])
def test_what_llama_cpp_hard_codes_is_refused_by_name(make_model, message, tmp_path):
    with pytest.raises(CheckpointError, match=message):
        to_gguf(make_model(), tmp_path / "no.gguf")
    assert not (tmp_path / "no.gguf").exists()


def test_nemotron_h_experts_in_one_group_each_kept_are_written_as_one_group(tmp_path):
    model = from_config("nemotron_h", **dict(NEMOTRON_MOE, topk_group=2))  # every group kept: no grouping
    path = to_gguf(model, tmp_path / "e.gguf")
    assert (meta(path, "nemotron_h_moe", "expert_group_count"), meta(path, "nemotron_h_moe", "expert_group_used_count")
            ) == (1, 1)  # llama.cpp asserts used < groups; one group routes alike
    ids = torch.randint(0, 256, (2, 23))
    assert torch.equal(logits(from_gguf(path), ids), logits(model, ids))


def without(path, out, *keys: str):
    """A copy of a GGUF file without some of its architecture's keys."""
    source = GGUFFile(path)
    writer = gguf.GGUFWriter(str(out), source.architecture)
    for name, field in source.reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name.split(".", 1)[1] in keys:
            continue
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=field.types[-1] if
                             field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for tensor in source.reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def test_a_granitehybrid_file_without_its_optional_keys_reads_back_as_llama_cpp_defaults_them(tmp_path):
    # as llama.cpp's converter writes Bamba: no multipliers, no shared-expert width (experts: none)
    plain = dict(GRANITE, embedding_multiplier=1.0, residual_multiplier=1.0, logits_scaling=1.0,
                 attention_multiplier=16 ** -0.5, num_local_experts=0, num_experts_per_tok=0)
    model = make_from(("granitemoehybrid", plain))
    path = without(to_gguf(model, tmp_path / "g.gguf"), tmp_path / "bare.gguf", "attention.scale", "embedding_scale",
                   "residual_scale", "logit_scale", "expert_shared_feed_forward_length")
    assert not {"granitehybrid.attention.scale", "granitehybrid.logit_scale"} & set(GGUFFile(path).meta)
    again = from_gguf(path)
    ids = torch.randint(0, 256, (2, 23))
    assert torch.equal(logits(again, ids), logits(model, ids))


# -- llama.cpp as the judge -------------------------------------------------------------------------
JUDGED = [*FAMILIES, "falcon-h1 (μP, tied)"]


@pytest.fixture(scope="module")
def judged():
    from seqzoo.testing.llama_cpp import decisive

    cache = {}

    def get(family):
        if family not in cache:
            torch.manual_seed(0)
            cache[family] = decisive(make(family, chunk=8))
        return cache[family]
    return get


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["F32", "F16", "Q8_0"])
@pytest.mark.parametrize("family", JUDGED)
def test_llama_cpp_computes_what_seqzoo_computes(family, kind, judged, tmp_path):
    pytest.importorskip("llama_cpp")
    from seqzoo.testing.llama_cpp import PROMPT, judge, llama_cpp_run, seqzoo_run

    model = judged(family)
    path = to_gguf(model, tmp_path / "m.gguf", dtype=kind)
    ours, greedy = seqzoo_run(model if kind == "F32" else from_gguf(path), PROMPT)
    theirs, their_greedy = llama_cpp_run(path, PROMPT, ours.shape[-1])
    judge(family, kind, ours, greedy, theirs, their_greedy)
