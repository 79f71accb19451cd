"""The fused LM-head cross-entropy equals F.cross_entropy over materialised logits — value and
gradients — and the models' ``targets=`` path equals their logits path."""
import pytest
import torch
import torch.nn.functional as F

import seqzoo
from seqzoo.nn.losses import linear_cross_entropy


def _reference(hidden, weight, targets, bias=None):
    logits = F.linear(hidden, weight, bias).float()
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=-100)


def _grads(fn, *tensors):
    for t in tensors:
        t.grad = None
    loss = fn()
    loss.backward()
    return loss.detach(), [t.grad.clone() for t in tensors]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk_rows", [None, 1, 7, 64])
def test_matches_cross_entropy_value_and_gradients(bias, chunk_rows):
    torch.manual_seed(0)
    hidden = torch.randn(3, 21, 16, requires_grad=True)  # 63 rows: chunks of 7 and 64 leave remainders
    weight = (torch.randn(50, 16) * 0.3).requires_grad_()
    b = torch.randn(50, requires_grad=True) if bias else None
    targets = torch.randint(0, 50, (3, 21))
    targets[0, :5] = -100
    targets[2, -1] = -100
    params = [hidden, weight] + ([b] if bias else [])
    want, want_grads = _grads(lambda: _reference(hidden, weight, targets, b), *params)
    got, got_grads = _grads(lambda: linear_cross_entropy(hidden, weight, targets, b, chunk_rows=chunk_rows),
                            *params)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)


def test_mostly_ignored_positions_pass_only_the_labelled_rows_through_the_head(monkeypatch):
    """Recall and copying label a few positions per row: the head sees only those rows, and the
    loss and gradients are those of the whole (B, T, V) logits."""
    import seqzoo.nn.losses as losses

    seen = []
    chunked = losses._chunked
    monkeypatch.setattr(losses, "_chunked", lambda hidden, *a: seen.append(hidden.shape[0]) or chunked(hidden, *a))
    torch.manual_seed(3)
    hidden = torch.randn(4, 32, 16, requires_grad=True)
    weight = (torch.randn(50, 16) * 0.3).requires_grad_()
    targets = torch.full((4, 32), -100)
    targets[:, 20::3] = torch.randint(0, 50, (4, 4))  # 16 of 128 positions labelled
    want, want_grads = _grads(lambda: _reference(hidden, weight, targets), hidden, weight)
    got, got_grads = _grads(lambda: linear_cross_entropy(hidden, weight, targets), hidden, weight)
    assert seen == [16]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("logit_scale", [300.0, -1.0])
def test_extreme_logits_fall_back_to_the_shifted_softmax(logit_scale):
    """Logits far above exp's range (300) or all far below it (a -300 offset): the chunks whose
    exponentials overflow or vanish are recomputed shifted and still match F.cross_entropy."""
    torch.manual_seed(7)
    hidden = torch.randn(12, 8, requires_grad=True)
    weight = torch.randn(30, 8)
    if logit_scale > 0:
        weight = weight * logit_scale
        hidden_in = hidden
    else:
        hidden_in = torch.cat([hidden, torch.ones(12, 1)], dim=1)
        weight = torch.cat([weight, torch.full((30, 1), -300.0)], dim=1)
    weight.requires_grad_()
    targets = torch.randint(0, 30, (12,))
    want, want_grads = _grads(lambda: _reference(hidden_in, weight, targets), hidden, weight)
    got, got_grads = _grads(lambda: linear_cross_entropy(hidden_in, weight, targets, chunk_rows=5),
                            hidden, weight)
    assert torch.isfinite(got)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_half_precision_model_stays_finite():
    torch.manual_seed(8)
    hidden = (torch.randn(16, 8) * 4).half().requires_grad_()
    weight = (torch.randn(24, 8) * 4).half().requires_grad_()  # logits up to ~100: exp overflows fp16
    targets = torch.randint(0, 24, (16,))
    want, want_grads = _grads(lambda: _reference(hidden.float(), weight.float(), targets), hidden, weight)
    got, got_grads = _grads(lambda: linear_cross_entropy(hidden, weight, targets, chunk_rows=6), hidden, weight)
    assert got_grads[0].dtype == torch.float16 and got_grads[1].dtype == torch.float16
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g.float(), w.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("precision", ["float32", "autocast-bf16", "bfloat16", "float16"])
def test_confident_predictions_keep_their_gradient_precision(precision):
    """p(target) ≈ 0.99997: softmax − one_hot cancels to ~3e-5 at the target. The fused loss must
    be as accurate as F.cross_entropy in the same precision (float64 is the truth)."""
    torch.manual_seed(9)
    weight = torch.randn(500, 32, dtype=torch.float64)
    targets = torch.randint(0, 500, (64,))
    hidden = weight[targets] * 2.5
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(precision, torch.float32)

    def errors(loss_fn):
        h, w = hidden.to(dtype).requires_grad_(), weight.to(dtype).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "autocast-bf16"):
            loss_fn(h, w).backward()
        truth = torch.autograd.grad(F.cross_entropy(hidden.requires_grad_() @ weight.T, targets), hidden)[0]
        hidden.requires_grad_(False)
        return (h.grad.double() - truth).norm() / truth.norm()

    fused = errors(lambda h, w: linear_cross_entropy(h, w, targets, chunk_rows=24))
    plain = errors(lambda h, w: F.cross_entropy((h @ w.T).float(), targets))
    assert fused <= 1.5 * plain + 1e-6, (fused, plain)


def test_no_double_backward_and_inference_mode_first():
    torch.manual_seed(10)
    hidden, targets = torch.randn(6, 8), torch.randint(0, 20, (6,))
    weight = torch.randn(20, 8, requires_grad=True)
    with torch.inference_mode():  # the first call in this thread makes the reused buffer
        linear_cross_entropy(hidden, weight.detach(), targets)
    loss = linear_cross_entropy(hidden, weight, targets)  # and autograd may still use it after
    (grad,) = torch.autograd.grad(loss, weight, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|double backward|does not require grad"):
        grad.sum().backward()


def test_gradcheck_float64():
    torch.manual_seed(1)
    hidden = torch.randn(9, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(11, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 3, -100, 10, 4, 4, -100, 1, 7])
    assert torch.autograd.gradcheck(
        lambda h, w, b: linear_cross_entropy(h, w, targets, b, chunk_rows=4), (hidden, weight, bias))
    # and through a second backward with a non-unit upstream gradient
    assert torch.autograd.gradcheck(
        lambda h, w: 3.0 * linear_cross_entropy(h, w, targets, chunk_rows=2), (hidden, weight))


def test_without_grad_and_all_ignored():
    torch.manual_seed(2)
    hidden, weight = torch.randn(6, 8), torch.randn(20, 8)
    targets = torch.randint(0, 20, (6,))
    torch.testing.assert_close(linear_cross_entropy(hidden, weight, targets), _reference(hidden, weight, targets))
    with torch.no_grad():
        w = weight.clone().requires_grad_()
        torch.testing.assert_close(linear_cross_entropy(hidden, w, targets), _reference(hidden, weight, targets))
    ignored = torch.full((6,), -100)
    assert torch.isnan(linear_cross_entropy(hidden, weight, ignored))
    assert torch.isnan(_reference(hidden, weight, ignored))  # the same convention as torch
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    linear_cross_entropy(h, w, ignored).backward()  # ... and, as torch's, zero gradients
    assert torch.equal(h.grad, torch.zeros_like(h)) and torch.equal(w.grad, torch.zeros_like(w))
    empty = torch.zeros(0, 8, requires_grad=True)
    linear_cross_entropy(empty, w, torch.zeros(0, dtype=torch.long)).backward()
    assert torch.equal(w.grad, torch.zeros_like(w))
    with pytest.raises(ValueError, match="targets hold 5 positions"):
        linear_cross_entropy(hidden, weight, targets[:5])


def test_only_some_inputs_need_gradients():
    torch.manual_seed(3)
    hidden = torch.randn(10, 8, requires_grad=True)
    weight = torch.randn(30, 8)  # frozen head
    targets = torch.randint(0, 30, (10,))
    _, (want,) = _grads(lambda: _reference(hidden, weight, targets), hidden)
    _, (got,) = _grads(lambda: linear_cross_entropy(hidden, weight, targets, chunk_rows=3), hidden)
    torch.testing.assert_close(got, want)
    assert weight.grad is None


def test_bfloat16_autocast_close_to_float32():
    torch.manual_seed(4)
    hidden = torch.randn(32, 16, requires_grad=True)
    weight = (torch.randn(40, 16) * 0.2).requires_grad_()
    targets = torch.randint(0, 40, (32,))
    want, want_grads = _grads(lambda: _reference(hidden, weight, targets), hidden, weight)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, got_grads = _grads(lambda: linear_cross_entropy(hidden, weight, targets, chunk_rows=8), hidden, weight)
    assert got.dtype == torch.float32 and got_grads[1].dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=5e-2, atol=5e-3)


@pytest.mark.parametrize("recipe", ["tiny-gpt", "tiny-llama", "tiny-t5", "tiny-transformer"])
def test_models_targets_equal_logits_loss(recipe):
    torch.manual_seed(5)
    model = seqzoo.build(recipe, device="cpu").train()
    vocab = model.vocab_size
    ids = torch.randint(0, vocab, (3, 12))
    targets = torch.randint(0, vocab, (3, 12))
    targets[:, :4] = -100
    params = [p for p in model.parameters() if p.requires_grad]
    if hasattr(model, "encode"):
        src = torch.randint(0, vocab, (3, 9))
        logits_fn = lambda **kw: model(src, ids, **kw)  # noqa: E731
    else:
        logits_fn = lambda **kw: model(ids, **kw)  # noqa: E731
    torch.manual_seed(6)
    want, want_grads = _grads(
        lambda: F.cross_entropy(logits_fn().flatten(0, 1), targets.flatten(), ignore_index=-100), *params)
    torch.manual_seed(6)
    got, got_grads = _grads(lambda: logits_fn(targets=targets), *params)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


# -- label smoothing and the z-loss ---------------------------------------------------------------------
def _objective(logits, targets, smoothing, z_loss):
    """(1 − ε)·(lse − x_t) + ε·(lse − mean_v x_v) + λ·lse², averaged over labelled positions: the
    module docstring's formula, written out."""
    logits, targets = logits.flatten(0, -2).double(), targets.flatten()
    real = targets != -100
    logits, targets = logits[real], targets[real]
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(1, targets[:, None])[:, 0]
    rows = (1 - smoothing) * (lse - picked) + smoothing * (lse - logits.mean(-1)) + z_loss * lse ** 2
    return rows.mean()


@pytest.mark.parametrize("smoothing, z_loss", [(0.1, 0.0), (0.0, 1e-2), (0.2, 1e-3)])
def test_cross_entropy_on_logits_is_the_formula_and_torchs_label_smoothing(smoothing, z_loss):
    from seqzoo.nn.losses import cross_entropy

    torch.manual_seed(7)
    logits = torch.randn(3, 9, 30) * 3
    targets = torch.randint(0, 30, (3, 9))
    targets[1, :4] = -100
    got = cross_entropy(logits, targets, label_smoothing=smoothing, z_loss=z_loss)
    torch.testing.assert_close(got.double(), _objective(logits, targets, smoothing, z_loss), rtol=1e-6, atol=1e-6)
    if not z_loss:
        want = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), label_smoothing=smoothing)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("smoothing, z_loss", [(0.1, 0.0), (0.0, 1e-2), (0.2, 1e-3)])
def test_fused_label_smoothing_and_z_loss_match_the_logits_objective(bias, smoothing, z_loss):
    from seqzoo.nn.losses import cross_entropy

    torch.manual_seed(8)
    hidden = torch.randn(3, 21, 16, requires_grad=True)
    weight = (torch.randn(50, 16) * 0.5).requires_grad_()
    b = torch.randn(50, requires_grad=True) if bias else None
    targets = torch.randint(0, 50, (3, 21))
    targets[0, :5] = -100
    params = [hidden, weight] + ([b] if bias else [])
    want, want_grads = _grads(lambda: cross_entropy(F.linear(hidden, weight, b), targets, label_smoothing=smoothing,
                                                    z_loss=z_loss), *params)
    got, got_grads = _grads(lambda: linear_cross_entropy(hidden, weight, targets, b, chunk_rows=7,
                                                         label_smoothing=smoothing, z_loss=z_loss), *params)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)
    with torch.no_grad():  # evaluation-style call: the same value without the gradients
        torch.testing.assert_close(linear_cross_entropy(hidden, weight, targets, b, label_smoothing=smoothing,
                                                        z_loss=z_loss), want, rtol=1e-6, atol=1e-6)


def test_the_z_loss_gradient_survives_the_shifted_softmax_of_extreme_logits():
    from seqzoo.nn.losses import cross_entropy

    torch.manual_seed(9)
    hidden = torch.randn(6, 8, requires_grad=True)
    weight = (torch.randn(20, 8) * 40).requires_grad_()  # logits far past exp's safe range
    targets = torch.randint(0, 20, (6,))
    want, want_grads = _grads(lambda: cross_entropy(F.linear(hidden, weight), targets, label_smoothing=0.1,
                                                    z_loss=1e-4), hidden, weight)
    got, got_grads = _grads(lambda: linear_cross_entropy(hidden, weight, targets, label_smoothing=0.1, z_loss=1e-4),
                            hidden, weight)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("recipe", ["tiny-gpt", "tiny-t5", "tiny-gemma2"])
def test_models_take_label_smoothing_and_z_loss_in_their_fused_loss(recipe):
    """decoder_lm and encoder_decoder pass both terms to the fused loss (tiny-gemma2's final softcap
    goes through the logits path), equal to the objective on their logits."""
    from seqzoo.nn.losses import cross_entropy

    torch.manual_seed(10)
    model = seqzoo.build(recipe, device="cpu").eval()
    vocab = model.vocab_size
    ids, targets = torch.randint(0, vocab, (2, 10)), torch.randint(0, vocab, (2, 10))
    targets[:, :3] = -100
    inputs = (torch.randint(0, vocab, (2, 7)), ids) if recipe == "tiny-t5" else (ids,)
    with torch.no_grad():
        want = cross_entropy(model(*inputs), targets, label_smoothing=0.1, z_loss=1e-3)
        got = model(*inputs, targets=targets, label_smoothing=0.1, z_loss=1e-3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
