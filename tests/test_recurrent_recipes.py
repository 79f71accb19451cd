"""Every shipped recipe built on a recurrent mixer decodes through its states exactly as the model
without a cache computes: token by token and after a prompt prefilled through several chunks,
left-padded rows as each row alone, beam search (whose reordered states must give what the
uncached search gives), and the fixed-shape steps of compiled decoding — ``seqzoo.testing``'s
model checks, parametrized over the recipes. Then the layouts of tiny-gla, tiny-xlstm, tiny-lfm2
and tiny-griffin (the other recipes' are in their mixers' test files)."""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.testing import (
    beam_search_equivalence,
    kv_cache_equivalence,
    left_padding_equivalence,
    static_cache_equivalence,
)

LIGHTNING = ["model.mixer.decay=head_fixed", "model.mixer.feature_map=silu", "model.mixer.scale=1.0",
             "model.mixer.norm=whole", "model.mixer.gate=sigmoid"]
#: id -> (recipe, overrides, σ of the noise added to the mixers' parameters: gates that write and
#: forget from the first token, where GLA's and the mLSTM's start barely do).
RECIPES = {
    "tiny-mamba": ("tiny-mamba", [], 0.0),
    "tiny-mamba2": ("tiny-mamba2", [], 0.0),
    "tiny-linear": ("tiny-linear", [], 0.0),
    "tiny-hybrid": ("tiny-hybrid", [], 0.0),  # Mamba-2 and attention
    "tiny-gdn": ("tiny-gdn", [], 0.0),
    "tiny-kda": ("tiny-kda", [], 0.0),
    "tiny-gla": ("tiny-gla", [], 0.2),
    "tiny-gla-lightning": ("tiny-gla", LIGHTNING, 0.2),
    "tiny-xlstm": ("tiny-xlstm", [], 0.2),
    "tiny-lfm2": ("tiny-lfm2", [], 0.0),
    "tiny-griffin": ("tiny-griffin", [], 0.0),  # the RG-LRU and local attention (a window of 16)
    "tiny-rwkv7": ("tiny-rwkv7", [], 0.0),
}


def model(name: str) -> torch.nn.Module:
    recipe, overrides, sigma = RECIPES[name]
    built = seqzoo.build(recipe, overrides=overrides, device="cpu").eval()
    with torch.no_grad():
        for block in built.decoder.blocks:
            for p in block.mixer.parameters():
                p.add_(torch.randn_like(p) * sigma)
    return built


@pytest.mark.parametrize("name", RECIPES)
def test_cached_decoding_equals_the_full_forward(name):
    """80 tokens, 3 and then one at a time (several of RWKV-7's chunks of 32), within 1e-5; a
    90-token prompt, 70 prefilled (past tiny-griffin's window and a scan chunk of 64) and 20 steps
    on, within 1e-4; greedy generation the same with and without the cache."""
    lm = model(name)
    kv_cache_equivalence(lm, length=80)
    kv_cache_equivalence(lm, length=90, prefill=70, tolerance=1e-4)


@pytest.mark.parametrize("name", RECIPES)
def test_left_padded_rows_decode_as_each_row_alone(name):
    """12-token prompts, one left-padded by 5: its last logits and its 16 generated tokens are
    those of the row alone, and cached generation equals uncached."""
    left_padding_equivalence(model(name), length=12, pad=5, new_tokens=16)


@pytest.mark.parametrize("name", RECIPES)
def test_beam_search_reorders_the_states(name):
    beam_search_equivalence(model(name), prompt=6, new_tokens=10, beam_size=3)


@pytest.mark.parametrize("name", RECIPES)
def test_static_cache_decoding_equals_the_growing_cache(name):
    """The fixed-shape steps ``generate(compile=True)`` traces, left-padded rows included."""
    static_cache_equivalence(model(name), steps=12)


# -- each recipe's layout ---------------------------------------------------------------------------
def test_gla_and_xlstm_follow_their_models_layouts():
    """tiny-gla: fla's GLA model (GLA and a SwiGLU FFN in every layer); tiny-xlstm: xLSTM-7B's block
    (norm, mLSTM, residual; norm, SwiGLU, residual), untied embeddings, logits capped at 30."""
    gla, xlstm = seqzoo.build("tiny-gla", device="cpu"), seqzoo.build("tiny-xlstm", device="cpu")
    assert [type(b.mixer).__name__ for b in gla.decoder.blocks] == ["GLA"] * 4
    assert [type(b.mixer).__name__ for b in xlstm.decoder.blocks] == ["MLSTM"] * 4
    for lm in (gla, xlstm):
        assert all(type(b.ffn).__name__ == "SwiGLU" and b.mixer_norm is not None for b in lm.decoder.blocks)
    assert xlstm.final_softcap == 30.0 and xlstm.lm_head.weight is not xlstm.embed.weight
    layer = xlstm.decoder.blocks[0].mixer
    assert (layer.heads * layer.head_dim, layer.heads * layer.value_head_dim) == (32, 64)  # C / 2, C
    state = xlstm.new_cache(1, 16).states[0]
    assert (state.C.shape, state.n.shape, state.m.shape) == ((1, 2, 16, 32), (1, 2, 16), (1, 2))
    assert gla.new_cache(1, 16).states[0].S.shape == (1, 2, 16, 32)


def test_lfm2_and_griffin_follow_their_models_layouts():
    lfm2, griffin = seqzoo.build("tiny-lfm2", device="cpu"), seqzoo.build("tiny-griffin", device="cpu")
    assert [type(b.mixer).__name__ for b in lfm2.decoder.blocks] == ["ShortConv", "ShortConv", "AttentionMixer"] * 2
    assert [type(b.mixer).__name__ for b in griffin.decoder.blocks] == ["RGLRU", "RGLRU", "AttentionMixer"] * 2
    attention = lfm2.decoder.blocks[2].mixer
    assert attention.q_norm is not None and attention.k_norm is not None and attention.kv_heads == 2
    attention = griffin.decoder.blocks[2].mixer
    assert (attention.window, attention.kv_heads) == (16, 1)
    for lm, shapes in ((lfm2, {"conv": (1, 64, 2)}), (griffin, {"conv": (1, 64, 3), "h": (1, 64), "begun": (1,)})):
        cache = lm.new_cache(1, 16)
        assert [type(s).__name__ for s in cache.states[:3]] == ["RecurrentState"] * 2 + ["KVSlice"]
        assert {name: tuple(t.shape) for name, t in vars(cache.states[0]).items()} == shapes
