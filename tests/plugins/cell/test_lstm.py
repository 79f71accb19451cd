"""The ``lstm`` cell against torch.nn.LSTMCell step by step, torch.nn.LSTM over whole (and packed)
sequences with the weights copied by name, and the gate formulas (i, f, g, o) written out (docs/formulas.md §12)."""
from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import seqzoo
from seqzoo.errors import ConfigError, InputError
from seqzoo.plugins.cell.lstm import LSTM

B, T, I, H = 3, 6, 4, 5


def make(**params) -> LSTM:
    return seqzoo.registry().create("cell", {"kind": "lstm", **params}, I, H)


def sequence_weights(cell: LSTM) -> dict:
    """Our cell's parameters under torch.nn.LSTM's one-layer names (weight_ih -> weight_ih_l0)."""
    return {f"{name}_l0": value for name, value in cell.state_dict().items()}


def test_step_matches_torch_lstmcell_with_copied_weights():
    ours = make()
    ref = torch.nn.LSTMCell(I, H)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(B, T, I)
    state = state_ref = (torch.randn(B, H), torch.randn(B, H))
    for t in range(T):
        out, state = ours.step(x[:, t], state)
        state_ref = ref(x[:, t], state_ref)
        torch.testing.assert_close(out, state_ref[0])
        torch.testing.assert_close(state, state_ref)


def test_step_matches_gate_formulas_in_order_i_f_g_o():
    ours = make()
    x, h, c = torch.randn(B, I), torch.randn(B, H), torch.randn(B, H)
    gates = x @ ours.weight_ih.T + ours.bias_ih + h @ ours.weight_hh.T + ours.bias_hh
    i, f, g, o = gates.chunk(4, dim=-1)
    c_next = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h_next = torch.sigmoid(o) * torch.tanh(c_next)
    out, (h_out, c_out) = ours.step(x, (h, c))
    torch.testing.assert_close(c_out, c_next)
    torch.testing.assert_close(h_out, h_next)
    torch.testing.assert_close(out, h_next)


def test_forward_matches_torch_lstm_outputs_state_and_gradients():
    ours = make()
    ref = torch.nn.LSTM(I, H, batch_first=True)
    ref.load_state_dict(sequence_weights(ours))
    x, h0, c0 = torch.randn(B, T, I), torch.randn(B, H), torch.randn(B, H)
    out, (h, c) = ours(x, (h0, c0))
    out_ref, (h_ref, c_ref) = ref(x, (h0[None], c0[None]))
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(h, h_ref[0])
    torch.testing.assert_close(c, c_ref[0])
    (out.pow(2).sum() + c.sum()).backward()
    (out_ref.pow(2).sum() + c_ref.sum()).backward()
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, getattr(ref, f"{name}_l0").grad)


def test_forward_with_lengths_matches_torch_packed_lstm():
    ours = make()
    ref = torch.nn.LSTM(I, H, batch_first=True)
    ref.load_state_dict(sequence_weights(ours))
    x, lengths = torch.randn(B, T, I), torch.tensor([2, 6, 5])  # unsorted on purpose
    state = (torch.randn(B, H), torch.randn(B, H))
    out, (h, c) = ours(x, state, lengths)
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out_ref, (h_ref, c_ref) = ref(packed, (state[0][None], state[1][None]))
    out_ref, _ = pad_packed_sequence(out_ref, batch_first=True, total_length=T)
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(h, h_ref[0])
    torch.testing.assert_close(c, c_ref[0])


def test_padding_never_changes_a_real_output_with_lengths():
    ours, x, lengths = make(), torch.randn(B, T, I), torch.tensor([3, 6, 1])
    noisy = x.clone()
    noisy[0, 3:], noisy[2, 1:] = 50.0, -50.0
    out, (h, c) = ours(noisy, lengths=lengths)
    for row, n in enumerate(lengths.tolist()):
        alone, (h_alone, c_alone) = ours(x[row:row + 1, :n])
        torch.testing.assert_close(out[row, :n], alone[0])
        torch.testing.assert_close(h[row], h_alone[0])
        torch.testing.assert_close(c[row], c_alone[0])
        assert torch.all(out[row, n:] == 0)


def test_learn_initial_state_adds_h0_and_c0_and_uses_them():
    ours = make(learn_initial_state=True)
    names = [n for n, _ in ours.named_parameters()]
    assert names == ["weight_ih", "weight_hh", "bias_ih", "bias_hh", "h0", "c0"]
    with torch.no_grad():
        ours.h0.copy_(torch.randn(H))
        ours.c0.copy_(torch.randn(H))
    x = torch.randn(B, T, I)
    out, _ = ours(x)
    given = (ours.h0.detach().expand(B, H), ours.c0.detach().expand(B, H))
    torch.testing.assert_close(out, ours(x, given)[0])
    out.sum().backward()
    assert ours.h0.grad.abs().sum() > 0 and ours.c0.grad.abs().sum() > 0
    # torch's weights still load into the cell's own parameters
    ours.load_state_dict(torch.nn.LSTMCell(I, H).state_dict(), strict=False)


def test_state_of_the_wrong_layout_raises():
    ours, x = make(), torch.randn(B, T, I)
    with pytest.raises(InputError,
                       match=r"LSTM: state must be a tuple of 2 tensors of shape \(B, hidden_size\)=\(3, 5\)"):
        ours(x, torch.zeros(B, H))
    with pytest.raises(InputError, match=r"got \[\(3, 5\), \(3, 4\)\]"):
        ours.step(x[:, 0], (torch.zeros(B, H), torch.zeros(B, 4)))


def test_non_positive_sizes_raise():
    with pytest.raises(ConfigError, match=r"LSTM: input_size=0 and hidden_size=5 must both be >= 1"):
        LSTM(0, H)
