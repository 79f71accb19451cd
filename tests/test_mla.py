"""Multi-head latent attention: the mixer against the formula written out in plain torch
(docs/formulas.md §20), the absorbed decode path against the plain one, the latent cache's size,
and the model-level decoding equivalences (growing cache, static cache, beam search)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqzoo
from seqzoo.nn.attention import self_attention_inputs

SPEC = {"kind": "mla", "heads": 3, "kv_lora_rank": 10, "q_lora_rank": 12, "qk_nope_head_dim": 6,
        "qk_rope_head_dim": 4, "v_head_dim": 5}
C = 24


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def mixer(**changes):
    return seqzoo.registry().create("mixer", {**SPEC, **changes}, C).eval()


def rope_scheme():
    return seqzoo.registry().create("position", {"kind": "rope", "interleaved": True}, C, 4, 3, 64)


def by_the_formula(m, x, rope):
    """MLA written out: per head h, q_h = [q_nope | RoPE(q_pe)], k_h = [W_UK,h c | RoPE(k_pe)],
    v_h = W_UV,h c, causal softmax(σ q·k) v, then W_O."""
    b, t, _ = x.shape
    q = m.q_b_proj(F.rms_norm(m.q_a_proj(x), (12,), m.q_a_norm.weight, 1e-6)).view(b, t, 3, 10)
    latent, k_pe = m.kv_a_proj(x).split([10, 4], -1)
    normed = isinstance(m.kv_a_norm, torch.nn.RMSNorm)  # latent_norm: false leaves c linear in x
    c = F.rms_norm(latent, (10,), m.kv_a_norm.weight, 1e-6) if normed else latent  # (B, T, r)
    pos = torch.arange(t)[None]
    cos, sin = rope.angles(pos)  # (1, 1, T, 2)
    outs = []
    for h in range(3):
        w = m.kv_b_proj.weight[h * 11:(h + 1) * 11]  # rows [W_UK,h (6) | W_UV,h (5)]
        q_nope, q_pe = q[:, :, h, :6], q[:, :, h, 6:]
        k_nope, v = c @ w[:6].T, c @ w[6:].T
        q_rot = seqzoo.plugins.position.rope.rotate(q_pe[:, None], cos, sin, True)[:, 0]
        k_rot = seqzoo.plugins.position.rope.rotate(k_pe[:, None], cos, sin, True)[:, 0]
        logits = (torch.cat([q_nope, q_rot], -1) @ torch.cat([k_nope, k_rot], -1).transpose(1, 2)) * 10 ** -0.5
        logits = logits.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        outs.append(logits.softmax(-1) @ v)
    return m.out_proj(torch.cat(outs, -1))


@pytest.mark.parametrize("latent_norm", [True, False])
def test_mla_equals_the_formula_written_out(latent_norm):
    pytest.importorskip("seqzoo.plugins.position.rope")
    m, rope = mixer(latent_norm=latent_norm), rope_scheme()
    assert ("kv_a_norm.weight" in m.state_dict()) == latent_norm
    x = torch.randn(2, 7, C)
    context = self_attention_inputs(rope, torch.arange(7)[None], causal=True)
    with torch.no_grad():
        torch.testing.assert_close(m(x, context), by_the_formula(m, x, rope), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("q_lora_rank, latent_norm", [(12, True), (None, True), (None, False)])
def test_absorbed_attention_equals_the_plain_one_in_the_forward_and_in_decoding(q_lora_rank, latent_norm):
    plain, absorbed = (mixer(absorb=absorb, q_lora_rank=q_lora_rank, latent_norm=latent_norm)
                       for absorb in (False, True))
    absorbed.load_state_dict(plain.state_dict())
    rope = rope_scheme()
    x = torch.randn(2, 9, C)
    context = self_attention_inputs(rope, torch.arange(9)[None], causal=True)
    with torch.no_grad():
        full = plain(x, context)
        torch.testing.assert_close(absorbed(x, context), full, atol=1e-5, rtol=1e-5)
        for m in (plain, absorbed, mixer(q_lora_rank=q_lora_rank, latent_norm=latent_norm)):  # default: absorbs
            m.load_state_dict(plain.state_dict())
            cache = seqzoo.nn.cache.DecodeCache([m.new_state(2, 9)], 2, 9)
            steps = []
            for start, end in [(0, 4), *((i, i + 1) for i in range(4, 9))]:
                pos = torch.arange(start, end)[None]
                steps.append(m(x[:, start:end], self_attention_inputs(rope, pos, causal=True, cache=cache),
                               cache.states[0]))
                cache.advance(pos)
            torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_the_cache_holds_the_latent_and_the_shared_rotary_key_only():
    model = seqzoo.build("tiny-mla", device="cpu")
    cache = model.new_cache(2, 16)
    state = cache.states[0]
    assert state.k.shape == (2, 1, 16, 32) and state.v.shape == (2, 1, 16, 8)  # r = 32, d_r = 8
    per_token = sum(s.k[0, :, 0].numel() + s.v[0, :, 0].numel() for s in cache.states)
    assert per_token == 2 * (32 + 8)  # 2 layers × (r + d_r), against 2 × 2·4·16 for its MHA
    # the layers' position scheme rotates the d_r = 8 rotary part of 4 heads
    scheme = model.decoder.layer_positions[0]
    assert scheme.head_dim == 8 and scheme.heads == 4


def test_tiny_mla_decodes_with_its_cache_as_its_full_forward():
    model = seqzoo.build("tiny-mla", device="cpu").eval()
    ids = torch.randint(3, 259, (2, 14))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(2, 14)
        prefix = model(ids[:, :6], cache=cache)
        steps = [model(ids[:, t:t + 1], cache=cache)[:, -1] for t in range(6, 14)]
    assert (prefix - full[:, :6]).abs().max() < 1e-4
    assert (torch.stack(steps, 1) - full[:, 6:]).abs().max() < 1e-4
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0
    batched = seqzoo.generate(model, ids[:, :8], 10, attention_mask=mask, eos_id=None)
    assert torch.equal(batched, seqzoo.generate(model, ids[:, :8], 10, attention_mask=mask, eos_id=None,
                                                use_cache=False))
    assert torch.equal(batched[1, 3:], seqzoo.generate(model, ids[1:, 3:8], 10, eos_id=None)[0])
    beams = seqzoo.generate(model, ids[:1, :5], 8, beam_size=3, eos_id=None)
    assert torch.equal(beams, seqzoo.generate(model, ids[:1, :5], 8, beam_size=3, eos_id=None, use_cache=False))


@pytest.mark.slow
def test_tiny_mla_static_cache_and_compiled_step_give_the_growing_caches_tokens():
    model = seqzoo.build("tiny-mla", device="cpu").eval()
    ids = torch.randint(3, 259, (2, 8))
    expected = seqzoo.generate(model, ids, 12, eos_id=None)
    assert torch.equal(seqzoo.generate(model, ids, 12, eos_id=None, compile=True), expected)
