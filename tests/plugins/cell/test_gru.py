"""The ``gru`` cell against torch.nn.GRUCell step by step, torch.nn.GRU over whole (and packed)
sequences with the weights copied by name, and the r, z, n formulas of torch's (cuDNN's) form (docs/formulas.md §12)."""
from __future__ import annotations

import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import seqzoo
from seqzoo.plugins.cell.gru import GRU

B, T, I, H = 3, 6, 4, 5


def make(**params) -> GRU:
    return seqzoo.registry().create("cell", {"kind": "gru", **params}, I, H)


def sequence_weights(cell: GRU) -> dict:
    """Our cell's parameters under torch.nn.GRU's one-layer names (weight_ih -> weight_ih_l0)."""
    return {f"{name}_l0": value for name, value in cell.state_dict().items()}


def test_step_matches_torch_grucell_with_copied_weights():
    ours = make()
    ref = torch.nn.GRUCell(I, H)
    ref.load_state_dict(ours.state_dict())
    x, h_ref = torch.randn(B, T, I), torch.randn(B, H)
    h = h_ref
    for t in range(T):
        out, h = ours.step(x[:, t], h)
        h_ref = ref(x[:, t], h_ref)
        torch.testing.assert_close(out, h_ref)
        torch.testing.assert_close(h, h_ref)


def test_step_applies_the_reset_gate_to_whn_h_plus_bhn():
    ours = make()
    x, h = torch.randn(B, I), torch.randn(B, H)
    xi_r, xi_z, xi_n = (x @ ours.weight_ih.T + ours.bias_ih).chunk(3, dim=-1)
    hh_r, hh_z, hh_n = (h @ ours.weight_hh.T + ours.bias_hh).chunk(3, dim=-1)
    r, z = torch.sigmoid(xi_r + hh_r), torch.sigmoid(xi_z + hh_z)
    n = torch.tanh(xi_n + r * hh_n)  # r multiplies W_hn h + b_hn (after the matmul)
    torch.testing.assert_close(ours.step(x, h)[1], (1 - z) * n + z * h)
    # Cho et al.'s published form (reset before W_hn, b_hn outside r) is a different function
    w_hn, b_hn = ours.weight_hh[2 * H:], ours.bias_hh[2 * H:]
    n_cho = torch.tanh(xi_n + (r * h) @ w_hn.T + b_hn)
    assert not torch.allclose(ours.step(x, h)[1], (1 - z) * n_cho + z * h)


def test_forward_matches_torch_gru_outputs_state_and_gradients():
    ours = make()
    ref = torch.nn.GRU(I, H, batch_first=True)
    ref.load_state_dict(sequence_weights(ours))
    x, h0 = torch.randn(B, T, I), torch.randn(B, H)
    out, h = ours(x, h0)
    out_ref, h_ref = ref(x, h0[None])
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(h, h_ref[0])
    (out.pow(2).sum() + h.sum()).backward()
    (out_ref.pow(2).sum() + h_ref.sum()).backward()
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, getattr(ref, f"{name}_l0").grad)


def test_forward_with_lengths_matches_torch_packed_gru():
    ours = make()
    ref = torch.nn.GRU(I, H, batch_first=True)
    ref.load_state_dict(sequence_weights(ours))
    x, lengths, h0 = torch.randn(B, T, I), torch.tensor([5, 1, 6]), torch.randn(B, H)
    out, h = ours(x, h0, lengths)
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out_ref, h_ref = ref(packed, h0[None])
    out_ref, _ = pad_packed_sequence(out_ref, batch_first=True, total_length=T)
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(h, h_ref[0])


def test_padding_never_changes_a_real_output_with_lengths():
    ours, x, lengths = make(), torch.randn(B, T, I), torch.tensor([6, 2, 4])
    noisy = x.clone()
    noisy[1, 2:], noisy[2, 4:] = 10.0, float("nan")  # not even NaN padding may leak
    out, h = ours(noisy, lengths=lengths)
    for row, n in enumerate(lengths.tolist()):
        alone, h_alone = ours(x[row:row + 1, :n])
        torch.testing.assert_close(out[row, :n], alone[0])
        torch.testing.assert_close(h[row], h_alone[0])
        assert torch.all(out[row, n:] == 0)


def test_learn_initial_state_adds_h0_and_uses_it():
    ours = make(learn_initial_state=True)
    assert [n for n, _ in ours.named_parameters()][-1] == "h0"
    with torch.no_grad():
        ours.h0.copy_(torch.randn(H))
    x = torch.randn(B, T, I)
    out, h = ours(x)
    torch.testing.assert_close(out, ours(x, ours.h0.detach().expand(B, H))[0])
    stepped, state = [], ours.initial_state(B)
    for t in range(T):
        h_t, state = ours.step(x[:, t], state)
        stepped.append(h_t)
    torch.testing.assert_close(out, torch.stack(stepped, dim=1))
    h.sum().backward()
    assert ours.h0.grad.abs().sum() > 0
