"""Block options of docs/formulas.md §14, each checked against its formula.

Every expected value is computed here from plain torch ops and the modules' own weights
(projections, norm weights, sink logits); the code under test only produces the actual value.
Each test also has a negative control where it matters: the wrong wiring (cap after the mask,
sink on every logit, the norm in the wrong place, ...) must give a different result.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import seqzoo
import seqzoo.nn.blocks as blocks_module
from seqzoo.functional import masked_softmax_attend
from seqzoo.interfaces import Mixer, PositionScheme
from seqzoo.nn.attention import self_attention_inputs
from seqzoo.nn.blocks import TransformerBlock, TransformerStack
from seqzoo.plugins.norm.gemma_rmsnorm import GemmaRMSNorm


# -- plain-torch references -------------------------------------------------------------------------
def rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate-half RoPE (§3) of x (B, H, T, D) at positions (T,): pair k is dims (k, k + D/2)."""
    d = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.to(torch.float64)[:, None] * inv_freq  # (T, D/2)
    cos = torch.cat([angles.cos(), angles.cos()], -1).float()
    sin = torch.cat([angles.sin(), angles.sin()], -1).float()
    first, second = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-second, first], -1) * sin


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / √(mean(x²) + ε) over the last dim."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def allowed(t: int, window: int | None = None) -> torch.Tensor:
    """(T, T) boolean: causal, and within ``window`` keys (a query sees itself and W - 1 before it, §9)."""
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    ok = j <= i
    if window is not None:
        ok &= (i - j) < window
    return ok


def reference_attention(attn, x, mask, *, base=None, positions=None, cap=None, sinks=None, qk_norm=None,
                        gate=None):
    """Multi-head attention from ``attn``'s projection weights, in plain torch.

    mask (T, S) or broadcastable to (B, H, T, S), True where a query may attend; base: RoPE base
    (None: no rotation); cap: attention softcap c, applied to the scaled logits *before* the mask;
    sinks (H,): logits joining every softmax denominator (§14.6); qk_norm: (scope, f_q, f_k);
    gate: a linear whose σ(gate(x)) multiplies the heads' outputs (Qwen3-Next's output gate, §14.9).
    Returns (output (B, T, C), attention weights (B, H, T, S) in float64).
    """
    b, t, _ = x.shape
    h, kv, d = attn.heads, attn.kv_heads, attn.head_dim
    q, k, v = F.linear(x, attn.qkv_proj.weight, attn.qkv_proj.bias).split([h * d, kv * d, kv * d], -1)
    if qk_norm is not None and qk_norm[0] == "projection":
        q, k = qk_norm[1](q), qk_norm[2](k)
    q, k, v = (z.view(b, t, n, d).transpose(1, 2) for z, n in ((q, h), (k, kv), (v, kv)))
    if qk_norm is not None and qk_norm[0] == "head":
        q, k = qk_norm[1](q), qk_norm[2](k)
    if base is not None:
        pos = torch.arange(t) if positions is None else positions
        q, k = rope(q, pos, base), rope(k, pos, base)
    k, v = k.repeat_interleave(h // kv, 1), v.repeat_interleave(h // kv, 1)  # head i reads kv head i // (H/K)
    z = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(d)
    if cap is not None:
        z = cap * torch.tanh(z / cap)
    z = z.masked_fill(~mask, float("-inf"))
    e = z.exp()
    denominator = e.sum(-1, keepdim=True)
    if sinks is not None:
        denominator = denominator + sinks.double().exp().view(1, h, 1, 1)
    p = torch.where(denominator > 0, e / denominator, torch.zeros_like(e))  # a row seeing nothing: 0
    out = (p @ v.double()).float().transpose(1, 2).reshape(b, t, h * d)
    if gate is not None:
        out = out * torch.sigmoid(F.linear(x, gate.weight, gate.bias))
    return F.linear(out, attn.out_proj.weight, attn.out_proj.bias), p


def context(scheme, t: int, *, window=None, offset: int = 0, key_padding=None):
    return self_attention_inputs(scheme, torch.arange(offset, offset + t)[None], causal=True, window=window,
                                 key_padding=key_padding)


def capture(block: nn.Module, store: dict, key) -> None:
    """Record the (x, context) a block is called with, under ``key`` (the first call only)."""

    def hook(module, args, kwargs):
        values = dict(zip(("x", "context"), args)) | kwargs
        store.setdefault(key, (values["x"], values["context"]))

    block.register_forward_pre_hook(hook, with_kwargs=True)


def randomise(*modules: nn.Module, scale: float = 0.5) -> None:
    """Non-trivial norm weights (and biases), so that distinct norms compute distinct functions."""
    with torch.no_grad():
        for module in modules:
            for parameter in module.parameters():
                parameter.add_(torch.randn_like(parameter) * scale)


# -- 1. attention-logit softcap ---------------------------------------------------------------------
@pytest.mark.parametrize("window", [None, 3])
def test_attention_softcap_caps_scaled_logits_before_the_mask(window):
    """§14.1: z = c·tanh((q·kᵀ/√D)/c), then the mask, then the softmax; masked keys get weight 0."""
    cap = 0.5
    model = seqzoo.build("tiny-gpt", [f"model.attention.softcap={cap}"], device="cpu").eval()
    attn = model.decoder.blocks[0].mixer
    assert attn.softcap == cap
    with torch.no_grad():
        attn.qkv_proj.weight.mul_(10.0)  # logits of order 10: the cap at 0.5 bites hard
        t = 7
        x = torch.randn(2, t, 64)
        inputs = context(model.decoder.position, t, window=window)
        actual = attn(x, inputs)
        expected, p = reference_attention(attn, x, allowed(t, window), cap=cap)
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
        uncapped, _ = reference_attention(attn, x, allowed(t, window))
        assert (actual - uncapped).abs().max() > 1e-2  # the cap changed the result
        # Capping after the mask would turn -inf into -c: masked keys would get e^-c of the weight.
        wrong = cap * torch.tanh(torch.full((), float("-inf")) / cap)
        assert wrong == -cap
        # Masked (future, out-of-window) keys have no influence: change the last token only.
        x2 = x.clone()
        x2[:, -1] += 3.0 * torch.randn(2, 64)
        torch.testing.assert_close(attn(x2, inputs)[:, :-1], actual[:, :-1], atol=1e-6, rtol=0)
        assert (p.masked_select(~allowed(t, window)) == 0).all()


# -- 2. final-logit softcap -------------------------------------------------------------------------
def test_final_softcap_caps_the_head_output_and_the_loss_sees_it():
    """§14.1: logits = c·tanh(W_out h / c), c = 30 in tiny-gemma2; the loss is the CE of those logits."""
    model = seqzoo.build("tiny-gemma2", device="cpu").eval()
    uncapped = seqzoo.build("tiny-gemma2", ["model.final_softcap=null"], device="cpu").eval()
    c = model.final_softcap
    assert c == 30.0 and uncapped.final_softcap is None
    with torch.no_grad():
        model.embed.weight.mul_(50.0)  # |z| up to ~2c: the cap bites, tanh not yet saturated to c
        uncapped.load_state_dict(model.state_dict())
        ids = torch.randint(0, 259, (2, 9))
        z = uncapped(ids)  # the same weights, no cap: W_out h
        assert z.abs().max() > 1.5 * c
        logits = model(ids)
        expected = c * torch.tanh(z.double() / c)
        torch.testing.assert_close(logits.double(), expected, atol=1e-4, rtol=1e-5)
        assert logits.abs().max() < c
        targets = torch.randint(0, 259, (2, 9))
        targets[0, :3] = -100  # no loss there
        loss = model(ids, targets=targets)
        want = F.cross_entropy(expected.flatten(0, 1), targets.flatten(), ignore_index=-100)
        torch.testing.assert_close(loss.double(), want, atol=1e-5, rtol=1e-5)
        wrong = F.cross_entropy(z.flatten(0, 1), targets.flatten(), ignore_index=-100)
        assert abs(loss - wrong) > 1e-2  # training on un-capped logits would be a mismatch


# -- 3. sandwich norms ------------------------------------------------------------------------------
@pytest.mark.parametrize("layer", [0, 1])  # local (window 8) and global
def test_sandwich_block_normalises_each_sublayer_in_and_out(layer):
    """§14.3: h = x + n₂(Attn(n₁(x))), y = h + n₄(FFN(n₃(h))), plus a final norm."""
    model = seqzoo.build("tiny-gemma2", device="cpu").eval()
    block = model.decoder.blocks[layer]
    norms = [block.mixer_norm, block.mixer_out_norm, block.ffn_norm, block.ffn_out_norm]
    assert all(isinstance(n, GemmaRMSNorm) for n in norms) and len({id(n) for n in norms}) == 4
    assert isinstance(model.decoder.final_norm, GemmaRMSNorm)
    randomise(*norms)
    t = 12
    x = torch.randn(2, t, 64)
    inputs = context(model.decoder.position, t, window=block.mixer.window)
    with torch.no_grad():
        n1, n2, n3, n4 = norms
        h = x + n2(block.mixer(n1(x), inputs))
        expected = h + n4(block.ffn(n3(h)))
        torch.testing.assert_close(block(x, inputs), expected, atol=1e-5, rtol=1e-5)
        pre = x + block.mixer(n1(x), inputs)
        pre = pre + block.ffn(n3(pre))
        assert (pre - expected).abs().max() > 1e-3  # the output norms matter


# -- 4. OLMo 2 output placement ---------------------------------------------------------------------
def test_output_placement_normalises_sublayer_outputs_only():
    """§14.4: h = x + n_a(Attn(x)), y = h + n_f(FFN(h)); no input norms; a final norm."""
    model = seqzoo.build("tiny-olmo2", device="cpu").eval()
    block = model.decoder.blocks[0]
    assert block.mixer_norm is None and block.ffn_norm is None
    assert block.mixer_out_norm is not None and block.ffn_out_norm is not None
    assert not isinstance(model.decoder.final_norm, nn.Identity)
    randomise(block.mixer_out_norm, block.ffn_out_norm)
    t = 6
    x = torch.randn(2, t, 64) * 3
    inputs = context(model.decoder.position, t)
    with torch.no_grad():
        h = x + block.mixer_out_norm(block.mixer(x, inputs))
        expected = h + block.ffn_out_norm(block.ffn(h))
        torch.testing.assert_close(block(x, inputs), expected, atol=1e-5, rtol=1e-5)


# -- 5. parallel residual ---------------------------------------------------------------------------
def test_parallel_residual_reads_the_block_input_with_two_norms():
    """§14.5: y = x + Attn(N₁(x)) + FFN(N₂(x)) (GPT-NeoX)."""
    model = seqzoo.build("tiny-neox", device="cpu").eval()
    block = model.decoder.blocks[0]
    assert block.residual == "parallel" and block.ffn_norm is not None and block.ffn_norm is not block.mixer_norm
    randomise(block.mixer_norm, block.ffn_norm)
    with torch.no_grad():
        block.mixer.out_proj.weight.mul_(20.0)  # an attention output large enough to tell the wirings apart
    t = 6
    x = torch.randn(2, t, 64)
    inputs = context(model.decoder.position, t)
    with torch.no_grad():
        expected = x + block.mixer(block.mixer_norm(x), inputs) + block.ffn(block.ffn_norm(x))
        torch.testing.assert_close(block(x, inputs), expected, atol=1e-5, rtol=1e-5)
        h = x + block.mixer(block.mixer_norm(x), inputs)
        sequential = h + block.ffn(block.ffn_norm(h))
        assert (sequential - expected).abs().max() > 1e-3


def test_parallel_shared_residual_uses_one_norm():
    """§14.5: GPT-J's parallel block shares one norm: y = x + Attn(N(x)) + FFN(N(x))."""
    model = seqzoo.build("tiny-neox", ["model.residual=parallel_shared"], device="cpu").eval()
    block = model.decoder.blocks[0]
    assert block.ffn_norm is None and block.mixer_norm is not None
    assert sum(type(m) is type(block.mixer_norm) for m in block.modules()) == 1
    randomise(block.mixer_norm)
    t = 6
    x = torch.randn(2, t, 64)
    inputs = context(model.decoder.position, t)
    with torch.no_grad():
        n = block.mixer_norm(x)
        expected = x + block.mixer(n, inputs) + block.ffn(n)
        torch.testing.assert_close(block(x, inputs), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides, key", [
    (["model.placement=post"], "model.residual"),
    (["model.residual=sequential", "model.layer_types={odd: {residual: parallel, placement: sandwich}, even: {}}",
      "model.pattern=[even, odd]"], "model.layer_types.odd.residual"),
])
def test_parallel_residual_with_another_placement_is_a_recipe_error(overrides, key):
    """§14.5: the parallel residual wires pre-norm layers; any other placement is refused at the key."""
    with pytest.raises(seqzoo.RecipeError, match=key.replace(".", r"\.")):
        seqzoo.build("tiny-neox", overrides, device="meta")


# -- 6. (1 + w) RMSNorm -----------------------------------------------------------------------------
def test_gemma_rmsnorm_float32_matches_its_formula():
    """§14.2: y = x / √(mean(x²) + ε) · (1 + w)."""
    norm = GemmaRMSNorm(64, eps=1e-6)
    assert (norm.weight == 0).all()  # starts as a plain RMS scaling
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 5, 64) * 4
    expected = rms(x.double(), 1e-6) * (1 + norm.weight.double())
    with torch.no_grad():
        torch.testing.assert_close(norm(x).double(), expected, atol=1e-5, rtol=1e-5)


def test_gemma_rmsnorm_bfloat16_casts_once_at_the_end():
    """§14.2: in bf16, w is upcast before 1 is added and the float32 product is cast last."""
    norm = GemmaRMSNorm(64, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        # 1 + 0.0035 rounds to 1.0 in bf16 (spacing 2^-7 near 1): the offset survives only in float32.
        norm.weight.copy_(torch.full((64,), 0.0035) + torch.randn(64) * 1e-4)
    w = norm.weight.float()
    assert (torch.tensor(1.0, dtype=torch.bfloat16) + norm.weight == 1).all()
    x = (torch.randn(4, 16, 64) * 3).to(torch.bfloat16)
    x32 = x.float()
    normed = x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
    expected = (normed * (1 + w)).to(torch.bfloat16)
    with torch.no_grad():
        actual = norm(x)
    assert actual.dtype == torch.bfloat16
    assert torch.equal(actual, expected)
    offset_in_bf16 = (normed * (1 + norm.weight)).to(torch.bfloat16)  # (1 + w) rounded to bf16 first
    llama_order = normed.to(torch.bfloat16) * (1 + w).to(torch.bfloat16)  # cast, then multiply
    assert (offset_in_bf16 != expected).float().mean() > 0.1
    assert (llama_order != expected).float().mean() > 0.1


# -- 7. √C embedding scale in the weights' dtype ----------------------------------------------------
@pytest.mark.parametrize("dim", [48, 72])
def test_embedding_scale_is_rounded_to_the_weight_dtype(dim):
    """§14.2: embeddings × bf16(√C), in bf16 — not × the Python float √C."""
    model = seqzoo.build("tiny-gemma2", [f"model.dim={dim}"], device="cpu", dtype="bfloat16").eval()
    assert model.embed.weight.dtype == torch.bfloat16
    scale = torch.tensor(math.sqrt(dim), dtype=torch.bfloat16)
    assert scale.item() != math.sqrt(dim)  # √48 → 6.9375, √72 → 8.5
    calls = {}
    capture(model.decoder.blocks[0], calls, 0)
    ids = torch.randint(0, 259, (2, 7))
    with torch.no_grad():
        model(ids)
    first = calls[0][0]
    embedded = model.embed.weight[ids]
    expected = embedded * scale
    assert torch.equal(first, expected)
    assert not torch.equal(first, (embedded.float() * math.sqrt(dim)).to(torch.bfloat16))
    assert model.lm_head.weight is model.embed.weight  # the tied head uses the unscaled matrix


def test_embedding_scale_in_float32_is_sqrt_dim():
    """§14.2: with dim 64, √C = 8 exactly."""
    model = seqzoo.build("tiny-gemma2", device="cpu").eval()
    calls = {}
    capture(model.decoder.blocks[0], calls, 0)
    ids = torch.randint(0, 259, (1, 5))
    with torch.no_grad():
        model(ids)
    assert torch.equal(calls[0][0], model.embed.weight[ids] * 8.0)


# -- 8. attention sinks -----------------------------------------------------------------------------
@pytest.mark.parametrize("layer", [0, 1])  # sliding window 8, full
def test_attention_sinks_join_the_denominator(layer):
    """§14.6: p_ij = e^{z_ij} / (e^{s_h} + Σ_j e^{z_ij}), the sink neither scaled nor masked."""
    model = seqzoo.build("tiny-sinks", device="cpu").eval()
    attn = model.decoder.blocks[layer].mixer
    base = model.decoder.position.base
    assert attn.sinks.shape == (4,)
    with torch.no_grad():
        attn.sinks.copy_(torch.tensor([-1.0, 0.5, 2.0, 3.5]))
        attn.qkv_proj.weight.mul_(5.0)
        t = 12
        x = torch.randn(2, t, 64)
        inputs = context(model.decoder.position, t, window=attn.window)
        mask = allowed(t, attn.window)
        expected, p = reference_attention(attn, x, mask, base=base, sinks=attn.sinks)
        actual = attn(x, inputs)
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
        assert (p.sum(-1) < 1).all()
        no_sink, _ = reference_attention(attn, x, mask, base=base)  # also what s_h on every logit gives
        assert (actual - no_sink).abs().max() > 1e-3


def test_attention_sink_probabilities_and_fully_masked_rows():
    """§14.6 and §9: rows sum to less than 1; a row with no visible key attends to nothing (0, no NaN)."""
    h, t = 3, 5
    logits = torch.randn(2, h, t, t) * 2
    sink = torch.tensor([-2.0, 0.0, 1.5])
    mask = allowed(t).expand(2, 1, t, t).clone()
    mask[1, 0, 2] = False  # batch 1, query 2 sees nothing
    eye = torch.eye(t).expand(2, h, t, t)  # v = I: the output is the weight matrix itself
    probs = masked_softmax_attend(logits, eye, mask=mask, sink=sink)
    e = logits.double().exp().masked_fill(~mask, 0)
    expected = e / (sink.double().exp().view(1, h, 1, 1) + e.sum(-1, keepdim=True))
    torch.testing.assert_close(probs.double(), expected, atol=1e-6, rtol=1e-6)
    assert not probs.isnan().any()
    sums = probs.sum(-1)
    assert (sums < 1).all()
    assert (probs[1, :, 2] == 0).all() and (sums[1, :, 2] == 0).all()
    plain = masked_softmax_attend(logits, eye, mask=mask)
    assert not plain.isnan().any() and (plain[1, :, 2] == 0).all()
    torch.testing.assert_close(plain.sum(-1)[0], torch.ones(h, t))
    # adding s_h to every logit instead would leave the plain softmax: rows would sum to 1
    shifted = masked_softmax_attend(logits + sink.view(1, h, 1, 1), eye, mask=mask)
    assert (shifted.sum(-1)[0] - probs.sum(-1)[0]).abs().min() > 1e-4


def test_attention_sinks_with_a_query_that_sees_no_key():
    """§14.6: with key padding hiding query 0's only key, its attention output is 0 (no NaN)."""
    model = seqzoo.build("tiny-sinks", device="cpu").eval()
    attn = model.decoder.blocks[1].mixer
    with torch.no_grad():
        attn.sinks.normal_()
        t = 6
        x = torch.randn(1, t, 64)
        padding = torch.ones(1, t, dtype=torch.long)
        padding[0, 0] = 0
        inputs = context(model.decoder.position, t, key_padding=padding)
        actual = attn(x, inputs)
        assert not actual.isnan().any()
        torch.testing.assert_close(actual[0, 0], attn.out_proj.bias)  # zeros through the output projection
        mask = allowed(t) & padding.bool()[0][None, :]
        expected, _ = reference_attention(attn, x, mask, base=model.decoder.position.base, sinks=attn.sinks)
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


# -- 9. QK-norm over the whole projection -----------------------------------------------------------
def test_qk_norm_over_the_whole_projection():
    """§14.4: q = N_q(W_q x) over all H·D features (k over K·D), then heads, then RoPE."""
    model = seqzoo.build("tiny-olmo2", device="cpu").eval()
    attn = model.decoder.blocks[0].mixer
    assert attn.qk_norm_scope == "projection"
    assert attn.q_norm.weight.numel() == 4 * 16 and attn.k_norm.weight.numel() == 2 * 16
    randomise(attn.q_norm, attn.k_norm)
    eps, base = attn.q_norm.eps, model.decoder.position.base
    t = 7
    x = torch.randn(2, t, 64)
    inputs = context(model.decoder.position, t)
    qn = lambda q: rms(q, eps) * attn.q_norm.weight  # noqa: E731
    kn = lambda k: rms(k, eps) * attn.k_norm.weight  # noqa: E731
    with torch.no_grad():
        actual = attn(x, inputs)
        expected, _ = reference_attention(attn, x, allowed(t), base=base, qk_norm=("projection", qn, kn))
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)

        # Per head (Qwen3): another function of the same projection weights.
        per_head = seqzoo.build("tiny-olmo2", ["model.attention.qk_norm_scope=head"], device="cpu").eval()
        other = per_head.decoder.blocks[0].mixer
        assert other.q_norm.weight.numel() == 16 and other.k_norm.weight.numel() == 16
        for name in ("qkv_proj", "out_proj"):
            getattr(other, name).load_state_dict(getattr(attn, name).state_dict())
        for norm in (attn.q_norm, attn.k_norm, other.q_norm, other.k_norm):
            norm.weight.fill_(1.0)
        unit = lambda z: rms(z, eps)  # noqa: E731
        whole = attn(x, inputs)
        heads = other(x, inputs)
        torch.testing.assert_close(whole, reference_attention(attn, x, allowed(t), base=base,
                                                              qk_norm=("projection", unit, unit))[0],
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(heads, reference_attention(other, x, allowed(t), base=base,
                                                              qk_norm=("head", unit, unit))[0],
                                   atol=1e-5, rtol=1e-5)
        assert (whole - heads).abs().max() > 1e-4


# -- 10. RoPE base per layer type, NoPE layers ------------------------------------------------------
def test_gemma3_local_and_global_layers_have_their_own_rope_base():
    """§14.8: local layers rotate with base 1e4, global ones with 1e6; one scheme instance per base."""
    model = seqzoo.build("tiny-gemma3", device="cpu").eval()
    stack = model.decoder
    assert len(stack.blocks) == 6 and len(stack.schemes) == 2
    local, global_ = (stack.schemes[stack.layer_scheme[i]] for i in (0, 5))
    assert all(stack.schemes[stack.layer_scheme[i]] is local for i in range(5)) and local is not global_
    assert local.base == 1e4 and global_.base == 1e6
    assert local.scaling is None and global_.scaling is None
    assert [b.mixer.window for b in stack.blocks] == [8] * 5 + [None]
    # The stack hands each layer a context of its own scheme.
    calls = {}
    for i, block in enumerate(stack.blocks):
        capture(block, calls, i)
    with torch.no_grad():
        model(torch.randint(0, 259, (1, 10)))
    seen = {i: context for i, (_, context) in calls.items()}
    assert all(seen[i].position is local for i in range(5)) and seen[5].position is global_
    assert seen[0] is seen[4] and seen[0] is not seen[5]
    # Functionally: each layer's attention rotates with its base (positions far from 0 so it shows).
    t, offset = 10, 1000
    x = torch.randn(1, t, 64)
    pos = torch.arange(offset, offset + t)
    for layer, scheme, base, wrong in ((0, local, 1e4, 1e6), (5, global_, 1e6, 1e4)):
        attn = stack.blocks[layer].mixer
        randomise(attn.q_norm, attn.k_norm)
        qn = lambda q, attn=attn: rms(q, 1e-6) * (1 + attn.q_norm.weight)  # noqa: E731
        kn = lambda k, attn=attn: rms(k, 1e-6) * (1 + attn.k_norm.weight)  # noqa: E731
        with torch.no_grad():
            actual = attn(x, context(scheme, t, window=attn.window, offset=offset))
            mask = allowed(t, attn.window)
            expected, _ = reference_attention(attn, x, mask, base=base, positions=pos, qk_norm=("head", qn, kn))
            torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
            other, _ = reference_attention(attn, x, mask, base=wrong, positions=pos, qk_norm=("head", qn, kn))
            assert (actual - other).abs().max() > 1e-4


def test_smollm3_every_fourth_layer_has_no_position_encoding():
    """§14.7: layer 3 is NoPE (its output ignores positions); layer 0 uses RoPE base 2e6."""
    model = seqzoo.build("tiny-smollm3", device="cpu").eval()
    stack = model.decoder
    assert len(stack.schemes) == 2
    rope_scheme, nope = (stack.schemes[stack.layer_scheme[i]] for i in (0, 3))
    assert all(stack.schemes[stack.layer_scheme[i]] is rope_scheme for i in range(3))
    assert type(nope).__name__ == "NoPosition" and type(rope_scheme).__name__ == "Rope" and rope_scheme.base == 2e6
    t = 8
    x = torch.randn(2, t, 64)
    # RoPE is relative (a uniform shift changes nothing): spread the positions out instead.
    with torch.no_grad():
        for layer, moves in ((3, False), (0, True)):
            attn, scheme = stack.blocks[layer].mixer, stack.schemes[stack.layer_scheme[layer]]
            here = attn(x, context(scheme, t))
            there = attn(x, self_attention_inputs(scheme, (torch.arange(t) * 7 + 3)[None], causal=True))
            if moves:
                assert (here - there).abs().max() > 1e-4
            else:
                torch.testing.assert_close(here, there, atol=1e-6, rtol=0)
        nope_attn = stack.blocks[3].mixer
        expected, _ = reference_attention(nope_attn, x, allowed(t))
        torch.testing.assert_close(nope_attn(x, context(nope, t)), expected, atol=1e-5, rtol=1e-5)


# -- 11. per-forward work shared --------------------------------------------------------------------
def _count_calls(monkeypatch, model):
    """Wrap every scheme's prepare and the stack's self_attention_inputs; return the counters."""
    prepares = {}
    for index, scheme in enumerate(model.decoder.schemes):
        prepares[index] = 0
        original = scheme.prepare

        def counted(*args, _original=original, _index=index, **kwargs):
            prepares[_index] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(scheme, "prepare", counted)
    contexts = []
    original_inputs = blocks_module.self_attention_inputs

    def counted_inputs(*args, **kwargs):
        contexts.append((args[0], kwargs.get("window")))
        return original_inputs(*args, **kwargs)

    monkeypatch.setattr(blocks_module, "self_attention_inputs", counted_inputs)
    return prepares, contexts


def test_gemma3_per_forward_work_is_done_once_per_configuration(monkeypatch):
    """TransformerStack: masks and prepared tables once per forward per (scheme, window), not per layer."""
    model = seqzoo.build("tiny-gemma3", device="cpu").eval()
    prepares, contexts = _count_calls(monkeypatch, model)
    with torch.no_grad():
        model(torch.randint(0, 259, (2, 10)))
    assert prepares == {0: 1, 1: 1}
    assert len(contexts) == 2 and len(set(contexts)) == 2
    # The same with a KV cache: a prefill and one decode step, each once per configuration.
    prepares.update({0: 0, 1: 0})
    contexts.clear()
    cache = model.new_cache(1, 32)
    with torch.no_grad():
        model(torch.randint(0, 259, (1, 5)), cache=cache)
        model(torch.randint(0, 259, (1, 1)), cache=cache)
    assert prepares == {0: 2, 1: 2} and len(contexts) == 4


@pytest.mark.parametrize("name, configurations, schemes", [("tiny-gemma2", 2, 1), ("tiny-smollm3", 2, 2)])
def test_per_forward_work_never_scales_with_depth(monkeypatch, name, configurations, schemes):
    """One context per distinct (scheme, window): gemma2 has one scheme and two windows, smollm3
    two schemes (RoPE, NoPE, whose default prepare does nothing) and no window."""
    model = seqzoo.build(name, device="cpu").eval()
    assert len(model.decoder.schemes) == schemes
    prepares, contexts = _count_calls(monkeypatch, model)
    with torch.no_grad():
        model(torch.randint(0, 259, (1, 10)))
    assert len(contexts) == configurations < len(model.decoder.blocks)
    # A scheme's tables are prepared once per forward, whatever the number of windows it serves.
    # (NoPE's scheme prepares nothing, so it is never called: 0.)
    assert max(prepares.values()) == 1


# -- 12. blocks from plain modules ------------------------------------------------------------------
class CumulativeMean(Mixer):
    """A causal mixer: position t averages x_0 … x_t."""

    def forward(self, x, context, state=None):
        count = torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[None, :, None]
        return x.cumsum(1) / count


def _plain_formula(placement, residual, block, x):
    m = lambda z: z.cumsum(1) / torch.arange(1, z.shape[1] + 1)[None, :, None]  # noqa: E731
    f = block.ffn
    if residual == "parallel":
        return x + m(block.mixer_norm(x)) + f(block.ffn_norm(x))
    if residual == "parallel_shared":
        return x + m(block.mixer_norm(x)) + f(block.mixer_norm(x))
    if placement == "pre":
        h = x + m(block.mixer_norm(x))
        return h + f(block.ffn_norm(h))
    if placement == "post":
        h = block.mixer_norm(x + m(x))
        return block.ffn_norm(h + f(h))
    if placement == "sandwich":
        h = x + block.mixer_out_norm(m(block.mixer_norm(x)))
        return h + block.ffn_out_norm(f(block.ffn_norm(h)))
    h = x + block.mixer_out_norm(m(x))  # output
    return h + block.ffn_out_norm(f(h))


@pytest.mark.parametrize("placement, residual", [
    ("pre", "sequential"), ("post", "sequential"), ("sandwich", "sequential"), ("output", "sequential"),
    ("pre", "parallel"), ("pre", "parallel_shared"),
])
def test_block_takes_plain_modules(placement, residual):
    """§10, §14.3–14.5: every placement and residual with a hand-written mixer, nn.Linear, nn.LayerNorm."""
    c, t = 8, 5
    block = TransformerBlock(CumulativeMean(c), nn.Linear(c, c), lambda: nn.LayerNorm(c),
                             placement=placement, residual=residual).eval()
    randomise(block)
    norms = [m for m in block.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == {"pre": 2, "post": 2, "sandwich": 4, "output": 2}[placement] - (residual == "parallel_shared")
    x = torch.randn(2, t, c)
    inputs = context(PositionScheme(c, c, 1, 64), t)
    with torch.no_grad():
        torch.testing.assert_close(block(x, inputs), _plain_formula(placement, residual, block, x),
                                   atol=1e-5, rtol=1e-5)


def test_stack_of_plain_blocks_is_their_composition():
    """A TransformerStack over plain blocks is their composition (then the final norm). (Which
    placements a parallel residual takes is a recipe rule, checked once where recipes are validated:
    test_parallel_residual_with_another_placement_is_a_recipe_error.)"""
    c, t = 8, 5
    blocks = [TransformerBlock(CumulativeMean(c), nn.Linear(c, c), lambda: nn.LayerNorm(c)) for _ in range(2)]
    final = nn.LayerNorm(c)
    stack = TransformerStack(blocks, PositionScheme(c, c, 1, 64), causal=True, final_norm=final).eval()
    randomise(stack)
    x = torch.randn(2, t, c)
    with torch.no_grad():
        expected = x
        for block in blocks:
            expected = _plain_formula("pre", "sequential", block, expected)
        torch.testing.assert_close(stack(x), final(expected), atol=1e-5, rtol=1e-5)


# -- 9. the attention output gate (Qwen3-Next) --------------------------------------------------------
def test_the_output_gate_multiplies_each_heads_output_by_a_sigmoid_of_the_input():
    """§14.9: o = W_o (attend(q, k, v) ⊙ σ(W_g x)); W_g is the layer's gate_proj (C -> H·D)."""
    model = seqzoo.build("tiny-llama", ["model.position=none", "model.attention.output_gate=true"], device="cpu")
    attn = model.decoder.blocks[0].mixer
    assert attn.gate_proj.weight.shape == (attn.heads * attn.head_dim, 64)
    with torch.no_grad():
        attn.gate_proj.weight.normal_(0, 0.5)
    x, t = torch.randn(2, 7, 64), 7
    inputs = context(model.decoder.position, t)
    with torch.no_grad():
        expected, _ = reference_attention(attn, x, allowed(t), gate=attn.gate_proj)
        ungated, _ = reference_attention(attn, x, allowed(t))
        torch.testing.assert_close(attn(x, inputs), expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(expected, ungated, atol=1e-3)
    assert "gate_proj" not in "".join(seqzoo.build("tiny-llama", device="meta").state_dict())
