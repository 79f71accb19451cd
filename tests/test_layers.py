"""Heterogeneous stacks: per-layer patterns in recipes, their errors and layout, the recurrent mixer
as a layer, and the shipped recipes of the 2023–2026 block families — each builds, trains a few
steps, and decodes exactly like its full forward (greedy, batched with left padding, compiled)."""
from __future__ import annotations

import textwrap

import pytest
import torch

import seqzoo
from seqzoo.builder import layer_plan, merge
from seqzoo.builder.layout import describe_layout
from seqzoo.cli import main
from seqzoo.config import TrainConfig
from seqzoo.recipe import resolve
from seqzoo.train.training import train

FAMILIES = ["tiny-gemma2", "tiny-gemma3", "tiny-smollm3", "tiny-neox", "tiny-olmo2", "tiny-sinks", "tiny-gru-mixer"]


def write(tmp_path, text: str):
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(text).lstrip())
    return path


# -- patterns ---------------------------------------------------------------------------------------
def test_pattern_repeats_and_overrides_pick_the_layer_parts():
    model = resolve("tiny-gemma3", ["model.layers=12", "model.layer_overrides={0: global, 7: {ffn: {hidden: 32}}}"])
    plans = layer_plan(model.data["model"])
    assert [p.type for p in plans] == ["global", *["local"] * 4, "global", "local", "local", "local", "local",
                                       "local", "global"]
    assert [p.attention.window for p in plans[:6]] == [None, 8, 8, 8, 8, None]
    assert plans[1].position["base"] == 10000 and plans[5].position["base"] == 1e6
    assert plans[7].ffn["hidden"] == 32 and plans[7].attention.window == 8  # parts merge over its type
    assert plans[6].ffn["hidden"] == 128


def test_merge_keeps_params_of_the_same_kind_and_replaces_another_kind():
    base = {"kind": "rope", "base": 1e4, "rotary_dim": 8}
    assert merge(base, {"base": 1e6}) == {"kind": "rope", "base": 1e6, "rotary_dim": 8}
    assert merge(base, "none") == {"kind": "none"}
    assert merge(base, {"kind": "alibi"}) == {"kind": "alibi"}


def test_stack_shares_one_scheme_per_distinct_configuration():
    model = seqzoo.build("tiny-gemma3", device="cpu")
    assert len(model.decoder.schemes) == 2 and model.decoder.layer_scheme == [1, 1, 1, 1, 1, 0]
    assert model.decoder.schemes[1].base == 10000 and model.decoder.position.base == 1e6


@pytest.mark.parametrize("override, message", [
    ("model.layers=1", r"tiny-gemma2\.yaml:\d+: model\.pattern: 2 entries for layers=1; the pattern names one"),
    ("model.pattern=[local, globl]", r"model\.pattern\.1: unknown layer type 'globl'; did you mean 'global'\?"),
    ("model.layer_types.local.atention={window: 3}",
     r"model\.layer_types\.local\.atention: unknown layer part 'atention'; did you mean 'attention'\?"),
    ("model.layer_types.local.attention.window=-1",
     r"model\.layer_types\.local\.attention\.window: -1 is out of range: must be >= 1"),
    ("model.layer_types.local.position={kind: learned}",
     r"model\.layer_types\.local\.position: 'learned' adds to the token embeddings"),
    ("model.layer_overrides={9: global}", r"model\.layer_overrides\.9: layer 9 does not exist \(layers=4"),
    ("model.layer_overrides={1: {ffn: {kind: swiglu, hiden: 3}}}",
     r"model\.layer_overrides\.1\.ffn\.hiden: unknown key 'hiden'; did you mean 'hidden'\?"),
    ("model.mixer={kind: attention, heads: 8}", r"model\.mixer: the attention parameters are given twice"),
    ("model.pattern=null", r"model\.layer_types: layer types without a pattern are never used"),
])
def test_layer_errors_name_the_type_or_index_and_the_key(tmp_path, override, message):
    recipe = write(tmp_path, """
        extends: tiny-gemma2
        model:
          layers: 4
        """)
    with pytest.raises(seqzoo.RecipeError, match=message):
        resolve(recipe, [override])


def test_show_prints_the_layout_compactly(capsys):
    assert main(["show", "tiny-gemma3", "--set", "model.layers=12"]) == 0
    assert "\nlayers 0-4 local (window 8, rope 10000) · 5 global ×2\n" in capsys.readouterr().out
    assert describe_layout(resolve("tiny-smollm3").data["model"]) == "layers 0-2 rope · 3 nope"
    assert describe_layout(resolve("tiny-gpt").data["model"]) is None


def test_a_pattern_that_does_not_divide_the_layers_cuts_its_last_period_short():
    """Gemma 3 1B: 26 layers, every 6th global — layer i takes pattern[i % 6], as HF configs do."""
    model = resolve("tiny-gemma3", ["model.layers=8"]).data["model"]
    windows = [plan.attention.window for plan in layer_plan(model)]
    assert windows == [8, 8, 8, 8, 8, None, 8, 8]
    assert describe_layout(model) == ("layers 0-4 local (window 8, rope 10000) · 5 global · "
                                      "6-7 local (window 8, rope 10000)")


# -- the recurrent mixer as a layer ---------------------------------------------------------------------
def test_recurrent_mixer_layers_run_any_registered_cell():
    for cell in ("gru", "lstm", "rnn"):
        model = seqzoo.build("tiny-gru-mixer", [f"model.mixer.cell={cell}"], device="cpu").eval()
        assert type(model.decoder.blocks[0].mixer.cell).__name__.lower() == cell
        ids = torch.randint(0, 256, (2, 7))
        assert torch.equal(seqzoo.generate(model, ids, 6, eos_id=None),
                           seqzoo.generate(model, ids, 6, eos_id=None, use_cache=False))


def test_recurrent_mixer_state_does_not_grow_with_length():
    model = seqzoo.build("tiny-gru-mixer", device="cpu")
    small, large = model.new_cache(2, 16), model.new_cache(2, 4096)
    assert small.states[0].value.shape == large.states[0].value.shape == (2, 64)


def test_an_encoder_refuses_a_causal_only_mixer():
    with pytest.raises(seqzoo.RecipeError, match=r"model\.mixer: mixer 'recurrent' is causal by construction and "
                                                 r"cannot serve a bidirectional"):
        seqzoo.build("tiny-bert", ["model.mixer={kind: recurrent, cell: gru}"], device="cpu")


def test_hybrid_stack_mixes_attention_and_recurrent_layers():
    model = seqzoo.build("tiny-gpt", [
        "model.layer_types={attn: {}, gru: {mixer: {kind: recurrent, cell: gru}}}",
        "model.pattern=[gru, attn]"], device="cpu").eval()
    kinds = [type(b.mixer).__name__ for b in model.decoder.blocks]
    assert kinds == ["RecurrentMixer", "AttentionMixer"] * 2
    cache = model.new_cache(1, 8)
    assert [type(s).__name__ for s in cache.states] == ["CellState", "KVSlice"] * 2
    ids = torch.randint(0, 256, (3, 6))
    assert torch.equal(seqzoo.generate(model, ids, 5, eos_id=None),
                       seqzoo.generate(model, ids, 5, eos_id=None, use_cache=False))


# -- the shipped family recipes ---------------------------------------------------------------------
@pytest.mark.parametrize("name", FAMILIES)
def test_family_recipe_trains_a_few_steps(name):
    model = seqzoo.build(name, device="cpu")
    config = TrainConfig(task={"kind": "copy", "min_len": 1, "max_len": 4}, steps=30, batch_size=8, lr=3e-3,
                         warmup=1, eval_examples=4, log_every=1)
    result = train(model, config, seqzoo.tokenizer(model), quiet=True)
    losses = torch.tensor([entry["loss"] for entry in result.history])
    # from ln(259) = 5.56 to about 3.1 in 30 steps (measured 0.55-0.57 of the first loss for each family)
    assert torch.isfinite(losses).all() and losses[-5:].mean() < 0.7 * losses[0], losses


@pytest.mark.parametrize("name", FAMILIES)
def test_family_recipe_decodes_exactly_like_its_full_forward(name):
    model = seqzoo.build(name, device="cpu").eval()
    ids = torch.randint(0, 256, (2, 14))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(2, 14)
        steps = [model(ids[:, :5], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(5, 14)]
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5
    prompt = ids[:, :6]
    assert torch.equal(seqzoo.generate(model, prompt, 10, eos_id=None),
                       seqzoo.generate(model, prompt, 10, eos_id=None, use_cache=False))


@pytest.mark.parametrize("name", FAMILIES)
def test_family_recipe_batched_left_padding_equals_each_prompt_alone(name):
    model = seqzoo.build(name, device="cpu").eval()
    prompts = [torch.randint(0, 256, (n,)) for n in (3, 9, 6)]
    batched = seqzoo.generate(model, prompts, 8, eos_id=None)
    for prompt, out in zip(prompts, batched):
        assert torch.equal(out, seqzoo.generate(model, prompt[None], 8, eos_id=None)[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_family_recipe_compiled_decoding_equals_eager(name):
    model = seqzoo.build(name, device="cpu").eval()
    ids = torch.randint(0, 256, (2, 5))
    assert torch.equal(seqzoo.generate(model, ids, 12, eos_id=None, compile=True),
                       seqzoo.generate(model, ids, 12, eos_id=None))


@pytest.mark.parametrize("name, problem", [
    ("tiny-gemma2", r"model\.pattern: layers differ"), ("tiny-neox", r"model\.residual is parallel"),
    ("tiny-gru-mixer", r"model\.mixer is recurrent"), ("tiny-sinks", r"model\.pattern: layers differ")])
def test_export_to_a_uniform_family_refuses_what_it_would_drop(tmp_path, name, problem):
    model = seqzoo.build(name, device="cpu")
    with pytest.raises(seqzoo.CheckpointError, match=f"cannot export as llama: {problem}"):
        seqzoo.to_hf(model, tmp_path / "out", model_type="llama")


def test_export_refuses_softcaps_and_sinks_in_a_uniform_stack(tmp_path):
    for override, problem in (("model.final_softcap=30.0", "final_softcap is set"),
                              ("model.attention.softcap=50.0", "attention.softcap is set"),
                              ("model.attention.sinks=true", "attention.sinks is set")):
        model = seqzoo.build("tiny-llama", [override], device="cpu")
        with pytest.raises(seqzoo.CheckpointError, match=problem):
            seqzoo.to_hf(model, tmp_path / "out", model_type="llama")


def test_layer_override_indices_survive_a_checkpoint_round_trip(tmp_path):
    recipe = resolve("tiny-gemma2", ["model.layer_overrides={0: global}"]).data
    assert recipe["model"]["layer_overrides"] == {"0": "global"}
    model = seqzoo.build(recipe, device="cpu")
    path = seqzoo.save(model, tmp_path / "m.safetensors")
    assert seqzoo.load(path).recipe["model"] == model.recipe["model"]


PURE_MAMBA2 = {"seqzoo": 1, "model": {"kind": "decoder_lm", "vocab_size": 259, "dim": 32, "layers": 2,
                                      "max_seq_len": 64, "position": "none", "norm": "rmsnorm", "ffn": None,
                                      "mixer": {"kind": "mamba2", "state": 8, "head_dim": 8}}}


def test_a_model_whose_layers_never_attend_needs_no_attention_section(tmp_path):
    model = seqzoo.build(PURE_MAMBA2, device="cpu").eval()
    assert model.recipe["model"]["attention"] is None
    ids = torch.randint(0, 256, (2, 10))
    full = model(ids)
    cache = model.new_cache(2, 10)
    steps = torch.cat([model(ids[:, t:t + 1], cache=cache) for t in range(10)], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    seqzoo.save(model, tmp_path / "m.safetensors")
    torch.testing.assert_close(seqzoo.load(tmp_path / "m.safetensors").eval()(ids), full)


def test_a_layer_that_attends_still_needs_the_section():
    types = {"ssm": {}, "att": {"mixer": "attention"}}
    hybrid = {**PURE_MAMBA2, "model": {**PURE_MAMBA2["model"], "layer_types": types, "pattern": ["ssm", "att"]}}
    with pytest.raises(seqzoo.RecipeError, match=r"model.attention: missing required key 'attention': "
                                                 r"model.layer_types.att's mixer is attention"):
        seqzoo.build(hybrid, device="meta")
    with pytest.raises(seqzoo.RecipeError, match=r"the layers' mixer is attention"):
        seqzoo.build({**PURE_MAMBA2, "model": {**PURE_MAMBA2["model"], "mixer": None}}, device="meta")


# -- the builder ------------------------------------------------------------------------------------
def test_the_attention_section_is_shorthand_for_the_attention_mixer():
    section = seqzoo.build("tiny-llama", device="cpu")
    attention = section.recipe["model"]["attention"]
    torch.manual_seed(0)
    section = seqzoo.build("tiny-llama", device="cpu").eval()
    torch.manual_seed(0)
    long_form = seqzoo.build("tiny-llama", ["model.attention=null", f"model.mixer={{kind: attention, "
                             f"heads: {attention['heads']}, kv_heads: {attention['kv_heads']}, "
                             f"bias: {str(attention['bias']).lower()}}}"], device="cpu").eval()
    assert section.state_dict().keys() == long_form.state_dict().keys()
    ids = torch.randint(0, 256, (2, 9))
    torch.testing.assert_close(long_form(ids), section(ids), rtol=0, atol=0)
    plans = [layer_plan(m.recipe["model"]) for m in (section, long_form)]
    assert plans[0] == plans[1]  # the same plan: {kind: attention} with the section's keys in .attention


def test_the_builder_builds_from_the_registry_it_is_given(fresh):
    from seqzoo.builder import Parts
    from seqzoo.interfaces import Norm
    from seqzoo.plugins.model.decoder_lm import DecoderLM
    from seqzoo.registry import Component, build_registry

    class HalfNorm(Norm):
        """x / 2: a norm only the private registry knows."""

        def forward(self, x):
            return x / 2

    private = build_registry()
    private.add(Component("norm", "half", HalfNorm, plugin="test"))
    model = DecoderLM(Parts(private), vocab_size=16, dim=8, layers=1, max_seq_len=8,
                      attention=seqzoo.nn.attention.AttentionConfig(heads=2), norm="half")
    assert isinstance(model.decoder.final_norm, HalfNorm)
    with pytest.raises(seqzoo.RegistryError, match="unknown norm 'half'"):  # the global registry is untouched
        fresh().get("norm", "half")
