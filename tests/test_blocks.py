"""Block and stack options: QK-norm, embedding norm and scale, placement."""
from __future__ import annotations

import math

import torch

import seqzoo
from seqzoo.nn.attention import self_attention_inputs
from seqzoo.testing._shared import kv_cache_equivalence as _kv_cache_equivalence


def test_qk_norm_normalises_each_head_before_the_position_hook():
    model = seqzoo.build("tiny-gpt", ["model.attention.qk_norm={kind: rmsnorm, eps: 1.0e-6}",
                                      "model.position=rope"], device="cpu").eval()
    attn = model.decoder.blocks[0].mixer
    assert attn.q_norm.weight.shape == (16,) and attn.k_norm.weight.shape == (16,)
    with torch.no_grad():
        attn.q_norm.weight.normal_()
        attn.k_norm.weight.normal_()
    x = torch.randn(1, 5, 64)
    inputs = self_attention_inputs(model.decoder.position, torch.arange(5)[None], causal=True)
    # reference: project, split heads, RMS-normalise per head, rotate, attend, project
    q, k, v = attn.qkv_proj(x).split(64, dim=-1)
    heads = lambda t: t.view(1, 5, 4, 16).transpose(1, 2)  # noqa: E731
    q, k, v = heads(q), heads(k), heads(v)
    rms = lambda t, w: t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * w  # noqa: E731
    q, k = rms(q, attn.q_norm.weight), rms(k, attn.k_norm.weight)
    q, k = model.decoder.position.rotate(q, k, inputs.q_pos, inputs.q_pos)
    logits = (q @ k.transpose(-2, -1)) / 4 + torch.full((5, 5), float("-inf")).triu(1)
    expected = attn.out_proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(1, 5, 64))
    with torch.no_grad():
        torch.testing.assert_close(attn(x, inputs), expected, atol=1e-5, rtol=1e-5)
    _kv_cache_equivalence(model)


def test_embed_norm_and_scale_apply_to_token_embeddings():
    model = seqzoo.build("tiny-bloom", ["model.scale_embeddings=true"], device="cpu").eval()
    ids = torch.randint(0, 259, (1, 4))
    norm = model.decoder.embed_norm
    with torch.no_grad():
        norm.weight.normal_()
        embedded = norm(model.embed(ids) * math.sqrt(64))
        first = model.decoder.blocks[0]
        inputs = self_attention_inputs(model.decoder.position, torch.arange(4)[None], causal=True)
        expected = model.lm_head(model.decoder.final_norm(first(embedded, inputs)))
        # only one block in this check: drop the second
        model.decoder.blocks = model.decoder.blocks[:1]
        torch.testing.assert_close(model(ids), expected, atol=1e-5, rtol=1e-5)


def test_pre_norm_block_matches_its_formula():
    model = seqzoo.build("tiny-gpt", device="cpu").eval()
    block = model.decoder.blocks[0]
    x = torch.randn(2, 6, 64)
    inputs = self_attention_inputs(model.decoder.position, torch.arange(6)[None], causal=True)
    with torch.no_grad():
        h = x + block.mixer(block.mixer_norm(x), inputs)
        torch.testing.assert_close(block(x, inputs), h + block.ffn(block.ffn_norm(h)))


def test_out_bias_overrides_the_output_projection_bias():
    model = seqzoo.build("tiny-llama", ["model.attention.bias=true", "model.attention.out_bias=false"],
                         device="meta")
    attn = model.decoder.blocks[0].mixer
    assert attn.qkv_proj.bias is not None and attn.out_proj.bias is None
