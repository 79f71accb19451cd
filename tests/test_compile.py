"""torch.compile(fullgraph=True): no graph break in decoder_lm with scaled_dot + rope under every
scaling, nor in the static KV-cache decode step (traced once, reused every step and call).
Compiling takes ~10 s a graph on 2 CPU cores: slow."""
from __future__ import annotations

import pytest
import torch

import seqzoo

SCALINGS = [None, "{kind: linear, factor: 2}", "{kind: ntk, factor: 2}",
            "{kind: yarn, factor: 4, original_max_seq_len: 64}", "{kind: llama3, factor: 4, original_max_seq_len: 64}",
            "{kind: dynamic, factor: 2, original_max_seq_len: 64}"]


@pytest.mark.slow
@pytest.mark.parametrize("scaling", SCALINGS)
def test_forward_compiles_without_graph_breaks(scaling):
    position = "{kind: rope}" if scaling is None else f"{{kind: rope, scaling: {scaling}}}"
    model = seqzoo.build("tiny-llama", [f"model.position={position}"], device="cpu").eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    ids = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), model(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "overrides"), [
    ("tiny-gpt", []), ("tiny-llama", []), ("tiny-mistral", []), ("tiny-bloom", []), ("tiny-moe", []),
    ("tiny-gpt", ["model.position=t5"]), ("tiny-gpt", ["model.position=shaw"])])
def test_static_decode_step_compiles_whole_and_once(recipe, overrides):
    """The static decode step: one graph (fullgraph), traced once for all later steps."""
    from torch._dynamo.utils import counters

    from seqzoo.nn.generation import CausalSession, _decode_step

    model = seqzoo.build(recipe, overrides, device="cpu").eval()
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(_decode_step, fullgraph=True, dynamic=False)
    ids = torch.randint(1, 256, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0
    with torch.inference_mode():
        eager = CausalSession(model, ids, 12, True, mask, static=True)
        compiled = CausalSession(model, ids, 12, True, mask, static=True)
        compiled.step = step
        token = None
        for _ in range(12):
            want = eager.next(token)
            got = compiled.next(token)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            token = want.argmax(-1)
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.slow
def test_generate_compiled_equals_eager_and_reuses_the_graph():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    for recipe in ("tiny-gpt", "tiny-llama"):
        model = seqzoo.build(recipe, device="cpu").eval()
        prompts = [torch.randint(1, 256, (n,)) for n in (3, 9, 6)]
        eager = seqzoo.generate(model, prompts, 20, eos_id=None)
        for _ in range(2):  # the second call reuses the compiled step
            compiled = seqzoo.generate(model, prompts, 20, compile=True)
            assert all(torch.equal(a, b) for a, b in zip(compiled, eager))
        ids = torch.randint(1, 256, (1, 5))
        sampled = seqzoo.generate(model, ids, 15, temperature=0.8, top_k=20, seed=3, compile=True)
        assert torch.equal(sampled, seqzoo.generate(model, ids, 15, temperature=0.8, top_k=20, seed=3))
    # one graph per (model structure, batch size): gpt b=3, gpt b=1, llama b=3, llama b=1
    assert counters["stats"]["unique_graphs"] == 4


@pytest.mark.slow
def test_compiled_moe_generate_equals_eager_with_one_graph_per_batch_size():
    """The mixture of experts decodes through its gathered path (fixed shapes): batch 1 and batch 8
    at top-2 each compile once, and every later step and call reuses that graph."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = seqzoo.build("tiny-moe", device="cpu").eval()
    for batch in (1, 8):
        prompts = torch.randint(1, 256, (batch, 6))
        eager = seqzoo.generate(model, prompts, 16, eos_id=None)
        for _ in range(2):
            assert torch.equal(seqzoo.generate(model, prompts, 16, eos_id=None, compile=True), eager)
    assert counters["stats"]["unique_graphs"] == 2


@pytest.mark.slow
def test_every_model_gets_its_own_compiled_step():
    """dynamo's recompile limit belongs to a code object: with one shared decode step, the models
    after the limit silently decoded eagerly. Each model's step is its own, so with a limit of 1
    three models still compile three graphs."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    # torch's own patch, not monkeypatch: undoing a setattr on torch's config module deleted the
    # key, and the next test's compilation found no recompile_limit at all.
    with torch._dynamo.config.patch(recompile_limit=1):
        for recipe in ("tiny-gpt", "tiny-llama", "tiny-mamba"):
            model = seqzoo.build(recipe, device="cpu").eval()
            ids = torch.randint(1, 256, (1, 5))
            assert torch.equal(seqzoo.generate(model, ids, 8, eos_id=None, compile=True),
                               seqzoo.generate(model, ids, 8, eos_id=None))
    assert counters["stats"]["unique_graphs"] == 3


@pytest.mark.slow
def test_cli_generate_compile_gives_the_same_ids(tmp_path, capsys):
    from seqzoo.cli import main

    assert main(["build", "tiny-gpt", "-o", str(tmp_path / "m.safetensors")]) == 0
    capsys.readouterr()
    runs = []
    for extra in ([], ["--compile"]):
        assert main(["generate", str(tmp_path / "m.safetensors"), "--ids", "5,6,7", "--max-new-tokens", "9",
                     *extra]) == 0
        runs.append(capsys.readouterr().out.strip())
    assert runs[0] == runs[1] and len(runs[0].split(",")) == 12


@pytest.mark.slow
def test_a_compiled_generation_sees_weights_changed_since_it_was_compiled():
    """The compiled decode step is frozen (its weights are constants of the graph, packed once for
    the BLAS): after an in-place change of the weights (a training step, a load) the next compiled
    generation is compiled afresh and gives the new weights' tokens, not the old ones."""
    model = seqzoo.build("tiny-llama", device="cpu").eval()
    prompt = torch.randint(3, 250, (1, 6))
    before = seqzoo.generate(model, prompt, 12, compile=True, eos_id=None)
    assert torch.equal(before, seqzoo.generate(model, prompt, 12, eos_id=None))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * parameter.std().nan_to_num(0.02))
    after = seqzoo.generate(model, prompt, 12, compile=True, eos_id=None)
    assert torch.equal(after, seqzoo.generate(model, prompt, 12, eos_id=None))
    assert not torch.equal(after, before)  # the change moved the tokens: the old graph would show
