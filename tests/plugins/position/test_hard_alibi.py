"""Position `hard_alibi`: the bias against its formula, and what the windows mean for a model —
a head that sees one key mixes nothing, a head without a window sees the whole prefix."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.errors import ConfigError
from seqzoo.plugins.position.hard_alibi import default_windows


def test_the_bias_is_zero_inside_each_heads_window_and_minus_ten_thousand_outside():
    scheme = seqzoo.registry().create("position", {"kind": "hard_alibi", "windows": [1, 3, None]}, 24, 8, 3, 64)
    positions = torch.arange(6)[None]
    bias = scheme.prepare(positions, positions)  # (1, 3, 6, 6)
    for h, window in enumerate([1, 3, 1000]):
        for i in range(6):
            for j in range(6):
                expected = 0.0 if abs(i - j) < window else -1e4
                assert bias[0, h, i, j].item() == expected


def test_default_windows_leave_half_the_heads_without_position_bias():
    assert default_windows(4) == [None, None, 2, 4]
    assert default_windows(5) == [None, None, None, 2, 4]
    assert default_windows(1) == [None]


def model(windows):
    recipe = ["model.position={kind: hard_alibi, windows: %s}" % windows, "model.attention.heads=2"]
    torch.manual_seed(0)
    return seqzoo.build("tiny-gpt", recipe, device="cpu").eval()


def test_heads_that_see_one_key_mix_nothing_and_heads_without_a_window_see_the_prefix():
    ids = torch.randint(3, 200, (1, 12), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[0, 2] += 1
    with torch.no_grad():
        local = model("[1, 1]")
        same = (local(ids) - local(changed)).abs().amax(-1)[0]
        glob = model("[null, 1]")
        moved = (glob(ids) - glob(changed)).abs().amax(-1)[0]
    assert same[:2].max() == 0 and same[3:].max() == 0  # only the changed position itself moves
    assert moved[:2].max() == 0 and (moved[2:] > 0).all()  # every later position sees it


def test_a_window_per_head_is_required():
    with pytest.raises(ConfigError, match=r"windows has 2 entries for 4 heads; give one per head"):
        seqzoo.registry().create("position", {"kind": "hard_alibi", "windows": [1, None]}, 32, 8, 4, 64)
