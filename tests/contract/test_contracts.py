"""Every registered component of every checked kind honours its interface's contract (the same
checks ``seqzoo.testing`` offers plugin authors): a new variant is tested the moment it is
registered."""
from __future__ import annotations

import pytest

from seqzoo.testing import CHECKED_KINDS, component_cases, run_check

CASES = [(kind, name, check) for kind in CHECKED_KINDS for name, check in component_cases(kind)]


@pytest.mark.parametrize("kind, name, check", CASES, ids=["/".join(case) for case in CASES])
def test_component_contract(kind, name, check):
    run_check(kind, name, check)


def test_every_checked_kind_has_components_and_checks():
    for kind in CHECKED_KINDS:
        assert any(case[0] == kind for case in CASES), f"no contract cases for kind {kind!r}"
