"""torch.compile(fullgraph=True): no graph break in decoder_lm with scaled_dot + rope under every
scaling, nor in a KV-cached decode step. Compiling takes ~10 s a graph on 2 CPU cores: slow."""
from __future__ import annotations

import pytest
import torch

import seqzoo

SCALINGS = [None, "{kind: linear, factor: 2}", "{kind: ntk, factor: 2}", "{kind: yarn, factor: 4, original_max_seq_len: 64}",
            "{kind: llama3, factor: 4, original_max_seq_len: 64}", "{kind: dynamic, factor: 2, original_max_seq_len: 64}"]


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
def test_kv_cached_decode_step_compiles_without_graph_breaks():
    model = seqzoo.build("tiny-llama", device="cpu").eval()
    torch._dynamo.reset()
    step = torch.compile(model, fullgraph=True, dynamic=False)
    ids = torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(2, 8)
        step(ids[:, :7], cache=cache)
        last = step(ids[:, 7:], cache=cache)
    torch.testing.assert_close(last[:, -1], full[:, -1], atol=1e-5, rtol=1e-5)
