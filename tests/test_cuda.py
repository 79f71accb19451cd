"""seqzoo on a CUDA device: every shipped recipe builds there and computes what it computes on the
CPU; bfloat16-autocast training stays finite; KV-cached, static and compiled decoding equal the full
forward; ``scaled_dot`` reaches SDPA's fused kernels.

Every test here is marked ``cuda`` and skipped without a GPU (tests/conftest.py). Run them with

    pytest -m cuda tests/test_cuda.py      # -m overrides the default -m 'not slow'
    bash benchmarks/gpu_check.sh           # these tests, then benchmarks/gpu.py

The helpers take the device as an argument, so their logic can be exercised CPU against CPU.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import Tensor, nn

import seqzoo
from seqzoo.nn.generation import CausalSession
from seqzoo.recipe import resolve, shipped_recipes

pytestmark = pytest.mark.cuda

CUDA = "cuda"

#: Real-size recipes are cut to this vocabulary (and a layer or two): the CPU reference forward and
#: the CPU-side initialisation of a 32k-250k vocabulary would dominate the file's run time.
MAX_VOCAB = 4096

#: Recipes with more parameters than this are shrunk (``shrink``); the others run as shipped.
SHRINK_ABOVE = 20_000_000

#: float32 with TF32 off, CPU against CUDA: both sides round differently (summation order, fused
#: kernels), not more coarsely. On the CPU, float32 against float64 differs by at most 1.2e-6 of
#: the output's largest magnitude for every (shrunk) shipped recipe, so an absolute bound of
#: 5e-5 of that magnitude leaves a factor 40. Scaled by the magnitude because the outputs range
#: from ~0.002 (recurrent seq2seq logits) to ~20 (BLOOM's).
FLOAT32_RTOL = 1e-4
FLOAT32_ATOL = 5e-5  # times the largest |reference|

#: Decoder-only recipes and position schemes the decoding tests run (as tests/test_static_decoding.py).
DECODERS = [
    ("tiny-gpt", []),  # learned positions, MHA
    ("tiny-llama", []),  # RoPE + YaRN, GQA
    ("tiny-mistral", []),  # sliding window 8 (shorter than the decode), GQA
    ("tiny-bloom", []),  # ALiBi bias over every cached key
    ("tiny-gpt", ["model.position=t5"]),
    ("tiny-gpt", ["model.position=shaw"]),
    ("tiny-gpt", ["model.attention.score=additive"]),
]

#: Every model kind that generates: decoder-only, encoder-decoder and recurrent.
GENERATORS = [("tiny-gpt", []), ("tiny-llama", []), ("tiny-mistral", []), ("tiny-bloom", []),
              ("tiny-t5", []), ("tiny-transformer", []), ("tiny-seq2seq", []),
              ("rnn-lm", ["model.dim=32", "model.hidden=32"])]


@pytest.fixture(autouse=True)
def exact_float32() -> Iterator[None]:
    """TF32 off for float32 matmuls and cuDNN (RNNs): TF32 keeps 10 mantissa bits, which would
    need tolerances loose enough to hide real mistakes. Restored afterwards."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


# -- helpers (device-agnostic) ---------------------------------------------------------------------
def shrink(name: str) -> list[str]:
    """Overrides that cut a shipped recipe down to test size, keeping its architecture (widths,
    heads, head size, position scheme, norms, FFN): at most 2 layers (1 per stack for
    encoder-decoders, 1 for widths of 2048 and more, i.e. the 7B recipes) and at most
    ``MAX_VOCAB`` tokens. Recipes of at most ``SHRINK_ABOVE`` parameters (counted on the meta
    device) run as shipped. Read from the resolved recipe, so recipes added later are shrunk too."""
    if sum(p.numel() for p in seqzoo.build(name, device="meta").parameters()) <= SHRINK_ABOVE:
        return []
    model = resolve(name).data["model"]
    dim = model.get("dim") if isinstance(model.get("dim"), int) else 0
    overrides = []
    # A recipe that alternates layer types (``pattern``) keeps one full round of them.
    pattern = len(model["pattern"]) if isinstance(model.get("pattern"), list) else 1
    for key, most in (("layers", max(pattern, 1 if dim >= 2048 else 2)), ("encoder_layers", 1),
                      ("decoder_layers", 1)):
        if isinstance(model.get(key), int) and model[key] > most:
            overrides.append(f"model.{key}={most}")
    start = model.get("decoder_start_id")
    if model.get("vocab_size", 0) > MAX_VOCAB and not (isinstance(start, int) and start >= MAX_VOCAB):
        overrides.append(f"model.vocab_size={MAX_VOCAB}")
    return overrides


def takes_target(model: nn.Module) -> bool:
    """Whether forward needs a source and a target (encoder-decoder, recurrent seq2seq) rather
    than one id tensor (decoder LM, encoder, recurrent LM): two required positional arguments."""
    required = [p for p in inspect.signature(model.forward).parameters.values()
                if p.default is inspect.Parameter.empty
                and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    return len(required) >= 2


def forward_inputs(model: nn.Module, batch: int = 2, length: int = 12, seed: int = 0) -> tuple[Tensor, ...]:
    """CPU ids for model(*inputs): (ids,) or (source, target), the target shorter than the source."""
    generator = torch.Generator().manual_seed(seed)
    vocab = model.vocab_size

    def ids(n: int) -> Tensor:
        return torch.randint(0, vocab, (batch, n), generator=generator)

    return (ids(length), ids(length - 3)) if takes_target(model) else (ids(length),)


def tensors(out: object) -> list[Tensor]:
    """The tensors of a forward's result (a tensor, or a tuple/list of them and of states)."""
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in tensors(item)]
    return []


def build_pair(name: str, overrides: list[str], device: str) -> tuple[nn.Module, nn.Module]:
    """The recipe built in float32 on the CPU and, separately, on ``device`` (buffers computed
    there, not copied), then given the CPU model's weights: both in eval mode."""
    torch.manual_seed(0)
    reference = seqzoo.build(name, overrides, device="cpu", dtype="float32").eval()
    model = seqzoo.build(name, overrides, device=device, dtype="float32").eval()
    model.load_state_dict(reference.state_dict(), strict=True)  # raises on a missing or extra key
    return reference, model


def assert_same_forward(reference: nn.Module, model: nn.Module, inputs: tuple[Tensor, ...], device: str) -> None:
    """model(*inputs on device) equals reference(*inputs) within float32 rounding."""
    with torch.no_grad():
        want = tensors(reference(*inputs))
        got = tensors(model(*(x.to(device) for x in inputs)))
    assert want and len(got) == len(want)
    for a, b in zip(got, want):
        assert a.device.type == torch.device(device).type
        scale = float(b.abs().max())
        torch.testing.assert_close(a.cpu(), b, rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL * scale + 1e-12)


def on_device(name: str, overrides: list[str], device: str) -> nn.Module:
    """A CPU-seeded float32 model moved to ``device`` (the same weights on every machine)."""
    torch.manual_seed(0)
    return seqzoo.build(name, overrides, device="cpu", dtype="float32").eval().to(device)


def prompt_list(device: str, lengths: tuple[int, ...] = (3, 9, 6), seed: int = 1) -> list[Tensor]:
    """1-D prompts of different lengths (a padded batch when generated together)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 256, (n,), generator=generator).to(device) for n in lengths]


def session_logits(model: nn.Module, ids: Tensor, mask: Tensor | None, steps: int,
                   **options: bool) -> tuple[Tensor, Tensor]:
    """Greedy decoding through a CausalSession: (logits (B, steps, V), chosen tokens (B, steps))."""
    session = CausalSession(model, ids, steps, True, mask, **options)
    token, logits, tokens = None, [], []
    for _ in range(steps):
        out = session.next(token)
        token = out.argmax(-1)
        logits.append(out)
        tokens.append(token)
    return torch.stack(logits, 1), torch.stack(tokens, 1)


def full_forward_logits(model: nn.Module, ids: Tensor, mask: Tensor | None, tokens: Tensor) -> Tensor:
    """The logits a decode of ``tokens`` after ``ids`` should have seen at each step, from one
    uncached forward over the whole sequence: (B, steps, V)."""
    sequence = torch.cat([ids, tokens[:, :-1]], dim=1)
    if mask is not None:
        mask = torch.cat([mask, mask.new_ones(tokens[:, :-1].shape)], dim=1)
    return model(sequence, attention_mask=mask)[:, ids.shape[1] - 1:].float()


def left_padded(device: str, seed: int = 2) -> tuple[Tensor, Tensor]:
    """ids (3, 6) and a left-padding mask: rows of 3, 6 and 5 real tokens."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 256, (3, 6), generator=generator)
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[0, :3] = 0
    mask[2, :1] = 0
    return ids.to(device), mask.to(device)


def sdpa_ops(run: Callable[[], object]) -> set[str]:
    """The names of the scaled-dot-product-attention ops ``run()`` dispatches to (profiler op
    events: aten::_scaled_dot_product_flash_attention, ..._efficient_attention, ..._cudnn_attention,
    ..._attention_math, and on the CPU ..._flash_attention_for_cpu)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return {event.name for event in prof.events() if "_scaled_dot_product" in event.name}


#: SDPA ops that are fused kernels. cuDNN's counts too: recent torch builds put it first on Hopper
#: when cuDNN is new enough (see torch's ``check_prefer_cudnn_attention``).
FUSED_SDPA = ("flash_attention", "efficient_attention", "cudnn_attention")


# -- every shipped recipe, CPU against CUDA ----------------------------------------------------------
@pytest.mark.parametrize("name", shipped_recipes())
def test_shipped_recipe_builds_on_cuda_and_matches_the_cpu(name):
    overrides = shrink(name)
    reference, model = build_pair(name, overrides, CUDA)
    for tensor in [*model.parameters(), *model.buffers()]:
        assert tensor.device.type == torch.device(CUDA).type
    assert_same_forward(reference, model, forward_inputs(reference), CUDA)


# -- bfloat16 autocast training ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama", "tiny-mistral", "tiny-bloom"])
def test_bfloat16_autocast_training_steps_stay_finite_and_learn(name):
    model = on_device(name, [], CUDA).train()
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 256, (8, 65), generator=generator).to(CUDA)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    with torch.no_grad():
        float32_loss = model(inputs, targets=targets).item()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    losses = []
    for _ in range(10):
        with torch.autocast(CUDA, dtype=torch.bfloat16):
            loss = model(inputs, targets=targets)
        assert loss.dim() == 0 and torch.isfinite(loss), f"loss {loss}"
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for pname, param in model.named_parameters():
            assert param.grad is not None, f"{pname} got no gradient"
            assert torch.isfinite(param.grad).all(), f"{pname} has a non-finite gradient"
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # A random model predicts about uniformly: ln V. bf16 autocast is close to float32.
    assert abs(losses[0] - math.log(model.vocab_size)) < 1.0
    assert abs(losses[0] - float32_loss) < 0.05
    assert losses[-1] < losses[0] - 0.2, f"10 steps on one batch did not learn: {losses}"


# -- decoding ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("recipe", "overrides"), GENERATORS)
def test_cached_generate_equals_uncached_on_cuda(recipe, overrides):
    """Greedy seqzoo.generate with the KV cache (or recurrent state) equals use_cache=False, which
    recomputes the whole prefix every step; for a padded list of prompts too, each equal to its
    prompt alone; and the tokens are the ones the CPU model chooses."""
    model = on_device(recipe, overrides, CUDA)
    generator = torch.Generator().manual_seed(4)
    ids = torch.randint(1, 256, (2, 5), generator=generator)
    cached = seqzoo.generate(model, ids.to(CUDA), 16, eos_id=None)
    assert cached.device.type == torch.device(CUDA).type
    assert torch.equal(cached, seqzoo.generate(model, ids.to(CUDA), 16, eos_id=None, use_cache=False))
    cpu = on_device(recipe, overrides, "cpu")
    assert torch.equal(cached.cpu(), seqzoo.generate(cpu, ids, 16, eos_id=None))
    prompts = prompt_list(CUDA)
    together = seqzoo.generate(model, prompts, 12, eos_id=None)
    uncached = seqzoo.generate(model, prompts, 12, eos_id=None, use_cache=False)
    for prompt, out, reference in zip(prompts, together, uncached):
        assert torch.equal(out, reference)
        assert torch.equal(out, seqzoo.generate(model, prompt, 12, eos_id=None)[0])


@pytest.mark.parametrize(("recipe", "overrides"), DECODERS)
@pytest.mark.parametrize("padded", [False, True])
def test_cached_and_static_decoding_equal_the_full_forward_on_cuda(recipe, overrides, padded):
    """Step by step, the growing KV cache and the static one give the logits of one uncached
    forward over the decoded sequence (left padding included)."""
    model = on_device(recipe, overrides, CUDA)
    if padded:
        ids, mask = left_padded(CUDA)
    else:
        ids, mask = left_padded(CUDA)[0], None
    with torch.inference_mode():
        growing, tokens = session_logits(model, ids, mask, 20)
        static, static_tokens = session_logits(model, ids, mask, 20, static=True)
        full = full_forward_logits(model, ids, mask, tokens)
    assert growing.device.type == torch.device(CUDA).type
    torch.testing.assert_close(growing, full, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(static, full, atol=1e-4, rtol=1e-4)
    assert torch.equal(static_tokens, tokens)


def test_static_decoding_in_bfloat16_stays_close_to_the_growing_cache_on_cuda():
    """The way the 7B recipes run (bfloat16 weights): static and growing caches agree to bf16
    rounding, with no NaN from the masked, not-yet-written cache slots."""
    model = on_device("tiny-llama", [], CUDA).to(torch.bfloat16)
    ids, mask = left_padded(CUDA)
    with torch.inference_mode():
        growing, _ = session_logits(model, ids, mask, 12)
        static, _ = session_logits(model, ids, mask, 12, static=True)
    assert torch.isfinite(static).all()
    torch.testing.assert_close(static, growing, atol=2e-2, rtol=2e-2)


def test_generate_compiled_equals_eager_on_cuda():
    """generate(compile=True): a static cache and a compiled (inductor/Triton) decode step give the
    eager tokens, and the second call reuses the graph: one per model structure and batch size."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    for recipe in ("tiny-gpt", "tiny-llama"):
        model = on_device(recipe, [], CUDA)
        prompts = prompt_list(CUDA)
        eager = seqzoo.generate(model, prompts, 20, eos_id=None)
        for _ in range(2):
            compiled = seqzoo.generate(model, prompts, 20, eos_id=None, compile=True)
            assert all(torch.equal(a, b) for a, b in zip(compiled, eager))
    assert counters["stats"]["unique_graphs"] == 2


# -- fused attention kernels ---------------------------------------------------------------------
def _score(heads: int) -> nn.Module:
    return seqzoo.registry().create("score", {"kind": "scaled_dot"}, 64, 64, heads).eval()


@pytest.mark.parametrize("kv_heads", [8, 2])
@pytest.mark.parametrize("causal", [True, False])
def test_scaled_dot_without_bias_runs_on_flash_or_memory_efficient_sdpa(kv_heads, causal):
    """With only the flash and memory-efficient backends allowed, SDPA raises rather than fall
    back to the math kernel: scaled_dot's call (no bias, no mask; grouped KV heads) is one they
    take, forward and backward. Its output equals the float32 reference to bf16 rounding."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    generator = torch.Generator().manual_seed(5)
    q = torch.randn(2, 8, 128, 64, generator=generator)
    k, v = (torch.randn(2, kv_heads, 128, 64, generator=generator) for _ in range(2))
    score = _score(8)
    want = score.attend(q, k, v, causal=causal)  # float32 on the CPU
    q, k, v = (x.to(CUDA, torch.bfloat16).requires_grad_() for x in (q, k, v))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        out = score.attend(q, k, v, causal=causal)
        out.float().square().sum().backward()
    assert out.dtype == torch.bfloat16 and all(torch.isfinite(x.grad).all() for x in (q, k, v))
    torch.testing.assert_close(out.float().cpu(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("recipe", ["tiny-gpt", "tiny-llama", "tiny-bert"])
def test_models_attend_through_a_fused_sdpa_kernel_not_math(recipe):
    """A bfloat16 forward of a whole model without padding (no mask, no bias) runs under the
    flash/memory-efficient-only restriction, and left to itself SDPA picks a fused kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = on_device(recipe, [], CUDA).to(torch.bfloat16)
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(6)).to(CUDA)
    with torch.no_grad():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            restricted = model(ids)
        ops = sdpa_ops(lambda: model(ids))
    assert any(kind in op for op in ops for kind in FUSED_SDPA), f"no fused SDPA op among {ops}"
    assert not any("math" in op for op in ops), f"SDPA fell back to the math kernel: {ops}"
    assert torch.isfinite(restricted).all()


def test_bfloat16_training_step_runs_on_fused_sdpa_kernels():
    """Backward too: a bf16-autocast training step with only flash/memory-efficient SDPA allowed."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = on_device("tiny-gpt", [], CUDA).train()
    ids = torch.randint(0, 256, (4, 129), generator=torch.Generator().manual_seed(7)).to(CUDA)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        with torch.autocast(CUDA, dtype=torch.bfloat16):
            loss = model(ids[:, :-1], targets=ids[:, 1:])
        loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
