"""The ``rnn`` cell (Elman, tanh or relu) against torch.nn.RNNCell step by step and torch.nn.RNN
over whole (and packed) sequences, with the weights copied by name."""
from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import seqzoo
from seqzoo.errors import ConfigError, RegistryError
from seqzoo.plugins.cell.rnn import RNN

B, T, I, H = 3, 6, 4, 5


def make(**params) -> RNN:
    return seqzoo.registry().create("cell", {"kind": "rnn", **params}, I, H)


def sequence_weights(cell: RNN) -> dict:
    """Our cell's parameters under torch.nn.RNN's one-layer names (weight_ih -> weight_ih_l0)."""
    return {f"{name}_l0": value for name, value in cell.state_dict().items()}


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_step_matches_torch_rnncell_with_copied_weights(nonlinearity):
    ours = make(nonlinearity=nonlinearity)
    ref = torch.nn.RNNCell(I, H, nonlinearity=nonlinearity)
    ref.load_state_dict(ours.state_dict())
    x, h_ref = torch.randn(B, T, I), torch.randn(B, H)
    h = h_ref
    for t in range(T):
        out, h = ours.step(x[:, t], h)
        h_ref = ref(x[:, t], h_ref)
        torch.testing.assert_close(out, h_ref)
        torch.testing.assert_close(h, h_ref)


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_forward_matches_torch_rnn_outputs_state_and_gradients(nonlinearity):
    ours = make(nonlinearity=nonlinearity)
    ref = torch.nn.RNN(I, H, nonlinearity=nonlinearity, batch_first=True)
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


def test_forward_with_lengths_matches_torch_packed_rnn():
    ours = make()
    ref = torch.nn.RNN(I, H, batch_first=True)
    ref.load_state_dict(sequence_weights(ours))
    x, lengths = torch.randn(B, T, I), torch.tensor([4, 6, 2])  # unsorted on purpose
    out, h = ours(x, lengths=lengths)
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out_ref, h_ref = ref(packed)
    out_ref, _ = pad_packed_sequence(out_ref, batch_first=True, total_length=T)
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(h, h_ref[0])


def test_padding_never_changes_a_real_output_with_lengths():
    ours, x, lengths = make(), torch.randn(B, T, I), torch.tensor([6, 3, 1])
    noisy = x.clone()
    noisy[1, 3:], noisy[2, 1:] = 100.0, -100.0
    out, h = ours(noisy, lengths=lengths)
    for row, n in enumerate(lengths.tolist()):
        alone, h_alone = ours(x[row:row + 1, :n])
        torch.testing.assert_close(out[row, :n], alone[0])
        torch.testing.assert_close(h[row], h_alone[0])
        assert torch.all(out[row, n:] == 0)


def test_forward_equals_step_loop_with_a_zero_length_row():
    ours, x = make(), torch.randn(B, T, I)
    h0, lengths = torch.randn(B, H), torch.tensor([0, 6, 3])
    fused = ours(x, h0, lengths)
    looped = seqzoo.interfaces.RecurrentCell.forward(ours, x, h0, lengths)  # the default step loop
    torch.testing.assert_close(fused, looped)
    torch.testing.assert_close(fused[1][0], h0[0])  # an empty row keeps its initial state
    assert fused[0][0].abs().max() == 0


def test_init_matches_torch_rnncell_under_the_same_seed():
    torch.manual_seed(3)
    ours = make()
    torch.manual_seed(3)
    ref = torch.nn.RNNCell(I, H)
    for name, value in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[name], value), name
    bound = H ** -0.5
    assert all(p.abs().max() <= bound for p in ours.parameters())
    assert ours.own_init


def test_without_bias_matches_torch_rnncell_without_bias():
    ours = make(bias=False)
    assert [n for n, _ in ours.named_parameters()] == ["weight_ih", "weight_hh"]
    ref = torch.nn.RNNCell(I, H, bias=False)
    ref.load_state_dict(ours.state_dict())
    x, h = torch.randn(B, T, I), torch.zeros(B, H)
    out, _ = ours(x)
    for t in range(T):
        h = ref(x[:, t], h)
        torch.testing.assert_close(out[:, t], h)


def test_learn_initial_state_adds_h0_and_uses_it():
    ours = make(learn_initial_state=True)
    assert "h0" in dict(ours.named_parameters()) and "h0" not in dict(make().named_parameters())
    torch.testing.assert_close(ours.initial_state(B), torch.zeros(B, H))  # zeros until learned
    with torch.no_grad():
        ours.h0.copy_(torch.randn(H))
    x = torch.randn(B, T, I)
    out, _ = ours(x)
    torch.testing.assert_close(out, ours(x, ours.h0.detach().expand(B, H))[0])
    assert not torch.allclose(out, ours(x, torch.zeros(B, H))[0])
    out.sum().backward()
    assert ours.h0.grad is not None and ours.h0.grad.abs().sum() > 0


def test_unknown_nonlinearity_raises_naming_the_choices():
    with pytest.raises(ConfigError, match=r"nonlinearity='sigmoid' must be 'tanh' or 'relu'"):
        RNN(I, H, nonlinearity="sigmoid")
    with pytest.raises(RegistryError, match=r"cell\.nonlinearity: 'sigmoid' is not one of 'tanh', 'relu'"):
        make(nonlinearity="sigmoid")
