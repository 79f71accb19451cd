"""What every recurrent mixer shares as a layer, parametrized over them (Mamba, Mamba-2, linear
attention, gated DeltaNet, KDA, GLA, lightning attention, the mLSTM, LFM2's short conv, the
RG-LRU): a long sequence without autograd in segments equal to the whole, a decoding state whose
size does not grow with the context, bfloat16 and autocast with the recurrence's state in
float32, and fla's Triton kernels on CUDA against the plain path — each through its helper in
``seqzoo.testing``. Each mixer's own math is in its test file (test_mamba.py, test_delta_rule.py,
test_gla.py, ...); RWKV-7's layers, whose value residual crosses layers, in test_rwkv7.py."""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch

import seqzoo
from seqzoo.plugins.mixer import _conv_state, _delta_rule, _diagonal_scan, _gla, _mlstm, _segments
from seqzoo.testing import bfloat16_equivalence, kernel_paths_agree, segments_equivalence
from seqzoo.testing.mixer import _context

LIGHTNING = {"decay": "head_fixed", "feature_map": "silu", "scale": 1.0, "norm": "whole", "gate": "sigmoid"}
#: id -> (the mixer's spec at C = 16, σ of the noise added to its parameters: the mLSTM's zero gate
#: weights and −10 input bias, the RG-LRU's gates near σ(0), barely write at first).
MIXERS = {
    "mamba": ({"kind": "mamba", "state": 4}, 0.0),
    "mamba2": ({"kind": "mamba2", "state": 4, "head_dim": 8, "groups": 2}, 0.0),
    "linear_attention": ({"kind": "linear_attention", "heads": 2, "decay": "retnet"}, 0.0),
    "gated_deltanet": ({"kind": "gated_deltanet", "heads": 2, "head_dim": 8, "value_heads": 4, "chunk": 16}, 0.0),
    "kda": ({"kind": "kda", "heads": 2, "head_dim": 8}, 0.0),
    "gla": ({"kind": "gla", "heads": 2, "head_dim": 8, "gate_rank": 4, "chunk": 16}, 0.3),
    "lightning": ({"kind": "gla", "heads": 2, **LIGHTNING, "chunk": 16}, 0.3),
    "mlstm": ({"kind": "mlstm", "heads": 2, "chunk": 16}, 0.3),
    "short_conv": ({"kind": "short_conv", "conv_bias": True, "bias": True}, 0.3),
    "rg_lru": ({"kind": "rg_lru", "heads": 2, "width": 24, "chunk": 16}, 0.3),
}
#: Each state tensor's shape for 2 rows of a 16-wide model, whatever the context.
STATE_SHAPES = {"short_conv": {"conv": (2, 16, 2)}, "rg_lru": {"conv": (2, 24, 3), "h": (2, 24), "begun": (2,)}}


def mixer(name: str, dim: int = 16, moved: bool = True, **options) -> torch.nn.Module:
    """The mixer ``name`` of MIXERS (its spec with ``options``) of width ``dim``, its parameters
    moved by its σ (unless not ``moved``)."""
    spec, sigma = MIXERS[name]
    layer = seqzoo.registry().create("mixer", {**spec, **options}, dim)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * (sigma if moved else 0.0))
    return layer


@pytest.mark.parametrize("name", MIXERS)
def test_without_autograd_a_long_sequence_runs_in_segments_equal_to_the_whole(name, monkeypatch):
    """Segments of 8 over 150 tokens (a left-padded row whose pads cross the first segment's end,
    a state that continues): the same outputs and the same state as one pass with autograd on,
    and the forward without autograd is the whole once, then 18 segments of 8 and one of 6."""
    layer = mixer(name)
    calls, forward = [], type(layer).forward
    monkeypatch.setattr(type(layer), "forward", lambda self, *a: calls.append(a[0].shape[1]) or forward(self, *a))
    monkeypatch.setattr(_segments, "SEGMENT", 8)
    segments_equivalence(layer, length=150, pad=11)
    assert calls[0] == calls[1] == 150 and set(calls[2:]) <= {8, 6} and len(calls) == 2 + 19  # 18 × 8 + 6


@pytest.mark.parametrize("name", MIXERS)
def test_the_decoding_state_has_the_same_size_after_10_and_after_600_tokens(name):
    """A step's cost cannot grow with the context when the state it reads does not."""
    layer, shapes = mixer(name), []
    for length in (10, 600):
        state = layer.new_state(2, length)
        with torch.no_grad():
            layer(torch.randn(2, length, 16), _context(torch.arange(length)[None]), state)
            layer(torch.randn(2, 1, 16), _context(torch.tensor([[length]])), state)
        shapes.append({key: tuple(t.shape) for key, t in vars(state).items()})
    assert shapes[0] == shapes[1] == STATE_SHAPES.get(name, shapes[0])


@pytest.mark.parametrize("name", MIXERS)
def test_bfloat16_inputs_and_autocast_keep_a_float32_state_and_stay_close_to_float32(name):
    """The conv's history stays in the model's dtype (it holds inputs); the recurrence's state in
    float32; the outputs within 5% of the largest float32 one."""
    bfloat16_equivalence(mixer(name), inputs=("conv",), length=40, tolerance=0.05)


# -- fla's Triton kernels on CUDA against the plain path --------------------------------------------
class OnCuda(NamedTuple):
    kernels: Callable[[], object]   # fla's kernels for the mixer, or None where the installed fla lacks them
    required: bool                  # whether fla without them fails the test (else it skips)
    tolerance: tuple[float, float]  # in float32 and bfloat16: fla's dots may run in tf32 or bfloat16,
                                    # cuDNN's float32 conv in tf32
    options: dict = {}              # at C = 128
    moved: bool = False             # the parameters moved as in MIXERS
    padded: bool = False            # a left-padded row: the kernels must leave its state alone there too
    floor: float = 0.0              # allowed besides the tolerance (fla's mLSTM adds ε inside the max)


WIDE = {"head_dim": 64, "value_head_dim": 64}
ON_CUDA = {
    "mamba": OnCuda(lambda: _conv_state._fla_conv(), True, (2e-3, 3e-2)),  # the conv alone: the scan is torch's
    "mamba2": OnCuda(lambda: _conv_state._fla_conv(), True, (2e-3, 3e-2)),
    "gated_deltanet": OnCuda(lambda: _delta_rule._fla_kernels(False), False, (5e-3, 5e-2), {"head_dim": 64}),
    "kda": OnCuda(lambda: _delta_rule._fla_kernels(True), False, (5e-3, 5e-2), {"head_dim": 64}),
    "gla": OnCuda(lambda: _gla._fla_kernels(True), False, (5e-3, 5e-2), WIDE, True, True, 1e-6),
    "lightning": OnCuda(lambda: _gla._fla_kernels(False), False, (5e-3, 5e-2), WIDE, True, True, 1e-6),
    "mlstm": OnCuda(lambda: _mlstm._fla_kernels(), False, (5e-3, 5e-2), WIDE, True, True, 1e-6),
    "short_conv": OnCuda(lambda: _conv_state._fla_conv(), True, (2e-3, 3e-2)),
    "rg_lru": OnCuda(lambda: _conv_state._fla_conv() and _diagonal_scan._fla_kernels(), True, (2e-3, 3e-2)),
}


@pytest.mark.cuda
@pytest.mark.parametrize("name", ON_CUDA)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_fla_kernels_equal_the_torch_path(name, dtype):
    """Forward, every gradient, the decode steps and the state after them: fla's chunk and
    fused-recurrent kernels and its causal_conv1d (every conv mixer's, through
    ``_conv_state.causal_conv``) against the chunked forms and torch's conv (SEQZOO_SCAN=torch), on
    the same mixer, 290 tokens and then 10 steps."""
    pytest.importorskip("fla")
    case = ON_CUDA[name]
    if case.kernels() is None:
        assert not case.required, f"fla is installed without the kernels {name} takes"
        pytest.skip(f"the installed fla has no kernel for {name}")
    layer = mixer(name, 128, moved=case.moved, **case.options).cuda().to(dtype)
    x = torch.randn(2, 300, 128, device="cuda", dtype=dtype)
    padding = None
    if case.padded:
        padding = torch.ones(2, 290, dtype=torch.long, device="cuda")
        padding[1, :7] = 0
    kernel_paths_agree(layer, x, tolerance=case.tolerance[dtype == torch.bfloat16], padding=padding,
                       floor=case.floor)
