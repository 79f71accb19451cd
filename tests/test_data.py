"""`seqzoo data prepare` and `seqzoo data tokenizer`: corpora of every format to token shards, split,
deterministic, streamed, verified; the window sampler; and every refusal, by its message."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import seqzoo
from seqzoo.cli import main
from seqzoo.data.prepare import TokenizerInfo, held_out, held_out_count, prepare
from seqzoo.data.shards import DataError, WindowSampler, evaluation_windows, open_shards
from seqzoo.data.sources import find_sources
from seqzoo.data.tokenizer import resolve_tokenizer, train_bpe

BYTES = seqzoo.registry().create("tokenizer", "bytes")
EOS = BYTES.eos_id


def bytes_info() -> TokenizerInfo:
    return TokenizerInfo(BYTES, {"kind": "bytes"})


def corpus(folder, texts: dict[str, str]):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return folder


def documents_of(split) -> list[bytes]:
    """Each document of a split as its bytes, its end token checked and dropped."""
    out = []
    starts = split.starts.tolist()
    for a, b in zip(starts, starts[1:]):
        ids = split.tokens[a:b].tolist()
        assert ids[-1] == EOS  # every document ends with the end token
        out.append(bytes(ids[:-1]))
    return out


# -- splits ----------------------------------------------------------------------------------------
def test_held_out_documents_are_spread_evenly_and_counted_exactly():
    assert [i for i in range(10) if held_out(i, 10, 2)] == [4, 9]
    assert sum(held_out(i, 1000, 100) for i in range(1000)) == 100
    assert held_out_count(10, 0.1) == 1 and held_out_count(10, 0.01) == 1  # at least one
    assert held_out_count(2, 0.9) == 1  # at least one document trains
    assert held_out_count(1, 0.5) == 0 and held_out_count(10, 0.0) == 0


def test_a_folder_of_text_files_becomes_documents_split_by_document(tmp_path):
    texts = {f"d{i}.txt": f"document number {i}\n" for i in range(10)}
    done = prepare([str(corpus(tmp_path / "c", texts))], tmp_path / "out", bytes_info(), val=0.2, workers=0)
    shards = open_shards(tmp_path / "out")
    assert done.manifest["split"] == "document"
    train, val = documents_of(shards.train), documents_of(shards.val)
    assert val == [b"document number 4\n", b"document number 9\n"]
    assert train == [f"document number {i}\n".encode() for i in range(10) if i not in (4, 9)]
    assert shards.manifest["splits"]["train"]["tokens"] == sum(len(d) + 1 for d in train)
    assert shards.manifest["tokenizer"] == {"spec": {"kind": "bytes"}, "identity": "bytes", "vocab_size": 259,
                                            "eos_id": EOS}
    assert shards.manifest["dtype"] == "uint16" and shards.train.tokens.dtype == np.uint16


def test_one_document_is_split_by_position_like_nanogpt(tmp_path):
    text = "abcdefghij" * 10  # 100 bytes + the end token = 101 tokens
    (tmp_path / "one.txt").write_text(text)
    done = prepare([str(tmp_path / "one.txt")], tmp_path / "out", bytes_info(), val=0.1, workers=0)
    shards = open_shards(tmp_path / "out")
    assert done.manifest["split"] == "position"
    held = round(101 * 0.1)
    assert shards.val.tokens.tolist() == [*text.encode()[101 - held:], EOS][-held:]
    assert shards.train.tokens.tolist() == list(text.encode()[:101 - held])
    assert shards.train.starts.tolist() == [0, 101 - held] and shards.val.starts.tolist() == [0, held]


def test_jsonl_parquet_and_a_saved_dataset_are_read_through_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    records = [{"text": f"record {i}", "id": i} for i in range(6)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in records[:3]) + "\n\n")
    datasets.Dataset.from_list(records[3:5]).to_parquet(str(tmp_path / "b.parquet"))
    datasets.Dataset.from_list(records[5:]).save_to_disk(str(tmp_path / "saved"))
    prepare([str(tmp_path / "a.jsonl"), str(tmp_path / "b.parquet"), str(tmp_path / "saved")], tmp_path / "out",
            bytes_info(), val=0.2, workers=0)
    shards = open_shards(tmp_path / "out")
    everything = documents_of(shards.train) + documents_of(shards.val)
    assert sorted(everything) == sorted(f"record {i}".encode() for i in range(6))
    assert [s[1] for s in shards.manifest["sources"]] == ["json", "parquet", "arrow"]


def test_a_folder_is_walked_in_path_order_with_glob_and_exclude(tmp_path):
    corpus(tmp_path, {"b.py": "b", "a/c.py": "c", "a/skip/d.py": "d", "e.txt": "e", ".hidden/f.py": "f",
                      "__pycache__/g.py": "g"})
    names = [s.name for s in find_sources([str(tmp_path)], glob="*.py", exclude=("skip",))]
    assert names == ["a/c.py", "b.py"]


# -- determinism, resumption of nothing, and atomicity ------------------------------------------------
def test_prepare_is_deterministic_with_or_without_workers_and_a_rerun_does_nothing(tmp_path, capsys):
    texts = {f"f{i:02d}.txt": ("line %d of file %d\n" % (j, i)) * 50 for i in range(12) for j in range(1)}
    src = corpus(tmp_path / "c", texts)
    prepare([str(src)], tmp_path / "inline", bytes_info(), workers=0)
    prepare([str(src)], tmp_path / "pool", bytes_info(), workers=2)  # forced workers, however small
    for name in ("train.bin", "train.idx", "val.bin", "val.idx"):
        assert (tmp_path / "inline" / name).read_bytes() == (tmp_path / "pool" / name).read_bytes(), name
    inline = json.loads((tmp_path / "inline" / "manifest.json").read_text())
    pool = json.loads((tmp_path / "pool" / "manifest.json").read_text())
    assert inline["fingerprint"] == pool["fingerprint"] and inline["splits"] == pool["splits"]
    assert main(["data", "prepare", str(src), "-o", str(tmp_path / "inline"), "--quiet"]) == 0
    assert "up to date (same sources, tokenizer and settings); nothing to do" in capsys.readouterr().out
    (src / "f00.txt").write_text("changed\n")
    assert main(["data", "prepare", str(src), "-o", str(tmp_path / "inline"), "--quiet"]) == 0
    assert "nothing to do" not in capsys.readouterr().out


def test_the_progress_line_ends_at_the_files_size_whatever_the_text_decodes_to(tmp_path, capsys):
    """CRLF lines decode shorter than the file and undecodable bytes longer (each becomes U+FFFD,
    three UTF-8 bytes): the count stays within the total and ends exactly on it."""
    src = tmp_path / "c"
    src.mkdir()
    (src / "a.txt").write_bytes(b"\xff\xfe bad bytes \xc3\x28\n" * 400)  # longer once decoded
    (src / "b.txt").write_bytes(b"windows line\r\n" * 400)  # shorter once decoded
    size = sum(f.stat().st_size for f in src.iterdir())
    assert main(["data", "prepare", str(src), "-o", str(tmp_path / "out")]) == 0
    lines = capsys.readouterr().err.splitlines()  # B 1,234/12,000 (10%) · docs=... when not on a terminal
    counts = [word for line in lines for word in line.split()[1:2] if "/" in word]
    done = [int(c.split("/")[0].replace(",", "")) for c in counts]
    assert counts and counts[-1] == f"{size:,}/{size:,}" and max(done) <= size, counts


def test_a_prepare_killed_midway_leaves_no_manifest(tmp_path, monkeypatch):
    import seqzoo.data.prepare as module

    src = corpus(tmp_path / "c", {f"{i}.txt": "x" * 100 for i in range(5)})
    prepare([str(src)], tmp_path / "out", bytes_info(), workers=0)
    assert (tmp_path / "out" / "manifest.json").exists()
    (src / "0.txt").write_text("y" * 100)  # a new input: the folder is prepared again ...
    calls = []

    def dies(items, arrays, sizes, real=module._Writer.write):
        calls.append(1)
        raise KeyboardInterrupt  # ... and killed while writing

    monkeypatch.setattr(module._Writer, "write", dies)
    with pytest.raises(KeyboardInterrupt):
        prepare([str(src)], tmp_path / "out", bytes_info(), workers=0)
    assert calls and not (tmp_path / "out" / "manifest.json").exists()
    assert not list((tmp_path / "out").glob("*.tmp"))
    with pytest.raises(DataError, match="no manifest.json, so it is not a finished prepared folder"):
        open_shards(tmp_path / "out")


def test_a_truncated_or_edited_shard_fails_its_check(tmp_path):
    src = corpus(tmp_path / "c", {f"{i}.txt": "some text\n" * 20 for i in range(4)})
    prepare([str(src)], tmp_path / "out", bytes_info(), workers=0)
    shard = tmp_path / "out" / "train.bin"
    data = shard.read_bytes()
    shard.write_bytes(data[:-2])
    with pytest.raises(DataError, match=r"train.bin: 1,204 bytes where the manifest says 1,206 \(truncated"):
        open_shards(tmp_path / "out")
    shard.write_bytes(data[:10] + bytes([data[10] ^ 1]) + data[11:])
    with pytest.raises(DataError, match="train.bin: its SHA-256 does not match the manifest"):
        open_shards(tmp_path / "out")
    assert open_shards(tmp_path / "out", verify=False).train.tokens.size == len(data) // 2  # sizes only


# -- bad input ---------------------------------------------------------------------------------------
def test_an_empty_corpus_is_refused(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match="the corpus is empty"):
        prepare([str(tmp_path / "empty.txt")], tmp_path / "out", bytes_info(), workers=0)
    (tmp_path / "none").mkdir()
    with pytest.raises(DataError, match="none: no file in this folder"):
        prepare([str(tmp_path / "none")], tmp_path / "out", bytes_info(), workers=0)


def test_a_binary_file_is_refused_and_invalid_utf8_is_counted(tmp_path):
    (tmp_path / "blob.bin").write_bytes(b"abc\x00def")
    with pytest.raises(DataError, match=r"blob.bin: not text \(a NUL byte at offset 3\)"):
        prepare([str(tmp_path / "blob.bin")], tmp_path / "out", bytes_info(), workers=0)
    (tmp_path / "latin.txt").write_bytes("caf".encode() + b"\xe9 cr\xe8me\n" * 3)
    warnings = []
    prepare([str(tmp_path / "latin.txt")], tmp_path / "out", bytes_info(), workers=0, log=warnings.append)
    assert warnings == [f"{tmp_path / 'latin.txt'}: 6 byte(s) are not UTF-8 (the first at byte offset 3); "
                        f"each was replaced by U+FFFD"]


def test_a_jsonl_line_that_is_not_json_is_named_by_file_and_line(tmp_path):
    pytest.importorskip("datasets")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": "ok"}\n{"text": broken}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:3: not JSON"):
        prepare([str(tmp_path / "bad.jsonl")], tmp_path / "out", bytes_info(), workers=0)


def test_a_missing_field_lists_the_fields_that_exist(tmp_path):
    pytest.importorskip("datasets")
    (tmp_path / "a.jsonl").write_text('{"body": "x", "title": "y"}\n{"body": "z", "title": "w"}\n')
    with pytest.raises(DataError, match=r"records have no field 'text' \(fields: body, title\); choose one with "
                                        r"--field"):
        prepare([str(tmp_path / "a.jsonl")], tmp_path / "out", bytes_info(), workers=0)
    prepare([str(tmp_path / "a.jsonl")], tmp_path / "out", bytes_info(), field="body", workers=0)


def test_a_record_without_the_field_is_refused_by_file_and_line_not_dropped(tmp_path):
    pytest.importorskip("datasets")
    (tmp_path / "a.jsonl").write_text('{"text": "a"}\n\n{"text": null}\n{"body": "b", "id": 3}\n')
    with pytest.raises(DataError, match=r"a\.jsonl:4: the record has no field 'text' \(its fields: body, id\); "
                                        r"give every record the text in 'text', or choose the field that holds "
                                        r"it with --field"):
        prepare([str(tmp_path / "a.jsonl")], tmp_path / "out", bytes_info(), workers=0)
    (tmp_path / "b.json").write_text('[{"text": "a"}, {"body": "b"}]')
    with pytest.raises(DataError, match=r"b\.json: record 2 has no field 'text' \(its fields: body\)"):
        prepare([str(tmp_path / "b.json")], tmp_path / "out", bytes_info(), workers=0)
    (tmp_path / "c.jsonl").write_text('{"text": "a"}\n{"text": null}\n')  # a null stays an empty document
    assert prepare([str(tmp_path / "c.jsonl")], tmp_path / "out", bytes_info(), workers=0).manifest


def test_a_json_file_that_is_valid_json_says_what_is_wrong_with_it(tmp_path):
    pytest.importorskip("datasets")
    (tmp_path / "one.json").write_text('{\n  "a": [1, "x"],\n  "b": {"c": 1}\n}\n')
    with pytest.raises(DataError, match=r"one\.json: one JSON object with no field 'text' \(its keys: a, b\), not "
                                        r"records; give a JSON list of objects or JSON lines"):
        prepare([str(tmp_path / "one.json")], tmp_path / "out", bytes_info(), workers=0)
    (tmp_path / "str.json").write_text('"just text"')
    with pytest.raises(DataError, match=r"str\.json: a JSON str, not records"):
        prepare([str(tmp_path / "str.json")], tmp_path / "out", bytes_info(), workers=0)


def test_a_jsonl_parse_error_prints_seqzoos_line_only(tmp_path):
    pytest.importorskip("datasets")
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"text": \n')
    # A fresh process: datasets' log handler keeps the stderr it found when first used, which in
    # this one is pytest's capture of an earlier test.
    out = subprocess.run([sys.executable, "-m", "seqzoo", "data", "prepare", str(tmp_path / "bad.jsonl"), "-o",
                          str(tmp_path / "o"), "--quiet"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    err = out.stderr.strip()
    assert err.splitlines() == [f"seqzoo: error: {tmp_path / 'bad.jsonl'}:2: not JSON (Expecting value: line 2 "
                                f"column 1 (char 10)); each line of a .jsonl file is one JSON object"]


def test_the_output_is_a_folder_outside_the_sources(tmp_path, capsys):
    source = corpus(tmp_path / "src", {"a.txt": "one", "b.txt": "two"})
    (tmp_path / "file").write_text("x")
    for output, message in [
            (tmp_path / "file", f"-o {tmp_path / 'file'}: {tmp_path / 'file'} is a file, not a folder"),
            (source, f"-o {source}: is the source folder itself, so the next run would read the shards back"),
            (source / "shards", f"-o {source / 'shards'}: is inside the source folder {source}, so the next run "
                                f"would read the shards back as input; write them outside it (e.g. -o "
                                f"{os.path.relpath(tmp_path / 'src-shards')}), or add --exclude shards")]:
        assert main(["data", "prepare", str(source), "-o", str(output), "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"seqzoo: error: {message}"), err
    assert sorted(os.listdir(source)) == ["a.txt", "b.txt"]  # nothing written into it
    # The walk skips an excluded or hidden folder, so the shards may go there.
    assert main(["data", "prepare", str(source), "-o", str(source / ".shards"), "--quiet"]) == 0
    assert main(["data", "prepare", str(source), "--exclude", "shards", "-o", str(source / "shards"), "--quiet"]) == 0


def test_a_vocabulary_too_large_for_the_dtype_is_caught(tmp_path):
    class Big(type(BYTES)):
        vocab_size = 70_000

    (tmp_path / "a.txt").write_text("text")
    with pytest.raises(DataError, match=r"--dtype uint16: the tokenizer has 70,000 ids, more than uint16 holds"):
        prepare([str(tmp_path / "a.txt")], tmp_path / "out", TokenizerInfo(Big(), {"kind": "big"}),
                dtype="uint16", workers=0)
    done = prepare([str(tmp_path / "a.txt")], tmp_path / "out", TokenizerInfo(Big(), {"kind": "big"}), workers=0)
    assert done.manifest["dtype"] == "uint32"  # auto picks the width that holds it


def test_the_cli_refuses_bad_input_in_one_line(tmp_path, capsys):
    assert main(["data", "prepare", str(tmp_path / "missing"), "-o", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == f"seqzoo: error: {tmp_path / 'missing'}: no such file or folder"
    (tmp_path / "a.txt").write_text("x")
    assert main(["data", "prepare", str(tmp_path / "a.txt"), "-o", str(tmp_path / "o"), "--val", "1.5"]) == 2
    assert "--val 1.5: the held-out fraction must be in [0, 1)" in capsys.readouterr().err


# -- tokenizers ----------------------------------------------------------------------------------------
def test_a_bpe_is_trained_on_the_training_split_only_and_deterministically(tmp_path):
    pytest.importorskip("tokenizers")
    texts = {f"d{i}.txt": "common words here and there\n" * 30 for i in range(9)}
    texts["d9.txt"] = "zyzzyva quixotic " * 200  # held out (the last of 10 at val=0.1)
    src = corpus(tmp_path / "c", texts)
    notes = []
    spec = train_bpe([str(src)], tmp_path / "tok.json", 300, val=0.1, log=notes.append)
    again = train_bpe([str(src)], tmp_path / "tok2.json", 300, val=0.1, log=notes.append)
    assert (tmp_path / "tok.json").read_text() == (tmp_path / "tok2.json").read_text()
    vocab = json.loads((tmp_path / "tok.json").read_text())["model"]["vocab"]
    assert spec["eos_id"] == again["eos_id"] == 0 and spec["vocab_size"] == len(vocab) < 300
    assert notes[0] == (f"--vocab 300: the training text has merges for {len(vocab)} ids only (pairs seen at "
                        f"least 2 times); the tokenizer has {len(vocab)}")
    assert "Ġwords" in vocab and not any("zyzz" in token for token in vocab)  # the held-out text never trained it
    info = resolve_tokenizer(str(tmp_path / "tok.json"))
    assert info.spec == {"kind": "hf", "path": str(tmp_path / "tok.json"), "eos_id": 0}
    done = prepare([str(src)], tmp_path / "out", info, workers=0)
    shards = open_shards(tmp_path / "out")
    assert (tmp_path / "out" / "tokenizer.json").read_text() == (tmp_path / "tok.json").read_text()
    assert done.manifest["tokenizer"]["identity"] == info.tokenizer.identity()
    assert info.tokenizer.identity().startswith("hf:")
    first = shards.train.tokens[shards.train.starts[0]:shards.train.starts[1] - 1].tolist()
    assert info.tokenizer.decode(first) == texts["d0.txt"]


def test_a_tokenizer_json_without_an_end_token_is_refused(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    backend.add_special_tokens(["[UNK]"])
    (tmp_path / "tok.json").write_text(backend.to_str())
    with pytest.raises(DataError, match=r"declares no end-of-document token .*its special tokens: \[UNK\]"):
        resolve_tokenizer(str(tmp_path / "tok.json"))


def test_a_checkpoint_lends_its_tokenizer(tmp_path):
    model = seqzoo.build("tiny-gpt", device="cpu")
    seqzoo.save(model, tmp_path / "m.safetensors")
    info = resolve_tokenizer(str(tmp_path / "m.safetensors"))
    assert info.spec == {"kind": "bytes"} and info.tokenizer.identity() == "bytes"


# -- windows and the sampler ---------------------------------------------------------------------------
def test_the_sampler_is_a_pure_function_of_seed_and_row_and_covers_each_epoch_once():
    sampler = WindowSampler(10, seed=3)
    stream = sampler.indices(0, 35)
    assert sorted(stream[:10].tolist()) == list(range(10)) and sorted(stream[10:20].tolist()) == list(range(10))
    assert stream[:10].tolist() != stream[10:20].tolist()  # a new permutation every epoch
    fresh = WindowSampler(10, seed=3)
    assert fresh.indices(17, 9).tolist() == stream[17:26].tolist()  # any slice, any order of asking
    assert WindowSampler(10, seed=4).indices(0, 10).tolist() != stream[:10].tolist()


def test_windows_tile_the_split_and_document_ids_restart_per_row(tmp_path):
    src = corpus(tmp_path / "c", {"a.txt": "aaaa", "b.txt": "bb", "c.txt": "cccccc", "d.txt": "d"})
    prepare([str(src)], tmp_path / "out", bytes_info(), val=0.25, workers=0)
    split = open_shards(tmp_path / "out").train  # a.txt, b.txt, c.txt (d.txt, the last, is held out)
    tokens = split.tokens.tolist()
    assert tokens == [*b"aaaa", EOS, *b"bb", EOS, *b"cccccc", EOS]
    assert split.window_count(3) == 4  # (15 − 1) // 3
    windows = split.windows(np.array([0, 2]), 3)
    assert windows.tolist() == [tokens[0:4], tokens[6:10]]
    # window 1 reads positions 3..5 (a EOS | b), window 2 positions 6..8 (b EOS | c)
    assert split.document_ids(np.array([1, 2]), 3).tolist() == [[0, 0, 1], [0, 0, 1]]
    assert evaluation_windows(10, 4).tolist() == [0, 2, 5, 7] and evaluation_windows(3, 8).tolist() == [0, 1, 2]


def test_prepare_reports_its_speed_and_the_command_to_train(tmp_path, capsys):
    src = corpus(tmp_path / "c", {f"{i}.txt": "hello\n" for i in range(3)})
    assert main(["data", "prepare", str(src), "-o", str(tmp_path / "out"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "train 14 tokens in 2 document(s), val 7 tokens in 1 document(s); uint16, split by document" in out
    assert f"seqzoo train RECIPE --data {tmp_path / 'out'}" in out
    assert os.path.exists(tmp_path / "out" / "manifest.json")
