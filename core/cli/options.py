"""Command-line options several commands share, defined once."""
from __future__ import annotations

import argparse

SET_HELP = ("override a recipe value, KEY.PATH=VALUE with the value read as YAML (repeatable): "
            "--set model.layers=2 --set 'model.attention={heads: 4}' --set train.steps=50")


def add_set(parser: argparse.ArgumentParser, help: str = SET_HELP) -> None:
    """``--set KEY=VALUE`` (repeatable), collected in ``args.overrides``."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)
