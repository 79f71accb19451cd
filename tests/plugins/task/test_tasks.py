"""Every task's data generator: correct answers, lengths, determinism, separate eval lengths."""
from __future__ import annotations

import random

import pytest

import seqzoo
from seqzoo.errors import ConfigError


def make(name: str, **params):
    return seqzoo.registry().create("task", {"kind": name, **params})


def draw(task, n: int = 200, split: str = "train", seed: int = 0):
    rng = random.Random(seed)
    return [task.example(rng, split) for _ in range(n)]


@pytest.mark.parametrize("name, rule", [
    ("copy", lambda s: s),
    ("reverse", lambda s: s[::-1]),
    ("sort", lambda s: "".join(sorted(s))),
])
def test_string_tasks_answer_by_their_rule_within_lengths(name, rule):
    task = make(name, min_len=3, max_len=6, eval_min_len=9, eval_max_len=10)
    for prompt, answer in draw(task):
        assert answer == rule(prompt) and 3 <= len(prompt) <= 6 and prompt.isalpha()
    for prompt, _ in draw(task, split="eval"):
        assert 9 <= len(prompt) <= 10


def test_add_answers_are_sums_with_the_digit_counts_asked():
    task = make("add", min_len=2, max_len=3, eval_min_len=4, eval_max_len=4)
    for prompt, answer in draw(task):
        a, b = prompt.split("+")
        assert int(answer) == int(a) + int(b)
        assert 2 <= len(a) <= 3 and 2 <= len(b) <= 3
    for prompt, _ in draw(task, split="eval"):
        assert all(len(part) == 4 for part in prompt.split("+"))


def test_translate_is_deterministic_and_follows_the_grammar():
    task = make("translate")
    assert task.example(random.Random(3)) == task.example(random.Random(3))
    lexicon = {"the cat sees a dog": "la kato hundon vidas"}
    rng = random.Random(0)
    seen = {}
    for _ in range(2000):
        source, target = task.example(rng)
        assert seen.setdefault(source, target) == target  # one translation per sentence
        clauses = source.split(" and ")
        assert len(target.split(" kaj ")) == len(clauses)
        assert all(word.endswith("as") for word in [c.split()[-1] for c in target.split(" kaj ")])
    for source, target in lexicon.items():
        if source in seen:
            assert seen[source] == target


def test_same_seed_same_examples():
    task = make("copy")
    assert draw(task, seed=5) == draw(task, seed=5)
    assert draw(task, seed=5) != draw(task, seed=6)


def test_text_task_splits_the_file_and_windows_it(tmp_path):
    path = tmp_path / "corpus.txt"
    text = "".join(chr(ord("a") + i % 26) for i in range(1000))
    path.write_text(text)
    task = make("text", path=str(path), window=50, validation=0.2)
    assert task.exact_match is False
    for prompt, window in draw(task, n=50):
        assert prompt == "" and len(window) == 50 and window in text[:800]
    for _, window in draw(task, n=50, split="eval"):
        assert window in text[800:]


def test_text_task_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"task text: cannot read path=.*missing\.txt"):
        make("text", path=str(tmp_path / "missing.txt"))


def test_text_task_too_short_for_the_window(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("abc" * 10)
    with pytest.raises(ConfigError, match=r"not more than window=128"):
        make("text", path=str(path))


@pytest.mark.parametrize("name", ["copy", "add", "translate"])
def test_min_len_above_max_len_is_a_clear_error(name):
    with pytest.raises(ConfigError, match=rf"task {name}: min_len=5 is larger than max_len=2"):
        make(name, min_len=5, max_len=2)


def test_alphabet_with_the_separator_is_rejected():
    with pytest.raises(ConfigError, match="must not contain the separator '='"):
        make("copy", alphabet="ab=")


def test_text_task_joins_a_folder_of_text_files_in_order(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_text("first " * 40)
    (tmp_path / "b" / "c.txt").write_text("second " * 40)
    (tmp_path / "skip.md").write_text("not read")
    task = seqzoo.registry().create("task", {"kind": "text", "path": str(tmp_path), "window": 16, "validation": 0.5})
    joined = task.splits["train"] + task.splits["eval"]
    assert joined.startswith("first ") and joined.endswith("second ") and "not read" not in joined
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(seqzoo.SeqzooError, match=r"has no \.txt file"):
        seqzoo.registry().create("task", {"kind": "text", "path": str(empty)})


def test_text_that_is_not_utf8_warns_with_the_count_and_the_first_offset(tmp_path):
    path = tmp_path / "latin.txt"
    path.write_bytes(b"abc \xe9t\xe9 " + b"plain text " * 20)
    with pytest.warns(UserWarning, match=r"latin.txt: 2 byte\(s\) are not UTF-8 \(the first at byte offset 4\)"):
        task = make("text", path=str(path), window=16)
    assert "\ufffd" in task.splits["train"]
