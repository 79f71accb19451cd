"""What the ``gla`` and ``mlstm`` mixers share as layers: long inputs in segments, bfloat16 and
autocast with a float32 state, the shipped recipes (tiny-gla, tiny-xlstm, and tiny-gla with the
lightning options) decoding through their states exactly as the full forward does, left padding,
beam search; and fla's Triton kernels on CUDA against the plain path. The math of each is in
test_gla.py and test_mlstm.py."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.plugins.mixer import _gla, _mlstm
from seqzoo.testing._shared import kv_cache_equivalence, left_padding_equivalence
from seqzoo.testing.mixer import _context

SPECS = [{"kind": "gla", "heads": 2, "head_dim": 8, "gate_rank": 4, "chunk": 16},
         {"kind": "gla", "heads": 2, "decay": "head_fixed", "feature_map": "silu", "scale": 1.0, "norm": "whole",
          "gate": "sigmoid", "chunk": 16},
         {"kind": "mlstm", "heads": 2, "chunk": 16}]
IDS = ["gla", "lightning", "mlstm"]


def context(length: int, padding: torch.Tensor | None = None):
    """A causal context for ``length`` new tokens; ``padding`` (B, T) 0 at padded positions."""
    device = None if padding is None else padding.device
    return _context(torch.arange(length, device=device)[None], key_padding=padding)


def moving(spec: dict, dim: int = 16) -> torch.nn.Module:
    """The mixer with its parameters moved off their start (mLSTM's zero gate weights and −10
    input bias barely write at first: a test of the state would see little)."""
    mixer = seqzoo.registry().create("mixer", spec, dim)
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return mixer


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_without_autograd_a_long_sequence_runs_in_segments_equal_to_the_whole(spec, monkeypatch):
    """Segments of 8 over 150 tokens, a left-padded row whose pads cross a segment's end: the same
    outputs and the same state as one pass with autograd on."""
    segments = pytest.importorskip("seqzoo.plugins.mixer._segments")
    mixer = moving(spec)
    x = torch.randn(2, 150, 16)
    padding = torch.ones(2, 150, dtype=torch.long)
    padding[1, :11] = 0
    whole_state, cut_state = mixer.new_state(2, 150), mixer.new_state(2, 150)
    whole = mixer(x, context(150, padding), whole_state).detach()
    monkeypatch.setattr(segments, "SEGMENT", 8)
    with torch.no_grad():
        cut = mixer(x, context(150, padding), cut_state)
    torch.testing.assert_close(cut, whole, atol=1e-5, rtol=1e-5)
    for name, value in vars(whole_state).items():
        torch.testing.assert_close(getattr(cut_state, name), value.detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_bfloat16_inputs_and_autocast_keep_a_float32_state_and_stay_close_to_float32(spec):
    mixer = moving(spec)
    x = torch.randn(2, 40, 16)
    state = mixer.to(torch.bfloat16).new_state(2, 40)
    with torch.no_grad():
        low = mixer(x.bfloat16(), context(40), state)
        high = mixer.float()(x.bfloat16().float(), context(40))
    assert low.dtype == torch.bfloat16 and all(s.dtype == torch.float32 for s in vars(state).values())
    assert (low.float() - high).abs().max() <= 0.05 * high.abs().max()
    state = mixer.new_state(2, 40)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # the recurrence opts out of autocast
        mixed = mixer(x, context(40), state)
    assert all(s.dtype == torch.float32 for s in vars(state).values())
    assert (mixed.float() - high).abs().max() <= 0.05 * high.abs().max()


# -- whole models: the shipped recipes -------------------------------------------------------------
RECIPES = {"tiny-gla": [], "tiny-xlstm": [],
           "tiny-gla-lightning": ["model.mixer.decay=head_fixed", "model.mixer.feature_map=silu",
                                  "model.mixer.scale=1.0", "model.mixer.norm=whole", "model.mixer.gate=sigmoid"]}


@pytest.mark.parametrize("name", RECIPES)
def test_cached_greedy_decoding_and_left_padded_rows_equal_the_uncached_model(name):
    """seqzoo.testing's model checks (token by token through the states, left-padded batches), a
    90-token prompt prefilled through several chunks before decoding on, and beam search, whose
    reordered states must give what the uncached search gives."""
    model = seqzoo.build(name.removesuffix("-lightning"), overrides=RECIPES[name], device="cpu").eval()
    with torch.no_grad():
        for block in model.decoder.blocks:  # gates that write and forget from the first token
            for p in block.mixer.parameters():
                p.add_(torch.randn_like(p) * 0.2)
    kv_cache_equivalence(model, length=20)
    left_padding_equivalence(model)
    ids = torch.randint(3, 259, (2, 90))  # more than one chunk of 64
    with torch.no_grad():
        cache = model.new_cache(2, 90)
        pieces = [model(ids[:, :70], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(70, 90)]
        assert (torch.cat(pieces, 1) - model(ids)).abs().max() < 1e-4
    prompt = ids[:1, :6]
    beams = seqzoo.generate(model, prompt, 10, beam_size=3, eos_id=None)
    assert torch.equal(beams, seqzoo.generate(model, prompt, 10, beam_size=3, eos_id=None, use_cache=False))


def test_the_recipes_follow_their_models_layouts():
    """tiny-gla: fla's GLA model (GLA and a SwiGLU FFN in every layer); tiny-xlstm: xLSTM-7B's block
    (norm, mLSTM, residual; norm, SwiGLU, residual), untied embeddings, logits capped at 30."""
    gla, xlstm = seqzoo.build("tiny-gla", device="cpu"), seqzoo.build("tiny-xlstm", device="cpu")
    assert [type(b.mixer).__name__ for b in gla.decoder.blocks] == ["GLA"] * 4
    assert [type(b.mixer).__name__ for b in xlstm.decoder.blocks] == ["MLSTM"] * 4
    for model in (gla, xlstm):
        assert all(type(b.ffn).__name__ == "SwiGLU" and b.mixer_norm is not None for b in model.decoder.blocks)
    assert xlstm.final_softcap == 30.0 and xlstm.lm_head.weight is not xlstm.embed.weight
    layer = xlstm.decoder.blocks[0].mixer
    assert (layer.heads * layer.head_dim, layer.heads * layer.value_head_dim) == (32, 64)  # C / 2, C
    state = xlstm.new_cache(1, 16).states[0]
    assert (state.C.shape, state.n.shape, state.m.shape) == ((1, 2, 16, 32), (1, 2, 16), (1, 2))
    assert gla.new_cache(1, 16).states[0].S.shape == (1, 2, 16, 32)


# -- fla's Triton kernels on CUDA against the plain path --------------------------------------------
def _has_kernels(spec: dict) -> bool:
    if spec["kind"] == "mlstm":
        return _mlstm._fla_kernels() is not None
    return _gla._fla_kernels(spec.get("decay", "channel") == "channel") is not None


@pytest.mark.cuda
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_fla_kernels_equal_the_torch_path(spec, dtype, monkeypatch):
    """Forward (a left-padded row included), every gradient and the decode steps: fla's chunk and
    fused-recurrent kernels against the chunked forms of ``_gla`` / ``_mlstm`` (SEQZOO_SCAN=torch),
    on the same mixer. fla's mLSTM adds ε inside the max: within the tolerance."""
    pytest.importorskip("fla")
    if not _has_kernels(spec):
        pytest.skip(f"the installed fla has no kernel for {spec['kind']}")
    mixer = moving({**spec, "head_dim": 64, "value_head_dim": 64}, 128).cuda().to(dtype)
    x = torch.randn(2, 300, 128, device="cuda", dtype=dtype)
    padding = torch.ones(2, 290, dtype=torch.long, device="cuda")
    padding[1, :7] = 0  # a left-padded row: the kernels must leave its state alone there too
    tol = 5e-3 if dtype == torch.float32 else 5e-2  # fla's dots may run in tf32 or bfloat16

    def run(path: str):
        monkeypatch.setenv("SEQZOO_SCAN", path)
        mixer.zero_grad()
        leaf = x.detach().requires_grad_()
        state = mixer.new_state(2, 300, device="cuda", dtype=dtype)
        out = mixer(leaf[:, :290], context(290, padding), state)
        out.float().square().sum().backward()
        with torch.no_grad():
            steps = [mixer(leaf[:, t:t + 1], context(1), state) for t in range(290, 300)]
        outputs = [out, torch.cat(steps, 1), leaf.grad, *vars(state).values()]
        return outputs, [p.grad.clone() for p in mixer.parameters()]

    (fla, fla_grads), (plain, plain_grads) = run("fla"), run("torch")
    for got, want in zip(fla + fla_grads, plain + plain_grads):
        assert (got.float() - want.float()).abs().max() <= tol * want.float().abs().max() + 1e-6
