"""``seqzoo.nn.blocked``: attention in blocks of queries and keys with an online softmax equals the
materialised softmax(cap·tanh(q kᵀ·scale / cap) + bias, masked) v, with sinks, in forward and
gradients (learned biases and sinks included), at lengths that are not a multiple of the block."""
from __future__ import annotations

import pytest
import torch

from seqzoo.functional import masked_softmax_attend, softcap
from seqzoo.nn.blocked import BlockedPlan, blocked_attention


def reference(q, k, v, *, scale, cap, bias, mask, sink):
    repeat = q.shape[1] // k.shape[1]
    logits = softcap((q @ k.repeat_interleave(repeat, 1).transpose(-2, -1)) * scale, cap)
    return masked_softmax_attend(logits, v.repeat_interleave(repeat, 1), mask=mask, bias=bias, sink=sink)


@pytest.mark.parametrize("cap", [None, 5.0])
@pytest.mark.parametrize("bias_rows", [0, 1, 2])  # no bias, one shared by the rows, one per row
@pytest.mark.parametrize("with_sink", [False, True])
def test_blocks_equal_the_materialised_path_forward_and_backward(cap, bias_rows, with_sink):
    torch.manual_seed(0)
    b, h, kv, t, d = 2, 4, 2, 37, 8  # 37 = 4 blocks of 8 and 5
    q, k, v = (torch.randn(b, n, t, d, dtype=torch.float64, requires_grad=True) for n in (h, kv, kv))
    table = torch.randn(h, 2 * t + 3, dtype=torch.float64, requires_grad=True)  # a learned bias by distance
    sink = torch.randn(h, dtype=torch.float64, requires_grad=True) if with_sink else None
    i, j = torch.arange(t)[:, None], torch.arange(t)[None]
    visible = (j <= i) & (i - j < 20)  # causal, a window
    visible = visible[None, None].expand(b, 1, t, t).clone()
    visible[1, :, :, :6] = False  # row 1: six padded keys; its first six queries see nothing
    q_pos = torch.arange(t).expand(max(bias_rows, 1), t)
    k_pos = q_pos + torch.arange(q_pos.shape[0])[:, None] * 3  # per row: row 1's keys three further on
    index = k_pos[:, None, :] - q_pos[:, :, None] + t  # (B|1, T, S) into the table
    full_bias = table[:, index].transpose(0, 1) if bias_rows else None

    def distance(q0, q1, k0, k1):
        return index[:, q0:q1, k0:k1]

    plan = BlockedPlan(0.3, cap, lambda q0, q1: (0, t), lambda q0, q1, k0, k1: visible[..., q0:q1, k0:k1],
                       distance, block=8)
    got = blocked_attention(q, k, v, plan, sink, table if bias_rows else None)
    expected = reference(q, k, v, scale=0.3, cap=cap, bias=full_bias, mask=visible, sink=sink)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)
    weights = torch.randn_like(expected)
    leaves = [x for x in (q, k, v, table, sink) if x is not None and (x is not table or bias_rows)]
    mine = torch.autograd.grad((got * weights).sum(), leaves)
    theirs = torch.autograd.grad((expected * weights).sum(), leaves)
    for a, b_ in zip(mine, theirs):
        torch.testing.assert_close(a, b_, atol=1e-9, rtol=1e-9)


def test_bfloat16_inputs_compute_in_float32_and_come_back_in_bfloat16():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 20, 8) for _ in range(3))
    plan = BlockedPlan(0.35, 30.0, lambda q0, q1: (0, q1), lambda q0, q1, k0, k1: (
        torch.arange(k0, k1)[None] <= torch.arange(q0, q1)[:, None]), block=8)
    low = blocked_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), plan)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), blocked_attention(q, k, v, plan), atol=3e-2, rtol=3e-2)
