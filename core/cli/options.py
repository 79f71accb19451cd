"""Command-line options several commands share, defined once."""
from __future__ import annotations

import argparse

from ..errors import InputError

SET_HELP = ("override a recipe value, KEY.PATH=VALUE with the value read as YAML (repeatable): "
            "--set model.layers=2 --set 'model.attention={heads: 4}' --set train.steps=50")


def add_set(parser: argparse.ArgumentParser, help: str = SET_HELP) -> None:
    """``--set KEY=VALUE`` (repeatable), collected in ``args.overrides``."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)


def at_least(minimum: int, *flags: tuple[str, int | None]) -> None:
    """Refuse each ``(flag, value)`` given below ``minimum`` (None: not given). A check, not an
    argparse type, so that its message is the CLI's one line rather than argparse's usage block."""
    for flag, value in flags:
        if value is not None and value < minimum:
            raise InputError(f"{flag} must be >= {minimum}, got {value}")
