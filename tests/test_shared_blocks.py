"""Shared blocks (docs/formulas.md §14.13), a recipe option any decoder can use: one attention + FFN
block whose weights several layers run, each site with low-rank adapters and a projection of its own
(Zamba2). Against the formula written out, and each model decoding from its cache — one KV cache per
site — exactly as it computes whole, left padding and beams included."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqzoo
from seqzoo.nn.attention import self_attention_inputs
from seqzoo.nn.generation import CausalSession, generate
from seqzoo.nn.shared import SharedSite, SiteState
from seqzoo.testing._shared import kv_cache_equivalence, left_padding_equivalence

C, H, K, D, FFN, R = 32, 4, 2, 16, 48, 4  # width; the block's heads, KV heads, head dim over [x; e]; FFN; rank
BLOCK = {"attention": {"heads": H, "kv_heads": K, "bias": False}, "ffn": {"kind": "geglu", "hidden": FFN},
         "concat_embeddings": True, "adapters": ["q", "k", "v", "ffn"], "adapter_rank": R, "position": "rope"}


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def recipe(**changes) -> dict:
    """Four Mamba-2 layers; layers 1 and 3 run shared block 0 first."""
    return {"model": {"kind": "decoder_lm", "vocab_size": 259, "dim": C, "layers": 4, "max_seq_len": 64,
                      "position": "none", "norm": {"kind": "rmsnorm", "eps": 1e-5}, "attention": None, "ffn": None,
                      "mixer": {"kind": "mamba2", "state": 8, "head_dim": 16, "chunk": 4},
                      "shared_blocks": [BLOCK], "layer_types": {"plain": {}, "site": {"shared_block": 0}},
                      "pattern": ["plain", "site"], **changes}}


def build(**changes) -> torch.nn.Module:
    model = seqzoo.build(recipe(**changes), device="cpu", dtype="float32").eval()
    with torch.no_grad():  # random norms and adapters, so a part in the wrong place shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif ".up." in name and "adapters" in name:
                p.normal_(0.0, 0.3)
    return model


def test_the_state_dict_holds_the_block_once_and_each_site_its_own_adapters():
    model = build()
    names = list(model.state_dict())
    assert [n for n in names if n.endswith("qkv_proj.weight")] == ["decoder.shared_blocks.0.attention.qkv_proj.weight"]
    shared = {n.removeprefix("decoder.shared_blocks.0.") for n in names if n.startswith("decoder.shared_blocks.")}
    assert shared == {"in_norm.weight", "attention.qkv_proj.weight", "attention.out_proj.weight", "ffn_norm.weight",
                      "ffn.gate.weight", "ffn.up.weight", "ffn.down.weight"}
    for layer in (1, 3):
        site = {n.removeprefix(f"decoder.blocks.{layer}.site.") for n in names
                if n.startswith(f"decoder.blocks.{layer}.site.")}
        assert site == {"proj.weight", *(f"adapters.{a}.{p}.weight" for a in ("q", "k", "v", "ffn")
                                         for p in ("down", "up"))}
    assert not [n for n in names if n.startswith(("decoder.blocks.0.site", "decoder.blocks.2.site"))]
    state = model.state_dict()
    w = 2 * C  # the block reads [x; e]
    assert state["decoder.shared_blocks.0.attention.qkv_proj.weight"].shape == ((H + 2 * K) * D, w)
    assert state["decoder.shared_blocks.0.attention.out_proj.weight"].shape == (C, H * D)  # writes C, not 2C
    assert state["decoder.shared_blocks.0.in_norm.weight"].shape == (w,)
    assert state["decoder.blocks.1.site.adapters.k.up.weight"].shape == (K * D, R)
    assert state["decoder.blocks.1.site.adapters.ffn.up.weight"].shape == (2 * FFN, R)  # gate and up together
    # one copy: the count is the model without the option, plus one block, plus each site's own
    plain = seqzoo.build(recipe(shared_blocks=None, layer_types=None, pattern=None), device="meta")
    block = sum(p.numel() for p in model.decoder.shared_blocks.parameters())
    site = sum(p.numel() for p in model.decoder.blocks[1].site.parameters())
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in plain.parameters()) + block + 2 * site


def reference_block(x, e, model, layer):
    """§14.13 by hand for a site without a position scheme: S_s([x; e]) with the site's LoRA pairs
    added to q, k, v and to the FFN's gate and up, P_s of it added to the mixer's input only."""
    block, shared = model.decoder.blocks[layer], model.decoder.shared_blocks[0]
    site, attention = block.site, shared.attention
    pair = {name: (a.down.weight, a.up.weight) for name, a in site.adapters.items()}

    def lora(name, h, rows=slice(None)):
        down, up = pair[name]
        return h @ down.T @ up[rows].T

    b, t, _ = x.shape
    h = shared.in_norm(torch.cat([x, e], dim=-1))
    q, k, v = (h @ attention.qkv_proj.weight.T).split([H * D, K * D, K * D], dim=-1)
    q, k, v = q + lora("q", h), k + lora("k", h), v + lora("v", h)
    q, k, v = (z.view(b, t, -1, D).transpose(1, 2) for z in (q, k, v))
    k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, H * D)
    y = shared.ffn_norm(o @ attention.out_proj.weight.T)
    gate = y @ shared.ffn.gate.weight.T + lora("ffn", y, slice(0, FFN))
    up = y @ shared.ffn.up.weight.T + lora("ffn", y, slice(FFN, 2 * FFN))
    lift = (shared.ffn.down(F.gelu(gate) * up)) @ site.proj.weight.T
    context = self_attention_inputs(model.decoder.position, torch.arange(t)[None], causal=True)
    return x + block.mixer(block.mixer_norm(x + lift), context)


def test_a_site_adds_its_projection_of_the_adapted_block_to_its_mixer_input():
    model = build(shared_blocks=[{**BLOCK, "position": "none"}])
    seen = {}
    model.decoder.blocks[1].register_forward_hook(lambda m, args, out: seen.update(x=args[0], out=out))
    model.decoder.blocks[0].register_forward_pre_hook(lambda m, args: seen.update(e=args[0]))
    with torch.no_grad():
        model(torch.randint(3, 259, (2, 9)))
        torch.testing.assert_close(seen["out"], reference_block(seen["x"], seen["e"], model, 1))


def test_sites_run_the_same_weights_with_their_own_adapters():
    """Two sites fed the same input differ only through their adapters and projections: with the
    second site's copied from the first, their outputs agree."""
    model = build()
    first, second = model.decoder.blocks[1].site, model.decoder.blocks[3].site
    x, e = torch.randn(2, 5, C), torch.randn(2, 5, C)
    shared = model.decoder.shared_blocks[0]
    context = self_attention_inputs(model.decoder.schemes[model.decoder.shared_scheme[0]], torch.arange(5)[None],
                                    causal=True)
    with torch.no_grad():
        a, b = first(x, e, shared, context, None), second(x, e, shared, context, None)
        assert not torch.allclose(a, b)
        second.load_state_dict(first.state_dict())
        torch.testing.assert_close(second(x, e, shared, context, None), a)
        # outside a site the block runs without adapters
        torch.testing.assert_close(shared(x, e, context, None), shared(x, e, context, None, None))


def test_training_reaches_the_block_from_every_site_and_each_sites_adapters():
    model = build().train()
    ids = torch.randint(3, 259, (2, 9))
    model(ids, targets=ids).backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    for name in ("decoder.shared_blocks.0.attention.qkv_proj.weight", "decoder.shared_blocks.0.ffn.up.weight",
                 *(f"decoder.blocks.{i}.site.{part}.weight" for i in (1, 3)
                   for part in ("proj", "adapters.q.down", "adapters.ffn.up"))):
        assert grads[name] is not None and grads[name].abs().sum() > 0, name


@pytest.mark.parametrize("changes", [
    {},
    # two blocks (GQA, adapters on q and v only), the second reading x alone, on alternate sites
    {"shared_blocks": [{**BLOCK, "adapters": ["q", "v"]}, {**BLOCK, "concat_embeddings": False, "adapters": ["ffn"],
                                                           "attention": {"heads": 2, "bias": True}}],
     "layer_types": {"plain": {}, "a": {"shared_block": 0}, "b": {"shared_block": 1}},
     "pattern": ["a", "plain", "b", "a"]},
], ids=["one-block", "two-blocks"])
def test_the_model_decodes_from_its_cache_as_it_computes_whole(changes):
    """Cached decoding, left padding, beams that swap rows (every site's KV slice follows them) and
    a static cache (``generate(compile=True)``'s fixed-shape steps) against the growing one."""
    model = build(**changes)
    kv_cache_equivalence(model)
    left_padding_equivalence(model)
    prompt = torch.randint(3, 256, (1, 6))
    assert torch.equal(generate(model, prompt, 10, beam_size=3, eos_id=None),
                       generate(model, prompt, 10, beam_size=3, eos_id=None, use_cache=False))
    ids, mask = torch.randint(3, 256, (3, 6)), torch.ones(3, 6, dtype=torch.long)
    mask[0, :3] = 0
    runs = []
    with torch.inference_mode():
        for static in (False, True):
            session, token, logits = CausalSession(model, ids, 12, True, mask, static=static), None, []
            for _ in range(12):
                logits.append(session.next(token))
                token = logits[-1].argmax(-1)
            runs.append(torch.stack(logits, 1))
    torch.testing.assert_close(runs[1], runs[0], atol=1e-5, rtol=1e-5)


def test_each_site_keeps_its_own_kv_cache():
    model = build()
    cache = model.new_cache(2, 8)
    assert [isinstance(state, SiteState) for state in cache.states] == [False, True, False, True]
    first, second = cache.states[1].shared, cache.states[3].shared
    assert first is not second
    with torch.no_grad():
        model(torch.randint(3, 259, (2, 5)), cache=cache)
    assert not torch.equal(first.k[:, :, :5], second.k[:, :, :5])  # each site's own keys
    assert torch.count_nonzero(first.k[:, :, 5:]) == 0


def test_a_checkpoint_rebuilds_the_shared_block_and_its_sites(tmp_path):
    model = build()
    ids = torch.randint(3, 259, (2, 7))
    seqzoo.save(model, tmp_path / "m.safetensors")
    again = seqzoo.load(tmp_path / "m.safetensors", device="cpu").eval()
    assert isinstance(again.decoder.blocks[3].site, SharedSite) and again.decoder.blocks[2].site is None
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))


@pytest.mark.parametrize("changes, message", [
    ({"layer_types": {"plain": {}, "site": {"shared_block": 1}}},
     r"model\.layer_types\.site\.shared_block: shared block 1 does not exist \(indices 0\.\.0"),
    ({"shared_blocks": None}, r"shared block 0 does not exist \(the model has no shared_blocks"),
    ({"shared_blocks": [BLOCK, BLOCK]}, r"model\.shared_blocks\.1: shared block 1 runs in no layer"),
    ({"shared_blocks": [{**BLOCK, "ffn": None}]}, r"model\.shared_blocks\.0\.adapters: ffn is adapted, but the block "
                                                  r"has no ffn"),
    ({"shared_blocks": [{**BLOCK, "attention": {"heads": 3, "bias": False}}]},
     r"model\.shared_blocks\.0\.attention\.heads: dim=64 must be divisible by heads=3"),
    ({"shared_blocks": [{**BLOCK, "adapters": ["o"]}]}, r"model\.shared_blocks\.0\.adapters\.0: 'o' is not one of"),
    ({"shared_blocks": [{**BLOCK, "position": "learned"}]},
     r"model\.shared_blocks\.0\.position: 'learned' adds to the token embeddings"),
    ({"layer_types": {"plain": {}, "site": {"shared_block": 0, "mixer": "none", "ffn": "gelu"}}},
     r"model\.layer_types\.site\.shared_block: a shared block feeds the layer's mixer; layer 1 has mixer none"),
    ({"shared_blocks": [{**BLOCK, "ffn": {"kind": "moe", "experts": 2, "top_k": 1, "expert": "swiglu"}}]},
     r"model: shared block: adapters name ffn, but the ffn \(MixtureOfExperts\) has no input projection"),
])
def test_a_malformed_shared_block_is_refused(changes, message):
    with pytest.raises(seqzoo.RecipeError, match=message):
        seqzoo.build(recipe(**changes), device="meta")
