"""Mixture of experts: the routers against hand-computed cases (docs/formulas.md §19), the layer
against a per-token reference, gradients, empty experts, capacity, the auxiliary losses and their
path into training."""
from __future__ import annotations

import math

import pytest
import torch

import seqzoo
from seqzoo.interfaces import auxiliary_losses, auxiliary_statistics


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def router(kind: str, experts: int, top_k: int, weight: list[list[float]], **params):
    r = seqzoo.registry().create("router", {"kind": kind, **params}, len(weight[0]), experts, top_k)
    with torch.no_grad():
        r.weight.copy_(torch.tensor(weight))
    return r


# -- routers ---------------------------------------------------------------------------------------
def test_softmax_topk_picks_the_largest_probabilities_and_renormalises_them():
    # logits [2, 1, 0, -1] for x = (1, 0)
    r = router("softmax_topk", 4, 2, [[2.0, 0], [1.0, 0], [0.0, 0], [-1.0, 0]])
    routing = r(torch.tensor([[1.0, 0.0]]))
    assert routing.experts.tolist() == [[0, 1]]
    e = math.e
    assert routing.weights[0].tolist() == pytest.approx([e ** 2 / (e ** 2 + e), e / (e ** 2 + e)])
    total = e ** 2 + e + 1 + 1 / e
    assert routing.probs[0].tolist() == pytest.approx([e ** 2 / total, e / total, 1 / total, 1 / e / total])
    plain = router("softmax_topk", 4, 2, [[2.0, 0], [1.0, 0], [0.0, 0], [-1.0, 0]], normalize=False)
    assert plain(torch.tensor([[1.0, 0.0]])).weights[0].tolist() == pytest.approx([e ** 2 / total, e / total])


def test_topk_softmax_takes_a_softmax_over_the_chosen_logits_with_the_bias():
    r = router("topk_softmax", 4, 2, [[1.0], [2.0], [3.0], [0.0]])
    with torch.no_grad():
        r.bias.copy_(torch.tensor([0.0, 0.0, -2.5, 1.5]))  # logits for x = 1: [1, 2, 0.5, 1.5]
    routing = r(torch.tensor([[1.0]]))
    assert routing.experts.tolist() == [[1, 3]]
    assert routing.weights[0].tolist() == pytest.approx([1 / (1 + math.exp(-0.5)), 1 / (1 + math.exp(0.5))])


def test_sigmoid_grouped_selects_with_the_bias_inside_the_best_groups_and_weighs_without_it():
    # 8 experts in 4 groups of 2; logits for x = 1 are the weights themselves
    logits = [3.0, -3.0, 1.0, 0.9, 0.0, 2.5, -1.0, -2.0]
    r = router("sigmoid_grouped", 8, 2, [[v] for v in logits], groups=4, topk_groups=2)
    with torch.no_grad():
        r.correction_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.0]))
    s = [1 / (1 + math.exp(-v)) for v in logits]
    biased = [v + b for v, b in zip(s, [0, 0, 0, 0, 0, 0, 3, 0])]
    # group scores: the sum of each group's two biased scores
    groups = [biased[0] + biased[1], biased[2] + biased[3], biased[4] + biased[5], biased[6] + biased[7]]
    # the bias lifts group 3 to the top; group 0 (0.95 + 0.05) loses to group 1 (0.73 + 0.71)
    assert sorted(range(4), key=lambda g: -groups[g])[:2] == [3, 1]
    routing = r(torch.tensor([[1.0]]))
    # inside groups 1 and 3, the two best biased scores: expert 6 (its bias) and expert 2; expert 0,
    # the best single score, is out with its group
    assert sorted(routing.experts[0].tolist()) == [2, 6]
    chosen = dict(zip(routing.experts[0].tolist(), routing.weights[0].tolist()))
    assert chosen[2] == pytest.approx(s[2] / (s[2] + s[6]))  # weights from s, not s + bias
    assert chosen[6] == pytest.approx(s[6] / (s[2] + s[6]))
    ungrouped = router("sigmoid_grouped", 8, 2, [[v] for v in logits])  # no group limit, no bias
    assert sorted(ungrouped(torch.tensor([[1.0]])).experts[0].tolist()) == [0, 5]


def test_bias_update_lowers_an_overloaded_experts_bias_while_training():
    r = router("sigmoid_grouped", 4, 1, [[5.0], [0.0], [0.0], [0.0]], bias_update=0.01)
    x = torch.ones(8, 1)  # every token picks expert 0: load [8, 0, 0, 0], mean 2
    r.eval()
    r(x)
    assert r.correction_bias.tolist() == [0.0] * 4  # not while evaluating
    r.train()
    r(x)
    assert r.correction_bias.tolist() == pytest.approx([-0.01, 0.01, 0.01, 0.01])


def test_a_router_refuses_more_choices_than_experts():
    with pytest.raises(seqzoo.SeqzooError, match=r"top_k=5 must be at most experts=4"):
        seqzoo.registry().create("router", "softmax_topk", 8, 4, 5)


def test_group_limit_must_keep_enough_experts():
    with pytest.raises(seqzoo.SeqzooError, match=r"topk_groups=1 of groups=4 must keep at least top_k=3"):
        seqzoo.registry().create("router", {"kind": "sigmoid_grouped", "groups": 4, "topk_groups": 1}, 8, 8, 3)


# -- the layer -------------------------------------------------------------------------------------
def moe(**params):
    spec = {"kind": "moe", "experts": 5, "top_k": 2, "expert": {"kind": "swiglu", "hidden": 12}, **params}
    return seqzoo.registry().create("ffn", spec, 16)


def expert(layer, e: int, x):
    """Expert e of the layer on x (N, C), written out: SiLU(W_gate x) ⊙ W_up x, then W_down — from
    the stacked weights (gate rows first) of gated experts, or the expert's own module."""
    experts = layer.experts
    if isinstance(experts, torch.nn.ModuleList):
        return experts[e](x)
    hidden = experts.hidden
    gate, up = experts.gate_up[e, :hidden], experts.gate_up[e, hidden:]
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ experts.down[e].T


def per_token(layer, x):
    """Σ_j w_j · E_{e_j}(x) one token at a time: the definition, with no grouping."""
    tokens = x.reshape(-1, x.shape[-1])
    routing = layer.router(tokens)
    rows = []
    for i, token in enumerate(tokens):
        rows.append(sum(w * expert(layer, int(e), token[None])[0]
                        for e, w in zip(routing.experts[i], routing.weights[i])))
    return torch.stack(rows).reshape(x.shape)


@pytest.mark.parametrize("router_spec", ["softmax_topk", {"kind": "softmax_topk", "normalize": False},
                                         "topk_softmax", {"kind": "sigmoid_grouped", "groups": 1}])
def test_grouped_dispatch_equals_the_per_token_sum(router_spec):
    layer = moe(router=router_spec)
    x = torch.randn(3, 7, 16)
    torch.testing.assert_close(layer(x), per_token(layer, x), atol=1e-6, rtol=1e-5)


def test_shared_expert_gate_and_routed_scale_add_up():
    layer = moe(shared={"kind": "swiglu", "hidden": 8}, shared_gate=True, routed_scale=2.5)
    x = torch.randn(2, 4, 16)
    tokens = x.reshape(-1, 16)
    expected = 2.5 * per_token(layer, x) + (torch.sigmoid(layer.shared_gate(tokens))
                                             * layer.shared(tokens)).reshape(x.shape)
    torch.testing.assert_close(layer(x), expected, atol=1e-6, rtol=1e-5)


def test_gradients_reach_every_selected_expert_and_the_router_and_no_other():
    layer = moe(router={"kind": "softmax_topk", "bias": True})
    with torch.no_grad():  # no token can pick expert 4: its logit is 100 below the rest
        layer.router.bias[4] = -100.0
    x = torch.randn(4, 6, 16)
    chosen = set(layer.router(x.reshape(-1, 16)).experts.flatten().tolist())
    assert 4 not in chosen and len(chosen) == 4
    out = layer(x)
    assert torch.isfinite(out).all()  # an expert with no token: no NaN
    out.square().sum().backward()
    for e in range(5):  # each expert's slices of the stacked weights
        grads = [layer.experts.gate_up.grad[e], layer.experts.down.grad[e]]
        if e in chosen:
            assert all(g.abs().sum() > 0 for g in grads), e
        else:
            assert all(g.abs().sum() == 0 for g in grads), e
    assert layer.router.weight.grad is not None and layer.router.weight.grad.abs().sum() > 0


def test_capacity_keeps_the_first_tokens_of_each_expert_in_sequence_order():
    layer = moe(top_k=1, capacity_factor=0.4)  # ⌈0.4 · 10 · 1 / 5⌉ = 1 token per expert
    x = torch.randn(1, 10, 16)
    tokens = x[0]
    routing = layer.router(tokens)
    kept = {}
    for i, e in enumerate(routing.experts[:, 0].tolist()):
        kept.setdefault(e, i)  # the first token that chose each expert
    expected = torch.zeros_like(tokens)
    for e, i in kept.items():
        expected[i] = routing.weights[i, 0] * expert(layer, e, tokens[i:i + 1])[0]
    torch.testing.assert_close(layer(x)[0], expected, atol=1e-6, rtol=1e-5)


def test_balance_loss_is_one_when_balanced_and_e_when_all_go_to_one_expert_and_z_loss_is_lse_squared():
    layer = moe(top_k=1).train()
    n = 20
    x = torch.randn(1, n, 16)
    layer(x)
    routing = layer.router(x[0])
    load = torch.bincount(routing.experts.flatten(), minlength=5).float() / n
    expected = 5 * (load * routing.probs.mean(0)).sum()
    (coef, balance), (_, z) = layer.auxiliary["balance_loss"], layer.auxiliary["z_loss"]
    assert coef == 0.01 and balance.item() == pytest.approx(expected.item())
    assert z.item() == pytest.approx(torch.logsumexp(routing.logits, -1).square().mean().item())
    assert layer.statistics["expert_load"].tolist() == pytest.approx(load.tolist())
    # token i goes to expert i, probabilities symmetric: f_e = P_e = 1/5, loss E · Σ 1/25 = 1
    balanced = moe(top_k=1).train()
    with torch.no_grad():
        balanced.router.weight.zero_()
        balanced.router.weight[:, :5] = 10 * torch.eye(5)
    balanced(torch.eye(16)[None, :5])
    assert balanced.auxiliary["balance_loss"][1].item() == pytest.approx(1.0)
    assert balanced.statistics["expert_load"].tolist() == pytest.approx([0.2] * 5)
    # one expert takes every token with probability ~1: E · 1 · 1
    concentrated = moe(top_k=1, router={"kind": "softmax_topk", "bias": True}).train()
    with torch.no_grad():
        concentrated.router.weight.zero_()
        concentrated.router.bias.copy_(torch.tensor([0.0, 0.0, 50.0, 0.0, 0.0]))
    concentrated(x)
    assert concentrated.auxiliary["balance_loss"][1].item() == pytest.approx(5.0)


def test_auxiliary_losses_are_collected_while_training_only():
    model = seqzoo.build("tiny-moe", device="cpu")
    ids = torch.randint(3, 259, (2, 9))
    model.train()
    model(ids, targets=ids)
    total, values = auxiliary_losses(model)
    layers = [m for m in model.modules() if isinstance(m, seqzoo.interfaces.AuxiliaryLosses)]
    assert len(layers) == model.recipe["model"]["layers"]
    assert total is not None and set(values) == {"balance_loss", "z_loss"}
    assert total.item() == pytest.approx(0.01 * sum(m.auxiliary["balance_loss"][1].item() for m in layers))
    loads = auxiliary_statistics(model)["expert_load"]
    assert len(loads) == len(layers) and all(sum(load) == pytest.approx(1.0) for load in loads)
    model.eval()
    with torch.no_grad():
        model(ids)
    assert auxiliary_losses(model) == (None, {})


def test_seqzoo_train_adds_the_balancing_loss_and_reports_it_with_the_expert_load(tmp_path):
    from seqzoo.cli import main

    metrics = tmp_path / "m.json"
    assert main(["train", "tiny-moe", "--set", "train.steps=6", "--set", "train.log_every=3", "--quiet",
                 "--metrics", str(metrics)]) == 0
    import json

    history = json.loads(metrics.read_text())["history"]
    assert [h["step"] for h in history] == [3, 6]
    for entry in history:
        assert set(entry["aux"]) == {"balance_loss", "z_loss"} and entry["aux"]["balance_loss"] > 0
        assert len(entry["expert_load"]) == 2 and all(len(load) == 4 for load in entry["expert_load"])


def test_gated_experts_are_stacked_and_other_kinds_stay_modules():
    stacked = moe()
    assert stacked.experts.gate_up.shape == (5, 24, 16) and stacked.experts.down.shape == (5, 16, 12)
    listed = moe(expert={"kind": "mlp", "hidden": 12, "activation": "gelu"})
    assert isinstance(listed.experts, torch.nn.ModuleList) and len(listed.experts) == 5
    x = torch.randn(2, 6, 16)
    torch.testing.assert_close(listed(x), per_token(listed, x), atol=1e-6, rtol=1e-5)
    with torch.no_grad():  # decoding sizes take the few-row products: the same numbers
        few = torch.randn(1, 3, 16)
        torch.testing.assert_close(stacked(few), per_token(stacked, few), atol=1e-6, rtol=1e-5)


# -- the decoding path: the chosen experts' weights gathered, fixed shapes ---------------------------
@pytest.mark.parametrize("router_spec", ["softmax_topk", "topk_softmax", {"kind": "sigmoid_grouped", "groups": 1}])
@pytest.mark.parametrize("bias", [False, True])
def test_decoding_gathers_the_chosen_weights_and_equals_the_grouped_dispatch(router_spec, bias):
    layer = moe(router=router_spec, expert={"kind": "swiglu", "hidden": 12, "bias": bias},
                shared={"kind": "swiglu", "hidden": 8}, routed_scale=1.5)
    with torch.no_grad():
        for rows in (1, 3, 8):  # 2, 6 and 16 (token, slot) pairs
            tokens = torch.randn(rows, 16)
            routing = layer.router(tokens)
            assert layer.decoding(tokens)
            torch.testing.assert_close(layer.gathered(tokens, routing), layer.dispatch(tokens, routing),
                                       atol=1e-6, rtol=1e-5)
        if not bias:
            few = torch.randn(2, 2, 16)
            expected = 1.5 * per_token(layer, few) + layer.shared(few)
            torch.testing.assert_close(layer(few), expected, atol=1e-6, rtol=1e-5)


def test_training_prefill_capacity_and_unstacked_experts_keep_the_grouped_dispatch():
    layer = moe()
    few = torch.randn(3, 16)
    assert not layer.decoding(few)                       # autograd records: the grouped backward
    with torch.no_grad():
        assert layer.decoding(few)
        assert not layer.decoding(torch.randn(9, 16))    # 18 pairs > max(5 experts, 16)
        assert not moe(capacity_factor=1.0).decoding(few)
        assert not moe(expert={"kind": "mlp", "hidden": 12}).decoding(few)
