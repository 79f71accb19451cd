"""FlexAttention behind the score interface (``seqzoo.nn.flex``): every variant that would
materialise its logits — softcap and windows (Gemma 2), ALiBi and T5 biases (causal and
bidirectional), sinks, packed documents, key padding, a KV cache — gives the materialised path's
outputs through flex's score and mask modifications.

The fast tests run flex_attention eagerly (``flex.COMPILE = False``: the same modifications,
evaluated by torch's reference implementation), so they check seqzoo's modifications and masks in
seconds; the slow ones run the compiled kernel (~15 s to compile per model on 2 CPU cores); the
CUDA ones check the backward, which torch does not compile on the CPU.
"""
from __future__ import annotations

import os
import warnings

import pytest
import torch

import seqzoo
from seqzoo.errors import PerformanceWarning
from seqzoo.nn import flex

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # eager flex warns that it is slow

CASES = [("tiny-gemma2", []),                              # softcap + sliding window, local/global layers
         ("tiny-bloom", []),                               # ALiBi, causal
         ("tiny-gpt", ["model.position=t5"]),              # T5 buckets, causal
         ("tiny-gpt", ["model.position=hard_alibi"]),      # hard windows per head, causal
         ("tiny-bert", ["model.position=alibi"]),          # ALiBi, bidirectional, key padding
         ("tiny-t5", []),                                  # T5 buckets both ways, encoder-decoder
         ("tiny-sinks", [])]                               # attention sinks (log-sum-exp)


@pytest.fixture
def small(monkeypatch):
    """flex for every length (the thresholds are for speed, not correctness), counted."""
    monkeypatch.setattr(flex, "MIN_KEYS", 1)
    monkeypatch.setattr(flex, "MIN_QUERIES", 1)
    monkeypatch.setattr(flex, "_failed", None)
    calls, attend = [], flex.attend
    monkeypatch.setattr(flex, "attend", lambda *a, **k: calls.append(1) or attend(*a, **k))
    return calls


def outputs(model, ids, **kwargs):
    with torch.no_grad():
        out = model(ids, ids, **kwargs) if model.family == "seq2seq" else model(ids, **kwargs)
    return out if torch.is_tensor(out) else out.logits


def both_paths(model, ids, monkeypatch, **kwargs):
    monkeypatch.setenv("SEQZOO_FLEX", "1")
    through_flex = outputs(model, ids, **kwargs)
    monkeypatch.setenv("SEQZOO_FLEX", "0")
    return through_flex, outputs(model, ids, **kwargs)


def padded_batch(family: str):
    ids = torch.randint(3, 200, (2, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 40, dtype=torch.long)
    if family == "decoder":
        mask[1, :5] = 0   # left padding, as batched generation pads
    elif family == "encoder":
        mask[1, -7:] = 0  # right padding
    return ids, ({} if family == "seq2seq" else {"attention_mask": mask})


@pytest.mark.parametrize(("recipe", "overrides"), CASES)
def test_flex_modifications_equal_the_materialised_path(recipe, overrides, small, monkeypatch):
    monkeypatch.setattr(flex, "COMPILE", False)
    torch.manual_seed(0)
    model = seqzoo.build(recipe, overrides, device="cpu").eval()
    ids, kwargs = padded_batch(model.family)
    got, expected = both_paths(model, ids, monkeypatch, **kwargs)
    assert small, "flex was not used"
    real = kwargs["attention_mask"].bool() if kwargs else torch.ones(ids.shape, dtype=torch.bool)
    torch.testing.assert_close(got[real], expected[real], atol=2e-5, rtol=1e-5)


def test_packed_documents_and_a_kv_cache_through_flex(small, monkeypatch):
    monkeypatch.setattr(flex, "COMPILE", False)
    torch.manual_seed(0)
    model = seqzoo.build("tiny-gemma2", device="cpu").eval()
    ids = torch.randint(3, 200, (2, 48), generator=torch.Generator().manual_seed(1))
    documents = torch.tensor([[0] * 20 + [1] * 28, [0] * 5 + [1] * 30 + [2] * 13])
    got, expected = both_paths(model, ids, monkeypatch, documents=documents)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
    # a prompt fed in two pieces through the cache: the second piece's mask is bottom-right aligned
    monkeypatch.setenv("SEQZOO_FLEX", "1")
    with torch.no_grad():
        cache = model.new_cache(2, 48)
        first = model(ids[:, :30], cache=cache)
        second = model(ids[:, 30:], cache=cache)
    whole = outputs(model, ids)
    torch.testing.assert_close(torch.cat([first, second], 1), whole, atol=2e-5, rtol=1e-5)


def test_rows_that_see_no_key_are_zeros_as_on_the_materialised_path(monkeypatch):
    monkeypatch.setattr(flex, "COMPILE", False)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    hidden = torch.ones(1, 1, 8, 8, dtype=torch.bool)
    hidden[..., 3, :] = False  # query 3 sees nothing
    context = seqzoo.interfaces.MixerContext(position=None, q_pos=torch.arange(8)[None], k_pos=torch.arange(8)[None],
                                             mask=hidden, prepared={})
    blocks = flex.block_mask(context, 8, 8, q.device)
    out = flex.attend(q, k, v, scale=0.5, score_mod=flex.softcap_mod(5.0), blocks=blocks)
    assert torch.equal(out[:, :, 3], torch.zeros(1, 2, 4)) and torch.isfinite(out).all()


def test_a_flex_forward_never_builds_the_bias_table(small, monkeypatch):
    monkeypatch.setattr(flex, "COMPILE", False)
    model = seqzoo.build("tiny-bloom", device="cpu").eval()
    built = []
    scheme = model.decoder.position
    prepare = scheme.prepare
    monkeypatch.setattr(scheme, "prepare", lambda *a: built.append(1) or prepare(*a))
    monkeypatch.setenv("SEQZOO_FLEX", "1")
    outputs(model, torch.randint(3, 200, (1, 24)))
    assert small and not built
    monkeypatch.setenv("SEQZOO_FLEX", "0")
    outputs(model, torch.randint(3, 200, (1, 24)))
    assert built == [1]  # once per forward, shared by the layers


def test_flex_stays_off_where_it_does_not_apply(small, monkeypatch):
    monkeypatch.setattr(flex, "COMPILE", False)
    monkeypatch.setenv("SEQZOO_FLEX", "1")
    ids = torch.randint(3, 200, (1, 16))
    outputs(seqzoo.build("tiny-llama", device="cpu").eval(), ids)        # plain causal: SDPA's
    outputs(seqzoo.build("tiny-gpt", ["model.position=shaw"], device="cpu").eval(), ids)  # no flex form
    assert not small
    model = seqzoo.build("tiny-bloom", device="cpu")
    model(ids, targets=ids).backward()                                     # autograd on the CPU
    assert not small


def test_a_compile_failure_is_reported_once_and_the_materialised_path_runs(small, monkeypatch, recwarn):
    from torch._inductor.exc import InductorError

    def broken(*args, **kwargs):
        raise InductorError(RuntimeError("no C++ compiler"), None)

    monkeypatch.setattr(flex, "_kernel", broken)
    monkeypatch.setenv("SEQZOO_FLEX", "1")
    model = seqzoo.build("tiny-bloom", device="cpu").eval()
    ids = torch.randint(3, 200, (1, 24))
    got = outputs(model, ids)
    outputs(model, ids)
    monkeypatch.setenv("SEQZOO_FLEX", "0")
    torch.testing.assert_close(got, outputs(model, ids))
    notice = [str(w.message) for w in recwarn if issubclass(w.category, PerformanceWarning)]
    assert len(notice) == 1 and "FlexAttention is unavailable here" in notice[0] and "no C++ compiler" in notice[0]


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "overrides"), CASES[:4])
def test_the_compiled_kernel_equals_the_materialised_path(recipe, overrides, small, monkeypatch):
    torch.manual_seed(0)
    model = seqzoo.build(recipe, overrides, device="cpu").eval()
    ids, kwargs = padded_batch(model.family)
    got, expected = both_paths(model, ids, monkeypatch, **kwargs)
    assert small
    real = kwargs["attention_mask"].bool() if kwargs else torch.ones(ids.shape, dtype=torch.bool)
    torch.testing.assert_close(got[real], expected[real], atol=2e-5, rtol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize(("recipe", "overrides"), CASES)
def test_flex_forward_and_backward_equal_the_materialised_path_on_cuda(recipe, overrides, small, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.manual_seed(0)
    model = seqzoo.build(recipe, overrides, device="cuda")
    ids, kwargs = padded_batch(model.family)
    ids = ids.cuda()
    kwargs = {key: value.cuda() for key, value in kwargs.items()}

    def loss_and_grads(enabled: str):
        os.environ["SEQZOO_FLEX"] = enabled
        model.zero_grad()
        out = model(ids, ids, **kwargs) if model.family == "seq2seq" else model(ids, **kwargs)
        out = out if torch.is_tensor(out) else out.logits
        out.float().square().mean().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, got_grads = loss_and_grads("1")
        expected, expected_grads = loss_and_grads("0")
    assert small
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=1e-4, rtol=1e-3, msg=name)


# -- training on the CPU: the materialised path block by block, each block recomputed in the backward
@pytest.fixture(params=["blocked", "query blocks"])
def blocks_of_eight(request, monkeypatch):
    """Training attention in small blocks, by either path: ``blocked`` (queries and keys in blocks
    of 8 with an online softmax, seqzoo.nn.blocked) or ``query blocks`` (the path for dropout and
    scores that are not a scaled dot product: queries in blocks, each checkpointed)."""
    import seqzoo.nn.attention as attention
    import seqzoo.nn.blocked as blocked

    monkeypatch.setattr(attention, "BLOCKWISE_FROM", 8)
    calls = []
    if request.param == "blocked":
        monkeypatch.setattr(blocked, "BLOCK", 8)
        run = blocked.blocked_attention
        monkeypatch.setattr(blocked, "blocked_attention", lambda *a: calls.append(1) or run(*a))
        return calls
    monkeypatch.setattr(attention.MultiHeadAttention, "_blocked", lambda *a: None)
    monkeypatch.setattr(attention, "BLOCK_QUERIES", 8)
    # blocks shrink (8 -> 4 -> 2 queries) once a block would read more than 160 logits per head:
    # a 40-token causal sequence takes blocks of every size
    monkeypatch.setattr(attention, "BLOCK_LOGITS", 160)
    monkeypatch.setattr(attention, "MIN_BLOCK", 2)
    blockwise = attention.MultiHeadAttention._blockwise
    monkeypatch.setattr(attention.MultiHeadAttention, "_blockwise",
                        lambda *a: calls.append(1) or blockwise(*a))
    return calls


def loss_and_grads(model, ids, **kwargs):
    model.zero_grad()
    out = model(ids, ids, **kwargs) if model.family == "seq2seq" else model(ids, **kwargs)
    out = out if torch.is_tensor(out) else out.logits
    (out.float().square() * torch.linspace(0, 1, out.shape[-1], device=out.device)).mean().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("recipe", "overrides"), CASES + [("tiny-gemma2", ["model.attention.window=5"])])
def test_blockwise_training_equals_the_whole_materialised_path(recipe, overrides, blocks_of_eight, monkeypatch):
    import seqzoo.nn.attention as attention

    torch.manual_seed(0)
    model = seqzoo.build(recipe, overrides, device="cpu")
    ids, kwargs = padded_batch(model.family)
    got, got_grads = loss_and_grads(model, ids, **kwargs)
    assert blocks_of_eight, "the blockwise path did not run"
    monkeypatch.setattr(attention, "BLOCKWISE_FROM", 10 ** 9)
    expected, expected_grads = loss_and_grads(model, ids, **kwargs)
    real = kwargs["attention_mask"].bool() if kwargs else torch.ones(ids.shape, dtype=torch.bool)
    torch.testing.assert_close(got[real], expected[real], atol=2e-5, rtol=1e-5)
    assert got_grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_blockwise_training_with_packed_documents(blocks_of_eight, monkeypatch):
    import seqzoo.nn.attention as attention

    torch.manual_seed(0)
    model = seqzoo.build("tiny-bloom", device="cpu")
    ids = torch.randint(3, 200, (2, 48), generator=torch.Generator().manual_seed(1))
    documents = torch.tensor([[0] * 20 + [1] * 28, [0] * 5 + [1] * 30 + [2] * 13])
    got, got_grads = loss_and_grads(model, ids, documents=documents)
    monkeypatch.setattr(attention, "BLOCKWISE_FROM", 10 ** 9)
    expected, expected_grads = loss_and_grads(model, ids, documents=documents)
    assert blocks_of_eight
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_a_flex_forward_never_builds_the_whole_mask(small, monkeypatch):
    """The mask is deferred (MaskSpec): flex's block mask reads it one block of 128 rows at a time."""
    from seqzoo.interfaces import MaskSpec

    monkeypatch.setattr(flex, "COMPILE", False)
    monkeypatch.setenv("SEQZOO_FLEX", "1")
    widths, rows = [], MaskSpec.rows
    monkeypatch.setattr(MaskSpec, "rows",
                        lambda self, start, stop: widths.append(stop - start) or rows(self, start, stop))
    model = seqzoo.build("tiny-gemma2", device="cpu").eval()
    outputs(model, torch.randint(3, 200, (1, 300)))
    assert small and widths and max(widths) <= flex.BLOCK


@pytest.mark.cuda
@pytest.mark.parametrize(("recipe", "overrides"), CASES)
def test_flex_on_cuda_equals_the_cpu_blocked_path(recipe, overrides, small, monkeypatch):
    """The two paths a user trains through at long context, one per device, agree: FlexAttention on
    CUDA and the CPU's blocks with an online softmax (blocks of 8 here), in loss and gradients."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import seqzoo.nn.attention as attention
    import seqzoo.nn.blocked as blocked

    torch.manual_seed(0)
    model = seqzoo.build(recipe, overrides, device="cpu")
    ids, kwargs = padded_batch(model.family)
    monkeypatch.setattr(attention, "BLOCKWISE_FROM", 8)
    monkeypatch.setattr(blocked, "BLOCK", 8)
    on_cpu, cpu_grads = loss_and_grads(model, ids, **kwargs)
    model.cuda()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on_cuda, cuda_grads = loss_and_grads(model, ids.cuda(), **{k: v.cuda() for k, v in kwargs.items()})
    assert small
    real = kwargs["attention_mask"].bool() if kwargs else torch.ones(ids.shape, dtype=torch.bool)
    torch.testing.assert_close(on_cuda.cpu()[real], on_cpu[real], atol=1e-4, rtol=1e-4)
    for name, grad in cpu_grads.items():
        torch.testing.assert_close(cuda_grads[name].cpu(), grad, atol=1e-4, rtol=1e-3, msg=name)
