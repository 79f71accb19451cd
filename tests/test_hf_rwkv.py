"""RWKV-4 (transformers' ``rwkv``) against transformers: small random models chosen to exercise what
sets the family apart — eval-mode rescaling every 2 or 3 blocks (the LayerNorms' ε times 4 per
group), a WKV narrower than the model (attention_hidden_size ≠ C, which transformers runs only
without its cache), a tied head, a layer_norm_epsilon ≠ ln_out's 1e-5, token-shift weights, decays,
bonuses, norms and embeddings drawn at random (transformers starts time_first at ones and the
embeddings at 1e-4), 70 tokens (two scan chunks of 32 and a part) — imported with
``seqzoo.from_hf``: logits ≤ 1e-4 in float32, the state seqzoo's cache holds against transformers'
``state``, greedy decoding with and without the cache, exports transformers loads with the same
logits, and the refusals.

transformers' reference here is its full forward: its one-token step broadcasts a (B, 1, C) input
with a (B, C) state to (B, B, C), so its cached ``generate`` mixes the rows of a batch (checked
below) and is compared row by row; and it ignores ``attention_mask``, so padding is compared with the
row alone."""
from __future__ import annotations

import json
import re

import pytest
import torch

import seqzoo
from seqzoo.nn.generation import generate
from seqzoo.recipe import resolve
from seqzoo.testing import parity, relative_difference

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.filterwarnings("ignore:.*no tokenizer written")  # random models have none

V = 96    # vocabulary of every test model
T = 70    # test sequence length: two 32-token chunks of the scan and part of a third
IDS = dict(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0)
RWKV = seqzoo.registry().get("converter", "rwkv").cls()


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def rwkv(**kw):
    """C = 48, F = 72, 5 blocks rescaled every 2 (ε, ε, 4ε, 4ε, 16ε; ln_out 1e-5·16), weights drawn
    so that every one of them moves the logits."""
    config = {**IDS, "hidden_size": 48, "num_hidden_layers": 5, "intermediate_size": 72, "rescale_every": 2,
              "context_length": 128, **kw}
    model = transformers.RwkvForCausalLM(transformers.RwkvConfig(**config))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("pre_ln.weight", "ln1.weight", "ln2.weight", "ln_out.weight")):
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif "time_mix" in name:
                p.uniform_(0.0, 1.0)
            elif "time_first" in name or "embeddings" in name:
                p.normal_(0.0, 1.0)
            elif "time_decay" in name:
                p.normal_(0.0, 1.5)
    return model


MODELS = {
    # ε·4^⌊i/2⌋ over 5 blocks: exact, ln_out's 1e-5·16 equals the last block's
    "rwkv-rescaled": lambda: rwkv(),
    # a WKV 40 wide (no cache for transformers), rescaled every 3 blocks of 4, a tied head
    "rwkv-narrow-wkv": lambda: rwkv(attention_hidden_size=40, num_hidden_layers=4, rescale_every=3, use_cache=False,
                                    tie_word_embeddings=True),
    # RWKV-4-169M's layout in small: 4 blocks, halved after the 2nd and the 4th (ln_out's ε 16e-5, the
    # last block's 4e-5: the last ln2 takes 16e-5)
    "rwkv-169m-layout": lambda: rwkv(num_hidden_layers=4),
    # no rescaling, layer_norm_epsilon 1e-6 (ln_out keeps 1e-5: the last ln2 takes it)
    "rwkv-eps": lambda: rwkv(rescale_every=0, layer_norm_epsilon=1e-6),
}
#: The models whose logits equal transformers' eval mode as float32 computes them: every LayerNorm's ε
#: has a seqzoo norm of its own. The others' last ln2 shares the final norm's ε (the converter's notes).
EXACT = ("rwkv-rescaled", "rwkv-narrow-wkv")


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    return parity.cached_imports(lambda name: MODELS[name](), tmp_path_factory)


def full_forward_greedy(hf, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """transformers' greedy decoding by full forwards (no state)."""
    return parity.hf_greedy(hf, ids, torch.ones_like(ids), steps, use_cache=False)


# -- parity ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_family_matches_transformers_and_exports(imported, name, tmp_path):
    """Logits ≤ 1e-4 (max |Δ| 8e-7 and 1.1e-5 of logits up to 2 and 45 for the exact models: float32's
    rounding; 6e-5 and 3e-6 where the last ln2 takes ln_out's ε) and an exported folder
    transformers loads with the same logits."""
    pair = imported(name)
    parity.check_logits(pair, T)
    if name in EXACT:
        ids = torch.randint(V, (2, T))
        with torch.no_grad():
            assert relative_difference(pair.model(ids), pair.hf(ids).logits) < 1e-6
    out = parity.check_export(pair, tmp_path / "out", T)
    assert json.loads((out / "config.json").read_text())["model_type"] == "rwkv"


@pytest.mark.parametrize("name", MODELS)
def test_greedy_decoding_with_and_without_the_cache_is_transformers_full_forward_greedy(imported, name):
    """32 steps from an 8-token prompt of 2 rows, seqzoo cached and uncached."""
    pair = imported(name)
    ids = torch.randint(3, V, (2, 8))
    theirs = full_forward_greedy(pair.hf, ids, 32)
    for use_cache in (True, False):
        assert torch.equal(generate(pair.model, ids, 32, eos_id=None, use_cache=use_cache), theirs), use_cache


def test_transformers_cached_decoding_is_right_for_one_row_and_mixes_rows_in_a_batch(imported):
    """The reference itself: one row's cached greedy equals its full-forward greedy (and seqzoo's);
    two rows' cached greedy does not, where transformers' one-token step broadcasts across rows."""
    hf, model, _ = imported("rwkv-rescaled")
    ids = torch.randint(3, V, (2, 8))
    mask = torch.ones_like(ids)
    for row in range(2):
        one = parity.hf_greedy(hf, ids[row:row + 1], mask[row:row + 1], 32)
        assert torch.equal(one, full_forward_greedy(hf, ids[row:row + 1], 32))
        assert torch.equal(one, generate(model, ids[row:row + 1], 32, eos_id=None))
    assert not torch.equal(parity.hf_greedy(hf, ids, mask, 32), full_forward_greedy(hf, ids, 32))


def test_the_cached_state_is_transformers_state(imported):
    """After a 40-token prompt, every layer's state in seqzoo's cache — the two token shifts and the
    WKV's num, den, max — equals the ``state`` transformers returns (read on its eval-mode, rescaled
    model: the shifts hold LayerNorm outputs, which the rescaling does not change)."""
    hf, model, _ = imported("rwkv-rescaled")
    ids = torch.randint(3, V, (2, 40))
    with torch.no_grad():
        cache = model.new_cache(2, 40)
        model(ids, cache=cache)
        state = hf(ids, use_cache=True).state  # 5 tensors (B, C, L): ffn shift, attention shift, num, den, max
    for i in range(hf.config.num_hidden_layers):
        time, channel = cache.states[2 * i], cache.states[2 * i + 1]
        ours = (channel.shift, time.shift, time.num, time.den, time.max)
        assert relative_difference(ours, tuple(s[:, :, i] for s in state)) < 2e-6, i


def test_a_left_padded_row_equals_the_row_alone_where_transformers_reads_the_pads(imported):
    hf, model, _ = imported("rwkv-rescaled")
    ids, mask = parity.left_padded(V, T, pad=5)
    alone = ids[-1:, 5:]
    with torch.no_grad():
        ours, ours_alone = model(ids, attention_mask=mask)[-1, 5:], model(alone)[0]
        theirs, theirs_alone = hf(ids, attention_mask=mask).logits[-1, 5:], hf(alone).logits[0]
    assert parity.max_difference(ours, ours_alone) < parity.TOL
    assert parity.max_difference(ours_alone, theirs_alone) < parity.TOL
    assert parity.max_difference(theirs, theirs_alone) > 1e-3  # transformers' pads entered its state
    steps = generate(model, ids, 8, attention_mask=mask, eos_id=None)
    assert torch.equal(steps[-1:, 5:], generate(model, alone, 8, eos_id=None))


# -- what the recipes and exports say ---------------------------------------------------------------
def test_recipe_reads_the_blocks_and_the_rescaling(imported):
    m = imported("rwkv-rescaled").model.recipe["model"]
    assert m["layers"] == 10 and m["ffn"] is None and m["position"]["kind"] == "none"
    assert m["mixer"]["kind"] == "rwkv4" and m["mixer"]["width"] == 48 and m["tie_embeddings"] is False
    assert m["layer_types"]["channel"]["mixer"] == {**m["layer_types"]["channel"]["mixer"], "kind": "rwkv_channel_mix",
                                                    "hidden": 72, "receptance": True}
    assert m["pattern"] == ["time", "channel"] * 2 + ["time_1", "channel_1"] * 2 + ["time_2", "channel_2"]
    assert m["norm"]["eps"] == m["embed_norm"]["eps"] == 1e-5
    assert [m["layer_types"][f"time_{g}"]["norm"]["eps"] for g in (1, 2)] == pytest.approx([4e-5, 16e-5])
    assert not m["layer_overrides"]
    m = imported("rwkv-169m-layout").model.recipe["model"]
    assert m["layer_overrides"] == {"7": {"norm": {"kind": "layernorm", "eps": pytest.approx(16e-5)}}}
    m = imported("rwkv-narrow-wkv").model.recipe["model"]
    assert m["mixer"]["width"] == 40 and m["tie_embeddings"] is True
    assert m["pattern"] == ["time", "channel"] * 3 + ["time_1", "channel_1"]


@pytest.mark.parametrize("name", MODELS)
def test_export_writes_the_config_it_read(imported, name, tmp_path):
    hf, model, _ = imported(name)
    config = json.loads((seqzoo.to_hf(model, tmp_path / "out") / "config.json").read_text())
    wanted = hf.config
    assert config["layer_norm_epsilon"] == pytest.approx(wanted.layer_norm_epsilon)
    for key in ("rescale_every", "hidden_size", "num_hidden_layers", "attention_hidden_size", "intermediate_size",
                "context_length", "tie_word_embeddings"):
        assert config[key] == getattr(wanted, key), key
    assert config["use_cache"] is (wanted.attention_hidden_size == wanted.hidden_size)


def test_tiny_rwkv4_exports_as_rwkv_without_rescaling(tmp_path):
    """tiny-rwkv4 (one ε, 1e-5, as ln_out's) is an RWKV-4 transformers loads, with the same logits."""
    model = seqzoo.build("tiny-rwkv4", device="cpu").eval()
    out = seqzoo.to_hf(model, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "rwkv" and config["rescale_every"] == 0 and config["num_hidden_layers"] == 4
    hf = transformers.RwkvForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(3, 259, (2, 70))
    with torch.no_grad():
        assert parity.max_difference(model(ids), hf(ids).logits) < parity.TOL


# -- refusals ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, match", [
    ({"rescale_every": 1.5}, r"config\.json: rescale_every 1\.5 is not supported; it must be an integer"),
    ({"rescale_every": True}, r"rescale_every True is not supported"),
    ({"layer_norm_epsilon": 0}, r"layer_norm_epsilon 0 is not supported; it must be a positive number"),
    ({"attention_hidden_size": -4}, r"attention_hidden_size -4 is not supported; it must be a positive integer"),
    ({"context_length": 0}, r"context_length 0 is not supported"),
])
def test_configs_seqzoo_cannot_read_are_refused_in_one_line(imported, tmp_path, change, match):
    parity.check_refused(imported("rwkv-rescaled").folder, tmp_path / "edited", change, match)


def recipe(overrides: list[str], name: str = "tiny-rwkv4") -> dict:
    return resolve(name, overrides).data


@pytest.mark.parametrize("overrides, match", [
    (["model.layer_types.channel.mixer.receptance=false"], r"RWKV-4's channel mix has a receptance"),
    (["model.pattern=[channel,time]"], r"alternate rwkv4 and rwkv_channel_mix, beginning with rwkv4"),
    (["model.layers=7"], r"alternate rwkv4 and rwkv_channel_mix"),
    (["model.layer_overrides={2: {mixer: {kind: rwkv4, width: 32}}}"], r"time mixes are all alike"),
    (["model.layer_overrides={4: {norm: {kind: layernorm, eps: 1.0e-3}}}"], r"LayerNorms share one ε"),
    (["model.norm={kind: rmsnorm, eps: 1.0e-5}"], r"LayerNorms share one ε"),
    (["model.layer_overrides={7: {norm: {kind: layernorm, eps: 1.0e-6}}}"], r"the last layer's is ln_out's"),
    (["model.embed_norm=null"], r"model\.embed_norm: RWKV normalises its embeddings"),
    (["model.position=learned"], r"a pre-norm mixer alone, added unscaled, with no position scheme"),
    (["model.residual_multiplier=0.5"], r"added unscaled"),
    (["model.logits_multiplier=2.0"], r"no embedding scale, multipliers or softcap"),
])
def test_models_that_are_no_rwkv_4_are_refused_with_the_reason(overrides, match):
    problem = RWKV.accepts(recipe(overrides))
    assert problem is not None and re.search(match, problem), problem


def test_other_families_are_refused():
    assert "alternate rwkv4" in RWKV.accepts(recipe([], "tiny-rwkv7"))
    assert "needs decoder_lm" in RWKV.accepts(recipe([], "tiny-bert"))
