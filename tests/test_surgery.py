"""Model surgery (seqzoo edit): every transfer rule on a trained-shape model — exact rules give
identical logits, approximate ones report their error, untouched tensors are bit-identical — the
plan of a dry run, and the refusals."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.errors import InputError
from seqzoo.train.surgery import changed_keys, edit


@pytest.fixture
def model():
    torch.manual_seed(0)
    return seqzoo.build("tiny-llama", ["model.position.scaling=null"], device="cpu").eval()


def untouched_equal(old, new, report):
    """Every tensor the report says was copied is the old one, bit for bit."""
    copied = [n for n, how in report.tensors.items() if how == "copied"]
    assert copied
    for name in copied:
        assert torch.equal(old.state_dict()[name], new.state_dict()[name]), name


def test_changed_keys_are_the_leaves_that_differ():
    assert changed_keys({"a": 1, "b": {"c": 2, "d": 3}}, {"a": 1, "b": {"c": 5, "d": 3}, "e": 0}) == ["b.c", "e"]


def test_upcycling_is_exact_and_every_expert_is_the_dense_ffn(model):
    new, report = edit(model, ["model.ffn={kind: moe, experts: 4, top_k: 2, expert: {kind: swiglu, hidden: 128}}"])
    assert report.rules["upcycle"]["exact"] and report.logit_difference < 1e-5
    ffn = new.decoder.blocks[1].ffn
    dense = model.decoder.blocks[1].ffn
    for e in range(4):
        assert torch.equal(ffn.experts.gate_up[e], torch.cat([dense.gate.weight, dense.up.weight]))
        assert torch.equal(ffn.experts.down[e], dense.down.weight)
    untouched_equal(model, new, report)


def test_upcycling_without_renormalised_weights_is_reported_approximate(model):
    new, report = edit(model, ["model.ffn={kind: moe, experts: 4, top_k: 2, expert: {kind: swiglu, hidden: 128}, "
                               "router: {kind: softmax_topk, normalize: false}}"])
    assert not report.rules["upcycle"]["exact"] and report.logit_difference > 1e-3


def test_growing_the_vocabulary_keeps_every_old_logit(model):
    new, report = edit(model, ["model.vocab_size=300"])
    assert report.rules["vocab"]["exact"] and report.logit_difference == 0.0
    rows = model.embed.weight
    assert torch.equal(new.embed.weight[:259], rows)
    assert torch.allclose(new.embed.weight[259:], rows.mean(0).expand(41, -1))


def test_pooling_kv_heads_averages_each_group_and_reports_its_error(model):
    new, report = edit(model, ["model.attention.kv_heads=1"])
    heads, d = 4, 16
    old_qkv = model.decoder.blocks[0].mixer.qkv_proj.weight
    q, k, v = old_qkv.split([heads * d, 2 * d, 2 * d])
    expected = torch.cat([q, k.reshape(2, d, -1).mean(0), v.reshape(2, d, -1).mean(0)])
    assert torch.allclose(new.decoder.blocks[0].mixer.qkv_proj.weight, expected)
    # the error the rule claims, recomputed: ‖W_kv − the mean expanded back‖ / ‖W_kv‖
    errs = []
    for block in model.decoder.blocks:
        _, k, v = block.mixer.qkv_proj.weight.split([heads * d, 2 * d, 2 * d])
        mean_k, mean_v = (t.reshape(2, d, -1).mean(0) for t in (k, v))
        back = torch.cat([mean_k, mean_k, mean_v, mean_v])
        errs.append(((torch.cat([k, v]) - back).pow(2).sum().item(), torch.cat([k, v]).pow(2).sum().item()))
    claimed = report.rules["kv_heads"]["errors"]["relative K/V weight error"]
    assert claimed == pytest.approx(float((sum(a for a, _ in errs) / sum(b for _, b in errs)) ** 0.5), rel=1e-5)
    assert not report.rules["kv_heads"]["exact"] and report.logit_difference > 0
    untouched_equal(model, new, report)


@pytest.mark.parametrize("override, rule", [
    ("model.position.base=50000", "rope"), ("model.attention.window=4", "window"),
    ("model.position={kind: rope, base: 10000, scaling: {kind: yarn, factor: 4, original_max_seq_len: 64}}", "rope")])
def test_position_and_window_changes_copy_every_tensor_and_report_the_logit_change(model, override, rule):
    new, report = edit(model, [override])
    assert set(report.tensors.values()) == {"copied"} and rule in report.rules
    untouched_equal(model, new, report)
    assert report.logit_difference > 0


def test_a_nope_layer_type_is_a_position_change(model):
    new, report = edit(model, ["model.layer_types={rope: {}, nope: {position: none}}", "model.pattern=[rope, nope]"])
    assert report.changed == {"layer_types": "rope", "pattern": "rope"}
    assert set(report.tensors.values()) == {"copied"} and report.logit_difference > 0
    assert [type(p).__name__ for p in new.decoder.layer_positions] == ["NoPosition"]


def test_depth_duplicates_layers_in_place(model):
    new, report = edit(model, ["model.layers=4"])
    for i, source in enumerate([0, 0, 1, 1]):
        for name, tensor in new.decoder.blocks[i].state_dict().items():
            assert torch.equal(tensor, model.decoder.blocks[source].state_dict()[name])
    assert not report.rules["depth"]["exact"]


def latent(rank: int, rope: int = 8) -> str:
    return (f"model.mixer={{kind: mla, heads: 4, kv_lora_rank: {rank}, qk_nope_head_dim: {16 - rope}, "
            f"qk_rope_head_dim: {rope}, v_head_dim: 16, latent_norm: false}}")


def sharpened(*overrides):
    """tiny-llama with its q/k/v weights ×8, so that attention is far from uniform and a wrong
    row, rotation or head grouping shows in the logits."""
    torch.manual_seed(0)
    m = seqzoo.build("tiny-llama", list(overrides), device="cpu").eval()
    with torch.no_grad():
        for block in m.decoder.blocks:
            block.mixer.qkv_proj.weight.mul_(8)
    return m


def test_mqa_to_latent_attention_is_exact_at_full_rank_with_every_rotated_dim_kept():
    # MQA with partial rotary (8 of 16 dims, YaRN scaling as tiny-llama has it): the 8 rotated
    # dims become MLA's shared k_pe, the 8 others the nope part; rank 24 = 8 + 16 holds [k_nope; v]
    model = sharpened("model.attention.kv_heads=1", "model.position.rotary_dim=8")
    _, plan = edit(model, [latent(24), "model.position.rotary_dim=null"], dry_run=True)
    assert plan.tensors["decoder.blocks.1.mixer.kv_b_proj.weight"] == "mla" and plan.logit_difference is None
    new, report = edit(model, [latent(24), "model.position.rotary_dim=null"])
    assert report.rules["mla"]["exact"] and report.logit_difference < 1e-5
    assert report.rules["mla"]["errors"]["relative K/V weight error (SVD)"] < 1e-6
    assert type(new.decoder.blocks[0].mixer).__name__ == "LatentAttention"
    untouched_equal(model, new, report)
    assert report.tensors["decoder.blocks.0.mixer.out_proj.weight"] == "copied"
    prompt = torch.randint(3, 259, (1, 5))  # the latent cache decodes what the full forward gives
    assert torch.equal(seqzoo.generate(new, prompt, 12, eos_id=None), seqzoo.generate(model, prompt, 12, eos_id=None))


@pytest.mark.parametrize("rank", [48, 12])
def test_gqa_to_latent_attention_reports_the_svd_and_rotary_key_errors_it_makes(rank):
    model = sharpened("model.position.scaling=null")  # GQA: 4 query heads, 2 K/V heads of 16 dims
    new, report = edit(model, [latent(rank), "model.position.base=100"])  # 10000^(8/16)
    errors = report.rules["mla"]["errors"]
    # rotate-half over 16 dims: frequency i at dims (i, i + 8); the 4 highest stay rotating as
    # MLA's (j, j + 4), so dims 0-3 and 8-11 become k_pe and 4-7, 12-15 the nope part
    rope, nope = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
    dropped = total = pooled = key = 0.0
    for old_block, new_block in zip(model.decoder.blocks, new.decoder.blocks):
        q, k, v = old_block.mixer.qkv_proj.weight.double().split([64, 32, 32])
        k, v = k.view(2, 16, -1), v.view(2, 16, -1)
        attn = new_block.mixer
        assert torch.allclose(attn.q_proj.weight.view(4, 16, -1),
                              q.view(4, 16, -1)[:, nope + rope].float())
        # the error claimed, recomputed from the new weights: [k_nope; v] of each K/V group
        # against up @ down, and the shared k_pe against each head's rotated rows
        stacked = torch.cat([k[:, nope], v], 1)  # (2, 24, C)
        down, shared = attn.kv_a_proj.weight.double().split([rank, 8])
        up = attn.kv_b_proj.weight.double().view(4, 24, rank)
        assert torch.equal(up[0], up[1]) and torch.equal(up[2], up[3])  # query heads 0, 1 read group 0
        rebuilt = up[::2] @ down
        dropped += (stacked - rebuilt).pow(2).sum().item()
        total += stacked.pow(2).sum().item()
        pooled += (k[:, rope] - shared).pow(2).sum().item()
        key += k[:, rope].pow(2).sum().item()
        assert torch.allclose(shared, k[:, rope].mean(0), atol=1e-6)
    assert errors["relative K/V weight error (SVD)"] == pytest.approx((dropped / total) ** 0.5, rel=1e-4, abs=1e-6)
    assert errors["relative rotary key error (heads pooled)"] == pytest.approx((pooled / key) ** 0.5, rel=1e-5)
    assert (errors["relative K/V weight error (SVD)"] < 1e-6) == (rank == 48)
    assert not report.rules["mla"]["exact"] and report.logit_difference > 1e-3
    untouched_equal(model, new, report)


@pytest.mark.parametrize("override, message", [
    ("model.position.base=10000", r"model\.position\.base: set it to 100\.0 = 10000\^\(8/16\)"),
    ("model.mixer.latent_norm=true", r"model\.mixer\.latent_norm: set latent_norm: false"),
    ("model.mixer.v_head_dim=8", r"model\.mixer\.v_head_dim: set v_head_dim: 16"),
])
def test_latent_attention_edits_it_cannot_carry_are_refused_in_one_line(model, override, message):
    with pytest.raises(InputError, match=message):
        edit(model, [latent(16), "model.position.base=100", override])


def test_latent_attention_refuses_an_attention_with_biases_it_would_drop():
    biased = seqzoo.build("tiny-llama", ["model.position.scaling=null", "model.attention.bias=true"], device="cpu")
    with pytest.raises(InputError, match=r"^edit: model\.attention\.bias: the mla rule needs bias: false$"):
        edit(biased, [latent(16), "model.position.base=100"])


def test_dry_run_prints_the_plan_and_changes_nothing(model, capsys, tmp_path):
    from seqzoo.cli import main

    seqzoo.save(model, tmp_path / "m.safetensors")
    assert main(["edit", str(tmp_path / "m.safetensors"), "--set", "model.attention.kv_heads=1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "attention.kv_heads: kv_heads" in out and "15 copied" in out and not (tmp_path / "out.safetensors").exists()
    assert main(["edit", str(tmp_path / "m.safetensors"), "--set", "model.layers=3", "-o",
                 str(tmp_path / "out.safetensors"), "--recipe", str(tmp_path / "out.yaml")]) == 0
    assert seqzoo.load(tmp_path / "out.safetensors").recipe["model"]["layers"] == 3
    # the edited recipe trains from the edited weights
    assert main(["train", str(tmp_path / "out.yaml"), "--init", str(tmp_path / "out.safetensors"), "--quiet",
                 "--set", "train.steps=2", "--set", "train.eval_examples=4"]) == 0


def test_a_change_no_rule_covers_is_refused_naming_the_key_and_the_rules(model):
    with pytest.raises(InputError, match=r"no transfer rule covers model\.dim; the rules are bidirectional, depth, "):
        edit(model, ["model.dim=128"])
    with pytest.raises(InputError, match=r"changes outside model:"):
        edit(model, ["tokenizer=hf"])


@pytest.mark.parametrize("layers", [1, 2])
def test_a_decoder_becomes_a_bidirectional_encoder_on_the_same_layers(layers):
    torch.manual_seed(0)
    model = seqzoo.build("tiny-llama", ["model.position.scaling=null", f"model.layers={layers}"], device="cpu").eval()
    new, report = edit(model, ["model.kind=encoder", "model.type_vocab_size=0", "model.pooler=false"])
    assert new.recipe["model"]["kind"] == "encoder" and "tie_embeddings" not in new.recipe["model"]
    measured = report.rules["bidirectional"]["errors"]
    # one layer: the last token attended to every token under either mask, so it cannot move;
    # with two, it reads earlier tokens that now saw the future
    assert (measured["hidden-state change, last token"] < 1e-5) == (layers == 1)
    assert measured["hidden-state change, earlier tokens"] > 1e-3 and report.logit_difference is None
    for name, tensor in new.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name.replace("encoder.", "decoder.", 1)]), name
