"""Nothing in seqzoo deserialises untrusted data with pickle, unsafe YAML, eval or exec."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = re.compile(r"\b(torch\.load|pickle\.loads?|yaml\.load|yaml\.unsafe_load|yaml\.full_load|"
                       r"marshal\.loads?|(?<![.\w])eval|(?<![.\w])exec)\s*\(")


@pytest.mark.parametrize("folder", ["core", "plugins"])
def test_source_tree_has_no_unsafe_deserialisation(folder):
    offenders = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if FORBIDDEN.search(line) and not line.lstrip().startswith("#"):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_the_scan_catches_what_it_looks_for():
    assert FORBIDDEN.search("state = torch.load(path)")
    assert FORBIDDEN.search("data = pickle.loads(blob)")
    assert FORBIDDEN.search("yaml.load(text, Loader=yaml.Loader)")
    assert FORBIDDEN.search("eval(expr)") and FORBIDDEN.search("x = exec(code)")
    assert not FORBIDDEN.search("yaml.safe_load(text)")
    assert not FORBIDDEN.search("model.eval()")
