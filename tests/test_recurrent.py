"""RecurrentStack against torch.nn.LSTM/GRU/RNN (layers, bidirectional, packed batches) with the
weights copied by name; padding, dropout and state handling; RecurrentCell's default step loop;
and the conformance kit's cell checks catching a cell whose forward disagrees with its step."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import seqzoo
from seqzoo.builder import Parts
from seqzoo.errors import ConfigError, InputError
from seqzoo.interfaces import RecurrentCell
from seqzoo.nn.recurrent import RecurrentStack
from seqzoo.plugins.cell.gru import GRU
from seqzoo.testing import check_component

B, T, I, H = 3, 7, 4, 5
TORCH = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}


def cell_factory(spec):
    """make(input_size, hidden_size) for a registered cell: what a recurrent model's builder hands its stack."""
    return Parts.installed().factory("cell", spec)


def torch_copy(stack: RecurrentStack, kind: str) -> torch.nn.RNNBase:
    """torch's multi-layer module with our weights: cells.{l}.{d}.weight_ih -> weight_ih_l{l}[_reverse]."""
    ref = TORCH[kind](I, H, num_layers=stack.num_layers, bidirectional=stack.bidirectional,
                      batch_first=True)
    weights = {}
    for layer, cells in enumerate(stack.cells):
        for direction, cell in enumerate(cells):
            suffix = f"_l{layer}" + ("_reverse" if direction else "")
            weights.update({name + suffix: value for name, value in cell.state_dict().items()})
    ref.load_state_dict(weights)
    return ref


def torch_state(states: list) -> Tensor | tuple[Tensor, Tensor]:
    """Our [layer][direction] states -> torch's (layers·dirs, B, H) tensors (h, or (h, c))."""
    flat = [s for layer in states for s in layer]
    if isinstance(flat[0], Tensor):
        return torch.stack(flat)
    return torch.stack([s[0] for s in flat]), torch.stack([s[1] for s in flat])


def random_states(stack: RecurrentStack, kind: str) -> list:
    def one():
        return (torch.randn(B, H), torch.randn(B, H)) if kind == "lstm" else torch.randn(B, H)
    return [[one() for _ in range(stack.directions)] for _ in range(stack.num_layers)]


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn"])
def test_stack_matches_torch_two_layer_bidirectional_with_copied_weights(kind):
    stack = RecurrentStack(I, H, cell_factory({"kind": kind}), layers=2, bidirectional=True)
    ref = torch_copy(stack, kind)
    x, start = torch.randn(B, T, I), random_states(stack, kind)
    out, states = stack(x, start)
    out_ref, final_ref = ref(x, torch_state(start))
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(torch_state(states), final_ref)
    out.pow(2).sum().backward()
    out_ref.pow(2).sum().backward()
    for name, p in ref.named_parameters():
        layer, direction = int(name.split("_l")[1][0]), int(name.endswith("_reverse"))
        ours = getattr(stack.cells[layer][direction], name.split("_l")[0])
        torch.testing.assert_close(ours.grad, p.grad, msg=name)


def test_stack_matches_torch_packed_bidirectional_lstm_with_lengths():
    stack = RecurrentStack(I, H, cell_factory("lstm"), layers=2, bidirectional=True)
    ref = torch_copy(stack, "lstm")
    x, lengths, start = torch.randn(B, T, I), torch.tensor([3, 7, 5]), random_states(stack, "lstm")
    out, states = stack(x, start, lengths)
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out_ref, final_ref = ref(packed, torch_state(start))
    out_ref, _ = pad_packed_sequence(out_ref, batch_first=True, total_length=T)
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(torch_state(states), final_ref)


def test_padding_never_changes_a_real_position_bidirectional():
    stack = RecurrentStack(I, H, cell_factory("gru"), layers=2, bidirectional=True)
    x, lengths = torch.randn(B, T, I), torch.tensor([7, 2, 4])
    noisy = x.clone()
    noisy[1, 2:], noisy[2, 4:] = 100.0, -100.0
    out, states = stack(noisy, lengths=lengths)
    for row, n in enumerate(lengths.tolist()):
        alone, alone_states = stack(x[row:row + 1, :n])
        torch.testing.assert_close(out[row, :n], alone[0])
        assert torch.all(out[row, n:] == 0)
        for layer in range(2):
            for direction in range(2):
                torch.testing.assert_close(states[layer][direction][row], alone_states[layer][direction][0])


def test_dropout_only_between_layers_and_only_in_training():
    stack = RecurrentStack(I, H, cell_factory("lstm"), layers=2, dropout=0.5)
    plain = RecurrentStack(I, H, cell_factory("lstm"), layers=2)
    plain.load_state_dict(stack.state_dict())
    x = torch.randn(B, T, I)
    stack.eval()
    torch.testing.assert_close(stack(x)[0], plain(x)[0])
    stack.train()
    a, b = stack(x)[0], stack(x)[0]
    assert not torch.allclose(a, b) and not torch.allclose(a, plain(x)[0])
    one_layer = RecurrentStack(I, H, cell_factory("lstm"), layers=1, dropout=0.5).train()
    torch.testing.assert_close(one_layer(x)[0], one_layer(x)[0])  # nothing between layers to drop


def test_state_continues_a_sequence_in_nested_or_bare_form():
    stack = RecurrentStack(I, H, cell_factory("lstm"), layers=2).eval()
    x = torch.randn(B, T, I)
    full, full_states = stack(x)
    first, states = stack(x[:, :3])
    assert isinstance(states[0], list) and len(states[0]) == 1  # [layer][direction], always
    rest, _ = stack(x[:, 3:], states)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full)
    bare = [layer[0] for layer in states]  # one cell state per layer: a decoder's habit
    torch.testing.assert_close(stack(x[:, 3:], bare)[0], rest)
    torch.testing.assert_close(RecurrentStack.output(full_states[-1]), full[:, -1])


def test_output_concatenates_directions_like_the_outputs():
    stack = RecurrentStack(I, H, cell_factory("gru"), bidirectional=True)
    x = torch.randn(B, T, I)
    out, states = stack(x)
    top = RecurrentStack.output(states[-1])  # (B, 2H): forward's last step, backward's first
    torch.testing.assert_close(top[:, :H], out[:, -1, :H])
    torch.testing.assert_close(top[:, H:], out[:, 0, H:])


def test_reorder_state_picks_rows_of_every_tensor():
    stack = RecurrentStack(I, H, cell_factory("lstm"), layers=2, bidirectional=True)
    _, states = stack(torch.randn(B, T, I))
    rows = torch.tensor([2, 2, 0])
    picked = RecurrentStack.reorder_state(states, rows)
    assert isinstance(picked, list) and isinstance(picked[1][1], tuple)
    torch.testing.assert_close(picked[1][1][1], states[1][1][1][rows])


def test_bad_stack_settings_raise():
    with pytest.raises(ConfigError, match=r"recurrent stack: layers=0 must be >= 1"):
        RecurrentStack(I, H, cell_factory("lstm"), layers=0)
    with pytest.raises(ConfigError, match=r"recurrent stack: dropout=1.0 must be in \[0, 1\)"):
        RecurrentStack(I, H, cell_factory("lstm"), dropout=1.0)


def test_bad_state_raises():
    stack = RecurrentStack(I, H, cell_factory("gru"), layers=2, bidirectional=True)
    x = torch.randn(B, T, I)
    with pytest.raises(InputError, match=r"state must be a list of 2 per-layer states, got 1 entries"):
        stack(x, [[torch.zeros(B, H), torch.zeros(B, H)]])
    with pytest.raises(InputError, match=r"state\[1\] must be a list of 2 per-direction cell states"):
        stack(x, [[torch.zeros(B, H)] * 2, torch.zeros(B, H)])


def test_bad_inputs_and_lengths_raise():
    stack = RecurrentStack(I, H, cell_factory("gru"))
    with pytest.raises(InputError, match=r"GRU: x must be \(B, T >= 1, input_size=4\), got shape \(3, 7, 5\)"):
        stack(torch.randn(B, T, I + 1))
    with pytest.raises(InputError, match=r"x must be \(B, T >= 1, input_size=4\), got shape \(3, 0, 4\)"):
        stack(torch.randn(B, 0, I))
    x = torch.randn(B, T, I)
    with pytest.raises(InputError, match=r"lengths must lie in \[0, T=7\], got \[8\]; pad x"):
        stack(x, lengths=torch.tensor([7, 8, 1]))
    with pytest.raises(InputError, match=r"lengths must lie in \[0, T=7\], got \[-1\]"):
        stack(x, lengths=torch.tensor([-1, 2, 1]))
    with pytest.raises(InputError,
                       match=r"lengths must be an integer tensor of shape \(B,\)=\(3,\), got torch.float32"):
        stack(x, lengths=torch.tensor([7.0, 2.0, 1.0]))
    with pytest.raises(InputError, match=r"got torch.int64 of shape \(2,\)"):
        stack(x, lengths=torch.tensor([7, 2]))


# -- RecurrentCell's default forward and the conformance kit -----------------------------------
class StepOnlyGRU(RecurrentCell):
    """A third-party style cell that writes only ``step`` (torch.nn.GRUCell inside)."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__(input_size, hidden_size)
        self.cell = torch.nn.GRUCell(input_size, hidden_size)

    def step(self, x_t, state):
        h = self.cell(x_t, state)
        return h, h


class ResetBeforeGRU(GRU):
    """A buggy GRU: ``forward`` is torch's fused kernel (reset after W_hn h), but ``step`` is Cho et
    al.'s published form (reset before W_hn), so the two disagree."""

    def step(self, x_t, h):
        xr, xz, xn = (x_t @ self.weight_ih.T + self.bias_ih).chunk(3, dim=-1)
        hr, hz, _ = (h @ self.weight_hh.T + self.bias_hh).chunk(3, dim=-1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        w_hn, b_hn = self.weight_hh[2 * self.hidden_size:], self.bias_hh[2 * self.hidden_size:]
        n = torch.tanh(xn + (r * h) @ w_hn.T + b_hn)
        h = (1 - z) * n + z * h
        return h, h


@pytest.fixture
def register(monkeypatch):
    def add(name: str, cls: type) -> None:
        monkeypatch.setitem(seqzoo.registry().components, ("cell", name),
                            seqzoo.Component("cell", name, cls, plugin="tests"))
    return add


def test_default_forward_with_lengths_freezes_state_and_zeroes_padding():
    step_only = StepOnlyGRU(I, H)
    fused = GRU(I, H)
    fused.load_state_dict(step_only.cell.state_dict())
    x, lengths, h0 = torch.randn(B, T, I), torch.tensor([7, 0, 3]), torch.randn(B, H)
    out, h = step_only(x, h0, lengths)
    out_ref, h_ref = fused(x, h0, lengths)
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(h, h_ref)
    assert torch.all(out[1] == 0) and torch.equal(h[1], h0[1])


def test_conformance_kit_passes_a_step_only_cell(register):
    register("test_step_only", StepOnlyGRU)
    results = check_component("cell", "test_step_only")
    assert [r.check for r in results] == ["shapes", "step_matches_sequence", "lengths", "dtypes",
                                          "gradients", "state_dict"]
    assert all(r.passed for r in results), [str(r) for r in results]


def test_conformance_kit_fails_a_cell_whose_forward_disagrees_with_step(register):
    register("test_reset_before", ResetBeforeGRU)
    results = {r.check: r for r in check_component("cell", "test_reset_before")}
    failed = results["step_matches_sequence"]
    assert failed.status == "failed"
    assert "forward differs from the step loop" in failed.detail
    assert results["lengths"].passed and results["shapes"].passed
