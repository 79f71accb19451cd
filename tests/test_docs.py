"""The Python in README.md and docs/*.md works with today's seqzoo.

Every ```python block compiles. Every method that a documented class overrides on a seqzoo
interface (``seqzoo.interfaces``) takes the interface's parameters, and a documented hook takes the
hookspec's. Every self-contained plugin example (a class plus a ``seqzoo_components`` hookimpl) is
loaded as a local plugin under ``SEQZOO_STRICT_PLUGINS=1``, so a rejected component fails the test.
Its components then run the fast checks of the conformance kit. Scores and position schemes also go
through one cached-versus-full forward of a real model, which is how the core calls their hooks
(``prepared=`` included). Shell, YAML, TOML and output blocks are not Python and are skipped.

Each plugin example gets its own registry for the duration of its test, as in tests/test_plugins.py.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import seqzoo
from seqzoo import hookspecs, interfaces, testing

registry_module = importlib.import_module("seqzoo.registry")  # seqzoo.registry is the function

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A fence may be indented (inside a list item); its closing fence has the same indent.
FENCE = re.compile(r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.MULTILINE | re.DOTALL)
# Each of these takes seconds per component (gradcheck in float64; several decoders plus
# generation). `seqzoo check` and tests/contract run them; here one cached-versus-full forward
# stands in for the model-level check, so the whole file stays fast.
SLOW_CHECKS = {"gradients", "causality_kv_cache_padding"}


@dataclass(frozen=True)
class Block:
    """One ```python block: where it is (for messages and test ids) and its dedented source."""

    path: Path
    line: int
    source: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def tree(self) -> ast.Module:
        return ast.parse(self.source, self.id)


def python_blocks() -> list[Block]:
    blocks = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append(Block(path, line, textwrap.dedent(match.group("body"))))
    return blocks


BLOCKS = python_blocks()
IDS = [b.id for b in BLOCKS]


def _is_hook(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef) and node.name == "seqzoo_components" and any(
        "hookimpl" in ast.unparse(d) for d in node.decorator_list)


def _is_plugin(block: Block) -> bool:
    """A self-contained plugin example: it defines a class and the hook that registers it."""
    body = block.tree().body
    return any(isinstance(n, ast.ClassDef) for n in body) and any(_is_hook(n) for n in body)


PLUGINS = [b for b in BLOCKS if _is_plugin(b)]


# -- signatures --------------------------------------------------------------------------------------
def _interface(base: ast.expr) -> type | None:
    """The seqzoo interface a base-class expression names (``ScoreFunction``,
    ``interfaces.PositionBias``), or None for anything else (``nn.Module``)."""
    name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
    found = getattr(interfaces, name, None) if name else None
    return found if isinstance(found, type) and (found.__module__ + ".").startswith(interfaces.__name__ + ".") else None


def _interfaces_of(cls: ast.ClassDef, local: dict[str, ast.ClassDef]) -> list[type]:
    """The interfaces a documented class derives from, through classes of the same block too."""
    found = []
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in local and local[base.id] is not cls:
            found += _interfaces_of(local[base.id], local)
        elif (interface := _interface(base)) is not None:
            found.append(interface)
    return found


def _reference(interface: type, method: str) -> tuple[type, object] | None:
    """(defining interface, function) for ``method`` as seqzoo defines it, or None when only torch
    or the plugin itself defines it (``forward`` of a norm, a helper such as ``angles``)."""
    for owner in interface.__mro__:
        if (owner.__module__ + ".").startswith(interfaces.__name__ + ".") and method in owner.__dict__:
            function = getattr(owner.__dict__[method], "__func__", owner.__dict__[method])
            return (owner, function) if inspect.isfunction(function) else None
    return None


Param = tuple[str, str, bool]  # name, kind (inspect.Parameter kind name), has a default


def _ast_params(fn: ast.FunctionDef) -> list[Param]:
    args = fn.args
    positional = args.posonlyargs + args.args
    first_default = len(positional) - len(args.defaults)
    params = [(a.arg, "POSITIONAL_ONLY" if i < len(args.posonlyargs) else "POSITIONAL_OR_KEYWORD",
               i >= first_default) for i, a in enumerate(positional)]
    if args.vararg:
        params.append((args.vararg.arg, "VAR_POSITIONAL", False))
    params += [(a.arg, "KEYWORD_ONLY", d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        params.append((args.kwarg.arg, "VAR_KEYWORD", False))
    return params


def _code_params(fn: object) -> list[Param]:
    return [(p.name, p.kind.name, p.default is not p.empty) for p in inspect.signature(fn).parameters.values()]


def _mismatch(doc: list[Param], ref: list[Param], constructor: bool) -> str | None:
    """Why a documented override's parameters break its interface's, or None.

    The core calls these hooks with the interface's parameters, some of them by keyword (``mask=``,
    ``prepared=``), so names, order and kinds must match, and a parameter the interface makes
    optional must stay optional (the core and the kit leave it out). An extra parameter would never
    be passed, so a doc that shows one misleads: it is allowed, with a default, only where the
    interface takes ``**kwargs`` (none does today), since only then can the core pass more.
    Constructors are the exception: after the core arguments come the recipe parameters.
    """
    named = [p for p in ref if p[1] != "VAR_KEYWORD"]
    head = doc[:len(named)]
    if [p[:2] for p in head] != [p[:2] for p in named]:
        return "the parameters differ"
    if constructor:
        return None
    lost = [d[0] for d, r in zip(head, named) if r[2] and not d[2]]
    if lost:
        return f"{', '.join(lost)} must keep a default: callers may leave it out"
    extra = doc[len(named):]
    if not any(p[1] == "VAR_KEYWORD" for p in ref):
        return f"{', '.join(p[0] for p in extra)}: the core never passes these" if extra else None
    if not extra or extra[-1][1] != "VAR_KEYWORD":
        return "it must take **kwargs, as the interface does: the core may pass more keywords"
    required = [p[0] for p in extra[:-1] if not p[2] and p[1] != "VAR_POSITIONAL"]
    return f"{', '.join(required)} must have defaults: the core does not pass them" if required else None


def signature_problems(block: Block) -> list[str]:
    """Every documented override or hook whose parameters break seqzoo's, as one line each."""
    body = block.tree().body
    local = {n.name: n for n in body if isinstance(n, ast.ClassDef)}
    problems = []

    def show(params: list[Param]) -> str:
        stars = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}
        return ", ".join(stars.get(kind, "") + name for name, kind, _ in params)

    for node in body:
        if _is_hook(node):
            doc, ref = _ast_params(node), _code_params(hookspecs.seqzoo_components)
            if [p[:2] for p in doc] != [p[:2] for p in ref]:
                problems.append(f"{block.id}: seqzoo_components({show(doc)}) must take ({show(ref)})")
    for cls in local.values():
        for interface in _interfaces_of(cls, local):
            for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                found = _reference(interface, fn.name)
                if found is None:
                    continue
                owner, function = found
                doc, ref = _ast_params(fn), _code_params(function)
                why = _mismatch(doc, ref, constructor=fn.name == "__init__")
                if why:
                    problems.append(f"{block.id}: {cls.name}.{fn.name}({show(doc)}) does not match "
                                    f"{owner.__name__}.{fn.name}({show(ref)}): {why}")
    return problems


# -- the tests ---------------------------------------------------------------------------------------
def test_the_docs_have_python_blocks_and_plugin_examples():
    """Guards the extraction: if the fence pattern stopped matching, every other test would pass
    vacuously."""
    assert len(BLOCKS) >= 8, IDS
    sources = "\n".join(b.source for b in PLUGINS)
    for needed in ("(ScoreFunction)", "(PositionScheme)", "(PositionBias)", "prepared"):
        assert needed in sources, f"no plugin example in the docs shows {needed}"


@pytest.mark.parametrize("block", BLOCKS, ids=IDS)
def test_python_blocks_compile(block):
    compile(block.source, block.id, "exec")


@pytest.mark.parametrize("block", BLOCKS, ids=IDS)
def test_documented_overrides_match_the_interfaces(block):
    assert signature_problems(block) == []


def test_signature_check_catches_overrides_that_break_the_interface():
    wrong = Block(ROOT / "README.md", 0, textwrap.dedent("""
        import seqzoo
        from seqzoo.interfaces import PositionBias, ScoreFunction

        class Score(ScoreFunction):
            def __init__(self, query_dim, key_dim, heads, scale=1.0): ...   # fine: a recipe parameter
            def scores(self, query, key): ...                               # renamed parameters

        class Bias(PositionBias):
            def prepare(self, q_pos, k_pos): ...                            # fine
            def bias(self, q, q_pos, k_pos, prepared): ...                  # prepared lost its default
            def rotate(self, q, k, q_pos, k_pos, prepared=None, extra=1): ... # never passed

        class Child(Bias):
            def embed(self, x): ...                                         # through a local base

        @seqzoo.hookimpl
        def seqzoo_components(config): ...
    """))
    problems = signature_problems(wrong)
    assert len(problems) == 5, problems
    assert "Score.scores(self, query, key) does not match ScoreFunction.scores(self, q, k)" in problems[1]
    assert problems[2].endswith("prepared must keep a default: callers may leave it out")
    assert problems[3].endswith("extra: the core never passes these")
    assert "Child.embed(self, x) does not match PositionScheme.embed(self, x, positions)" in problems[4]
    assert "seqzoo_components(config) must take ()" in problems[0]


@pytest.fixture
def fresh_strict(monkeypatch):
    """A registry of this test's own, where a plugin problem raises instead of warning; the
    example's module leaves sys.modules afterwards."""
    for var in ("SEQZOO_PLUGINS", "SEQZOO_DISABLE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SEQZOO_STRICT_PLUGINS", "1")
    monkeypatch.setattr(registry_module, "_registry", None)
    before = set(sys.modules)
    yield registry_module.registry()
    for name in set(sys.modules) - before:
        if name.startswith("seqzoo_local_"):
            del sys.modules[name]


def _forward_matches_cached_decoding(kind: str, name: str) -> None:
    """A 1-layer decoder using the component: decoding with a KV cache (a 3-token prefix, then one
    token) gives the logits of the full forward. This runs the hooks the way the core calls them."""
    attention: dict = {"heads": 2, "kv_heads": 1}
    model: dict = {"kind": "decoder_lm", "vocab_size": 259, "dim": 16, "layers": 1, "max_seq_len": 16,
                   "attention": attention}
    if kind == "score":
        attention["score"] = name
    else:
        model["position"] = name
    lm = seqzoo.build({"seqzoo": 1, "model": model}, device="cpu").eval()
    ids = torch.randint(0, 259, (2, 4))
    with torch.no_grad():
        full = lm(ids)
        cache = lm.new_cache(2, 4)
        cached = torch.cat([lm(ids[:, :3], cache=cache), lm(ids[:, 3:], cache=cache)], dim=1)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block", PLUGINS, ids=[b.id for b in PLUGINS])
def test_plugin_examples_register_and_pass_the_kit(block, fresh_strict, tmp_path):
    path = tmp_path / f"{block.path.stem.lower()}_{block.line}.py"
    path.write_text(block.source, encoding="utf-8")
    info = seqzoo.load_plugin(path)  # strict: a rejected component raises RegistryError here
    assert info.components, f"{block.id}: the hook registered nothing"
    tree = block.tree()
    local = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for component in info.components:
        base = interfaces.BASES.get(component.kind)
        assert base is None or issubclass(component.cls, base), (block.id, component.name)
        declared = _interfaces_of(local[component.cls.__name__], local)
        assert base is None or any(issubclass(d, base) for d in declared), (
            f"{block.id}: {component.cls.__name__} should subclass {base.__name__} in the example itself")
        for check, run in testing.checks_for(component.kind, component.name).items():
            if check in SLOW_CHECKS:
                continue
            torch.manual_seed(0)
            try:
                run()
            except testing.Skip:
                pass
        if component.kind in ("score", "position"):
            _forward_matches_cached_decoding(component.kind, component.name)


def test_readme_timing_claims_are_the_measured_ones():
    """Every 'about N s' the README states stands in docs/performance.md's table of the README's
    numbers, with the command that repeats the measurement."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    performance = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    section = performance.split("## The README's numbers", 1)[1].split("\n## ", 1)[0]
    claims = re.findall(r"about (\d+) s on 2 CPU cores", readme)
    assert claims, "the README states the tiny-gpt training time"
    for seconds in claims:
        assert f"about {seconds} s on 2 CPU cores" in section, seconds
    assert "time seqzoo train tiny-gpt" in section


# -- links: the project stands on its own --------------------------------------------------------------
LINKED_DOCS = [*DOCS, *sorted((ROOT / "examples").glob("**/README.md"))]
# A Markdown link or image, [text](target "title") or ![alt](<target>); escaped brackets are text.
LINK = re.compile(r"(?<!\\)!?\[(?:[^\[\]]|\\[\[\]])*\]\(\s*(?:<([^>]*)>|([^\s)]*))(?:\s+[\"'(][^)]*)?\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(?:<([^>]*)>|(\S+))", re.MULTILINE)  # [label]: target
CODE = re.compile(r"^([ \t]*)(```|~~~).*?^\1\2[ \t]*$|`[^`\n]+`", re.MULTILINE | re.DOTALL)
# Written in pieces so that this file does not trip its own check.
OUTSIDE = ("../" + "shared", "shared/" + "reference")
CHECKED_TREES = ["README.md", "pyproject.toml", "docs", "core", "plugins", "tests", "examples", "benchmarks",
                 "recipes"]
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini", ".json", ".sh"}


def link_problems(path: Path, text: str) -> list[str]:
    """Every link or image in a Markdown file that is neither an http(s) URL nor a file inside the
    repository (relative to the file, anchors and queries dropped), as ``file:line: target``."""
    prose = CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)  # keep offsets, drop code
    problems = []
    for match in [*LINK.finditer(prose), *REFERENCE.finditer(prose)]:
        target = (match.group(1) or match.group(2) or "").strip()
        where = f"{path.relative_to(ROOT)}:{prose.count(chr(10), 0, match.start()) + 1}: {target or '(empty)'}"
        if re.match(r"https?://", target):
            continue
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # mailto:, file:, ftp:, ...
            problems.append(f"{where} (only http(s) URLs and files in the repository)")
            continue
        local = re.split(r"[#?]", target, maxsplit=1)[0]
        if not local:
            if not target.startswith("#"):
                problems.append(f"{where} (an empty link)")
            continue  # an anchor in the same file
        resolved = ((ROOT / local.lstrip("/")) if local.startswith("/") else (path.parent / local)).resolve()
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{where} (outside the repository)")
        elif not resolved.exists():
            problems.append(f"{where} (no such file)")
    return problems


def test_the_docs_link_only_to_urls_and_files_in_the_repository():
    assert (ROOT / "docs" / "formulas.md") in LINKED_DOCS and len(LINKED_DOCS) > 3
    problems = [p for path in LINKED_DOCS for p in link_problems(path, path.read_text(encoding="utf-8"))]
    assert problems == []


def test_link_check_catches_bad_links():
    text = textwrap.dedent("""
        [fine](https://example.org/x) [fine](plugins.md#writing) [fine](#anchor) ![fine](img/curves.png)
        [missing](nope.md) ![missing image](img/nope.png "a title") [outside](../../elsewhere/README.md)
        [scheme](ftp://example.org)
        [ref]: missing-ref.md
        `[in code](nope-in-code.md)` and \\[escaped\\](not-a-link.md)
        ```text
        [in a block](nope-in-a-block.md)
        ```
    """)
    problems = link_problems(ROOT / "docs" / "example.md", text)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "nope.md (no such file)", "img/nope.png (no such file)", "../../elsewhere/README.md (outside the repository)",
        "ftp://example.org (only http(s) URLs and files in the repository)", "missing-ref.md (no such file)"]


def test_nothing_in_the_repository_points_outside_it():
    """Users have the repository only: no file may send them to the workspace folder beside it."""
    files = []
    for name in CHECKED_TREES:
        top = ROOT / name
        files += [top] if top.is_file() else [p for p in sorted(top.rglob("*")) if p.is_file()]
    found = []
    for path in files:
        if path.suffix not in TEXT_SUFFIXES or "__pycache__" in path.parts:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for bad in OUTSIDE if bad in line]
    assert found == []
