"""The ``hf`` tokenizer: an imported folder's tokenizer.json drives ``seqzoo generate --prompt``,
travels inside seqzoo checkpoints (so they need no other file) and is written back by ``to_hf``."""
from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

import seqzoo
from seqzoo.cli import main
from seqzoo.io.checkpoint import read_metadata

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

WORDS = ["[UNK]", "[PAD]", "<s>", "</s>", "hello", "world", "the", "zoo", "of", "models", "runs", "fast"]


def word_tokenizer() -> tokenizers.Tokenizer:
    """A WordLevel tokenizer over WORDS plus filler words, splitting on whitespace."""
    vocab = {w: i for i, w in enumerate(WORDS + [f"w{i}" for i in range(64 - len(WORDS))])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens(["[PAD]", "<s>", "</s>"])
    return tok


@pytest.fixture
def llama_folder(tmp_path):
    """A tiny random LLaMA with a tokenizer.json next to it."""
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      bos_token_id=2, eos_token_id=3, pad_token_id=1)
    hf = transformers.LlamaForCausalLM(config).eval()
    folder = tmp_path / "hf"
    hf.save_pretrained(folder)
    word_tokenizer().save(str(folder / "tokenizer.json"))
    return hf, folder


def cli(*argv: str) -> int:
    from seqzoo.cli import main

    return main(list(argv))


def test_imported_recipe_names_the_hf_tokenizer_and_its_special_ids(llama_folder):
    _, folder = llama_folder
    model = seqzoo.from_hf(folder)
    spec = model.recipe["tokenizer"]
    assert spec["kind"] == "hf" and spec["path"].endswith("tokenizer.json")
    assert (spec["bos_id"], spec["eos_id"], spec["pad_id"]) == (2, 3, 1)
    tok = seqzoo.tokenizer(model)
    assert tok.encode("hello world") == [4, 5]
    assert tok.decode([4, 5, 3]) == "hello world"
    assert tok.vocab_size == 64


def test_generate_from_a_prompt_after_the_hf_folder_is_deleted(llama_folder, tmp_path, capsys):
    hf, folder = llama_folder
    ckpt = tmp_path / "m.safetensors"
    assert cli("import-hf", str(folder), "-o", str(ckpt)) == 0
    ids = torch.tensor([[4, 5]])
    with torch.no_grad():
        expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False,
                               eos_token_id=99, pad_token_id=1)[0, 2:].tolist()
    shutil.rmtree(folder)
    capsys.readouterr()
    assert main(["generate", str(ckpt), "--prompt", "hello world", "--max-new-tokens", "5"]) == 0
    out = capsys.readouterr().out.strip()
    if 3 in expected:  # the model emitted eos (</s>): generate stops there
        expected = expected[: expected.index(3) + 1]
    assert out == "hello world" + word_tokenizer().decode(expected, skip_special_tokens=True)


def test_checkpoint_stores_the_tokenizer_json_in_its_metadata(llama_folder, tmp_path):
    _, folder = llama_folder
    path = seqzoo.save(seqzoo.from_hf(folder), tmp_path / "m.safetensors")
    assert read_metadata(path)["seqzoo.tokenizer"] == (folder / "tokenizer.json").read_text()
    assert seqzoo.load(path).tokenizer_state == (folder / "tokenizer.json").read_text()


def test_recipe_built_model_with_an_hf_tokenizer_stores_it_too(llama_folder, tmp_path):
    _, folder = llama_folder
    model = seqzoo.build({"extends": "tiny-gpt", "model": {"vocab_size": 64},
                          "tokenizer": {"kind": "hf", "path": str(folder)}})
    path = seqzoo.save(model, tmp_path / "m.safetensors")
    shutil.rmtree(folder)
    assert seqzoo.tokenizer(seqzoo.load(path)).encode("the zoo") == [6, 7]


def test_bytes_tokenizer_checkpoints_are_unchanged(tmp_path):
    path = seqzoo.save(seqzoo.build("tiny-gpt"), tmp_path / "m.safetensors")
    assert "seqzoo.tokenizer" not in read_metadata(path)
    model = seqzoo.load(path)
    assert model.tokenizer_state is None  # the bytes tokenizer needs no serialised form
    assert seqzoo.tokenizer(model).encode("hi") == [104, 105]


def test_export_writes_tokenizer_files_transformers_loads(llama_folder, tmp_path):
    _, folder = llama_folder
    path = seqzoo.save(seqzoo.from_hf(folder), tmp_path / "m.safetensors")
    shutil.rmtree(folder)  # the tokenizer now lives only in the checkpoint
    out = seqzoo.to_hf(seqzoo.load(path), tmp_path / "out")
    assert (out / "tokenizer.json").exists()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok("hello world", add_special_tokens=False)["input_ids"] == [4, 5]
    assert (tok.eos_token, tok.pad_token) == ("</s>", "[PAD]")


def test_export_copies_the_tokenizer_files_next_to_the_source(llama_folder, tmp_path):
    _, folder = llama_folder
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast", "x": 1}')
    out = seqzoo.to_hf(seqzoo.from_hf(folder), tmp_path / "out")
    assert (out / "tokenizer_config.json").read_text() == (folder / "tokenizer_config.json").read_text()


# -- errors ----------------------------------------------------------------------------------------
def test_model_imported_without_tokenizer_asks_for_ids(tmp_path):
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    tok = seqzoo.tokenizer(seqzoo.from_hf(tmp_path))
    with pytest.raises(seqzoo.InputError, match=r"this model has no tokenizer .*pass token ids \(--ids\)"):
        tok.encode("hello")


def test_missing_tokenizer_file_is_named(tmp_path):
    tok = seqzoo.registry().create("tokenizer", {"kind": "hf", "path": str(tmp_path / "gone.json")})
    with pytest.raises(seqzoo.InputError, match=r"hf tokenizer: cannot read .*gone\.json"):
        tok.encode("hello")


def test_invalid_tokenizer_json_is_named(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    tok = seqzoo.registry().create("tokenizer", {"kind": "hf", "path": str(tmp_path)})
    with pytest.raises(seqzoo.InputError, match=r"hf tokenizer: not a valid tokenizer\.json"):
        tok.encode("hello")


def test_missing_tokenizers_package_says_how_to_install(tmp_path, monkeypatch):
    word_tokenizer().save(str(tmp_path / "tokenizer.json"))
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    tok = seqzoo.registry().create("tokenizer", {"kind": "hf", "path": str(tmp_path)})
    with pytest.raises(seqzoo.InputError, match=r"needs the 'tokenizers' package: pip install tokenizers"):
        tok.encode("hello")


def test_save_warns_when_the_tokenizer_file_is_gone(tmp_path):
    model = seqzoo.build({"extends": "tiny-gpt", "tokenizer": {"kind": "hf", "path": str(tmp_path / "gone")}})
    message = r"the tokenizer is not stored in the checkpoint: hf tokenizer: cannot read"
    with pytest.warns(UserWarning, match=message):
        path = seqzoo.save(model, tmp_path / "m.safetensors")
    assert "seqzoo.tokenizer" not in read_metadata(path)


# -- the bytes tokenizer exported as a byte-level tokenizer.json ------------------------------------
TEXTS = ["hello world", "héllo 😀", " two  spaces,\ttab\nand a . , ! ?", "",
         "<|eos|> <|pad|> is text too", "".join(chr(c) for c in range(1, 0x800, 7)) + "中文 ∑ 𝔘 \U0010fffd"]


@pytest.fixture
def bytes_folder(tmp_path):
    """tiny-gpt (bytes tokenizer) exported with to_hf."""
    model = seqzoo.build("tiny-gpt")
    return seqzoo.tokenizer(model), seqzoo.to_hf(model, tmp_path / "out")


def test_bytes_tokenizer_export_encodes_like_seqzoo_in_transformers(bytes_folder):
    tok, out = bytes_folder
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    hf = transformers.AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        ids = hf(text)["input_ids"]  # no bos/eos added, as seqzoo adds none
        assert ids == tok.encode(text), text
        assert hf.decode(ids) == text
    assert len(hf) == tok.vocab_size == 259


def test_bytes_tokenizer_export_encodes_like_seqzoo_in_tokenizers(bytes_folder):
    tok, out = bytes_folder
    backend = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    for text in TEXTS[:4] + TEXTS[5:]:  # plain tokenizers matches special-token text (no split flag)
        assert backend.encode(text).ids == tok.encode(text), text
        assert backend.decode(tok.encode(text)) == text
    assert backend.decode([tok.bos_id, *tok.encode("hé"), tok.eos_id, tok.pad_id]) == "hé"
    assert backend.get_vocab_size() == tok.vocab_size


def test_bytes_tokenizer_export_names_seqzoo_special_ids(bytes_folder):
    tok, out = bytes_folder
    hf = transformers.AutoTokenizer.from_pretrained(out)
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) == (tok.pad_id, tok.bos_id, tok.eos_id)
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) == (256, 257, 258)
    config = json.loads((out / "config.json").read_text())
    assert (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"]) == (256, 257, 258)
    backend = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    special = {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    assert special == {hf.pad_token: 256, hf.bos_token: 257, hf.eos_token: 258}
    assert hf.decode([257, *tok.encode("hi"), 258, 256], skip_special_tokens=True) == "hi"


def test_bytes_tokenizer_export_works_in_a_pipeline(bytes_folder):
    _, out = bytes_folder
    generate = transformers.pipeline("text-generation", model=str(out), device="cpu")
    text = generate("héllo", max_new_tokens=3, do_sample=False)[0]["generated_text"]
    assert isinstance(text, str) and text.startswith("héllo")


def test_export_without_the_tokenizers_package_warns_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.warns(UserWarning, match=r"no tokenizer written: .*needs the 'tokenizers' package"):
        out = seqzoo.to_hf(seqzoo.build("tiny-gpt"), tmp_path / "out")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


def test_tokenizer_with_no_hf_form_warns(tmp_path, monkeypatch):
    monkeypatch.delattr(seqzoo.registry().get("tokenizer", "bytes").cls, "to_hf_files")
    with pytest.warns(UserWarning, match=r"no tokenizer written: the 'bytes' tokenizer has no Hugging Face form"):
        out = seqzoo.to_hf(seqzoo.build("tiny-gpt"), tmp_path / "out")
    assert not (out / "tokenizer.json").exists()


def test_cli_export_hf_says_in_one_line_that_no_tokenizer_was_written(tmp_path, monkeypatch, capsys):
    ckpt = seqzoo.save(seqzoo.build("tiny-gpt"), tmp_path / "m.safetensors")
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    assert cli("export-hf", str(ckpt), str(tmp_path / "out")) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if "no tokenizer written" in line]
    assert len(warning) == 1 and warning[0].startswith("seqzoo: warning: ")
