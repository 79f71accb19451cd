"""The commands the docs show exist: every `seqzoo COMMAND` written in README.md and docs/*.md names
a real (sub)command, and every flag and choice given to it is one the argument parser takes. The
docs cannot drift from the command line without this failing."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from seqzoo.cli.commands import _parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCED = re.compile(r"^[ \t]*```[a-z]*[ \t]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")
QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def invocations(text: str) -> list[str]:
    """Every `seqzoo ...` command line in a Markdown text's code (fenced blocks and inline spans),
    continuation lines joined, quoted arguments blanked, one command per item."""
    lines = [line for block in FENCED.findall(text) for line in block.replace("\\\n", " ").splitlines()]
    lines += [span for span in INLINE.findall(FENCED.sub("", text)) if span.lstrip("$ ").startswith("seqzoo ")]
    found = []
    for line in lines:
        line = re.sub(r"(^|\s)#.*$", "", QUOTED.sub("ARG", line))  # quoted arguments, shell comments
        for piece in re.split(r"&&|;|\$\(", line):
            match = re.match(r"\s*(?:\$\s+)?(?:\S*python -m |torchrun .*-m )?seqzoo\s+([a-z].*)", piece)
            if match:
                found.append(match.group(1))
    return found


def problems(command: str, root: argparse.ArgumentParser) -> list[str]:
    words = command.replace("[", " ").replace("]", " ").replace("(", " ").replace(")", " ").split()
    parser, path = root, ["seqzoo"]
    global_options = options(root)
    for word in list(words):
        if word.startswith("-") or word in ("|", "..."):
            break
        children = subcommands(parser)
        if not children:
            break
        if word not in children:
            return [f"`seqzoo {command}`: {' '.join(path)} has no subcommand {word!r}"]
        parser, path = children[word], [*path, word]
        words = words[1:]
    known = options(parser)
    out = []
    for index, word in enumerate(words):
        if not word.startswith("--"):
            continue
        flag, _, value = word.partition("=")
        flag = flag.rstrip(",.:")
        if flag in ("--help",) or flag in global_options:
            continue
        if flag not in known:
            out.append(f"`seqzoo {command}`: {' '.join(path)} has no option {flag}")
            continue
        choices = known[flag].choices
        given = value or (words[index + 1] if index + 1 < len(words) else "")
        if choices and "|" in given:
            for choice in given.strip(",.").split("|"):
                if choice not in choices:
                    out.append(f"`seqzoo {command}`: {' '.join(path)} {flag} has no choice {choice!r} "
                               f"(it takes {', '.join(map(str, choices))})")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_flag_and_choice_in_the_docs_exists(doc):
    root = _parser()
    found = invocations(doc.read_text(encoding="utf-8"))
    bad = [problem for command in found for problem in problems(command, root)]
    assert not bad, "\n".join(bad)


def test_the_check_catches_a_flag_and_a_choice_the_parser_does_not_take():
    root = _parser()
    text = ("Run `seqzoo export-gguf CKPT FILE --type F32|Q9_9` and\n```bash\nseqzoo train tiny-gpt --no-such-flag \\\n"
            "  -o x.safetensors && seqzoo data prepar SRC\n```\n")
    bad = sorted(problem for command in invocations(text) for problem in problems(command, root))
    assert bad == ["`seqzoo data prepar SRC`: seqzoo data has no subcommand 'prepar'",
                   "`seqzoo export-gguf CKPT FILE --type F32|Q9_9`: seqzoo export-gguf --type has no choice 'Q9_9' "
                   "(it takes F32, F16, BF16, Q8_0, Q5_0, Q5_1, Q4_0, Q4_1)",
                   "`seqzoo train tiny-gpt --no-such-flag    -o x.safetensors `: seqzoo train has no option "
                   "--no-such-flag"]
