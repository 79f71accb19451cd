"""Recipes: YAML loading, extends, overrides, validation errors with file:line: key.path."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import seqzoo
from seqzoo.recipe import resolve


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


TINY = """
seqzoo: 1
model:
  kind: decoder_lm
  vocab_size: 300
  dim: 32
  layers: 2
  max_seq_len: 64
  attention:
    heads: 4
    score: scaled_dot
"""


def test_resolve_fills_defaults(tmp_path):
    data = resolve(write(tmp_path, "r.yaml", TINY)).data
    assert data["model"]["position"] == {"kind": "learned"}
    assert data["model"]["norm"] == {"kind": "layernorm", "eps": 1e-5, "bias": True}
    assert data["model"]["attention"]["kv_heads"] is None
    assert data["runtime"] == {"device": "auto", "dtype": "float32", "compile": False, "threads": None}
    assert data["tokenizer"] == {"kind": "bytes"}


def test_resolve_is_idempotent_on_its_own_output(tmp_path):
    data = resolve(write(tmp_path, "r.yaml", TINY)).data
    assert resolve(data).data == data


def test_extends_shipped_recipe_by_name_deep_merges(tmp_path):
    child = write(tmp_path, "c.yaml", """
        seqzoo: 1
        extends: tiny-gpt
        model:
          layers: 1
          attention: {heads: 2}
    """)
    data = resolve(child).data
    assert data["model"]["layers"] == 1
    assert data["model"]["attention"]["heads"] == 2
    assert data["model"]["dim"] == 64  # inherited


def test_extends_relative_path_and_chains(tmp_path):
    write(tmp_path, "base.yaml", TINY)
    write(tmp_path, "mid.yaml", "extends: base.yaml\nmodel: {layers: 3}\n")
    sub = tmp_path / "sub"
    sub.mkdir()
    leaf = write(sub, "leaf.yaml", "extends: ../mid.yaml\nmodel: {dim: 64}\n")
    data = resolve(leaf).data
    assert (data["model"]["layers"], data["model"]["dim"], data["model"]["vocab_size"]) == (3, 64, 300)


def test_extends_component_of_another_kind_replaces_its_params(tmp_path):
    write(tmp_path, "base.yaml", TINY + "  norm: {kind: layernorm, eps: 1.0e-12, bias: false}\n")
    child = write(tmp_path, "c.yaml", "extends: base.yaml\nmodel:\n  norm: {kind: rmsnorm}\n")
    assert resolve(child).data["model"]["norm"] == {"kind": "rmsnorm", "eps": 1e-6}


def test_override_value_is_parsed_as_yaml(tmp_path):
    data = resolve("tiny-gpt", ["model.position={kind: rope, base: 500000}", "model.layers=2",
                                "model.tie_embeddings=false"]).data
    assert data["model"]["position"]["kind"] == "rope" and data["model"]["position"]["base"] == 500000.0
    assert data["model"]["layers"] == 2 and data["model"]["tie_embeddings"] is False


def test_override_sets_a_param_on_a_component_named_by_string():
    data = resolve("tiny-gpt", ["model.position=rope", "model.position.base=1000"]).data
    assert data["model"]["position"]["base"] == 1000.0


def test_build_from_dict_recipe_keeps_resolved_recipe_on_model():
    recipe = resolve("tiny-gpt").data
    model = seqzoo.build(recipe, device="cpu")
    assert model.recipe == recipe


@pytest.mark.parametrize("text, location, message", [
    ("    score: scaled_dt\n", r"r\.yaml:10: model\.attention\.score",
     r"unknown score 'scaled_dt'; did you mean 'scaled_dot'\?"),
    ("    hedas: 4\n", r"r\.yaml:10: model\.attention\.hedas", r"unknown key 'hedas'; did you mean 'heads'\?"),
    ("    kv_heads: 3\n", r"r\.yaml:10: model\.attention\.kv_heads", "heads=4 must be divisible by kv_heads=3"),
    ("    dropout: 1.5\n", r"r\.yaml:10: model\.attention\.dropout", "1.5 is out of range: must be < 1.0"),
    ("    window: 0\n", r"r\.yaml:10: model\.attention\.window", "0 is out of range: must be >= 1"),
    ("    bias: yes please\n", r"r\.yaml:10: model\.attention\.bias", "expected true or false"),
])
def test_validation_error_names_file_line_and_key(tmp_path, text, location, message):
    recipe = TINY.replace("    score: scaled_dot\n", "") + text
    with pytest.raises(seqzoo.RecipeError, match=rf"{location}: {message}"):
        resolve(write(tmp_path, "r.yaml", recipe))


def test_missing_key_points_at_its_section(tmp_path):
    recipe = TINY.replace("  layers: 2\n", "")
    with pytest.raises(seqzoo.RecipeError, match=r"/r\.yaml:2: model\.layers: missing required key 'layers'"):
        resolve(write(tmp_path, "r.yaml", recipe))


def test_wrong_type_from_override_names_the_override():
    with pytest.raises(seqzoo.RecipeError, match=r"^--set\[1\]:1: model\.layers: expected an integer, got 'four'"):
        resolve("tiny-gpt", ["model.layers=four"])


def test_dim_not_divisible_by_heads(tmp_path):
    with pytest.raises(seqzoo.RecipeError, match=r"model\.attention\.heads: dim=32 must be divisible by heads=5"):
        resolve("tiny-gpt", ["model.dim=32", "model.attention.heads=5"])


def test_unknown_top_level_key_is_an_error(tmp_path):
    with pytest.raises(seqzoo.RecipeError, match=r"r\.yaml:11: plugins: unknown key 'plugins'"):
        resolve(write(tmp_path, "r.yaml", TINY + "plugins: [evil.py]\n"))


def test_unknown_model_kind_suggests(tmp_path):
    with pytest.raises(seqzoo.RecipeError, match=r"r\.yaml:3: model\.kind: unknown model 'decoder_ln'; did you mean "
                                                 r"'decoder_lm'\?"):
        resolve(write(tmp_path, "r.yaml", TINY.replace("kind: decoder_lm", "kind: decoder_ln")))


def test_format_version_must_be_1(tmp_path):
    with pytest.raises(seqzoo.RecipeError, match=r"r\.yaml:1: seqzoo: recipe format version 2 is not supported; "
                                                 r"this seqzoo reads version 1 only \(write seqzoo: 1, or upgrade "
                                                 r"seqzoo for newer recipes\)$"):
        resolve(write(tmp_path, "r.yaml", TINY.replace("seqzoo: 1", "seqzoo: 2")))


def test_duplicate_key_is_an_error(tmp_path):
    with pytest.raises(seqzoo.RecipeError, match=r"r\.yaml:7: model\.layers: duplicate key \(first written on line "
                                                 r"6\)"):
        resolve(write(tmp_path, "r.yaml", TINY.replace("  layers: 2\n", "  layers: 2\n  layers: 3\n")))


def test_yaml_merge_keys_merge_and_their_errors_keep_their_lines(tmp_path):
    """`<<:` (YAML's merge key) reads as YAML says: the merged keys, the mapping's own winning; an
    error in a merged key points at the line it is written on."""
    text = textwrap.dedent("""\
        seqzoo: 1
        extends: tiny-gpt
        model:
          attention: &attention {heads: 2, bias: true}
          ffn:
            <<: [{hidden: 48}, {dropout: 0.1}]
          layers: 3
        """)
    model = resolve(write(tmp_path, "r.yaml", text)).data["model"]
    assert model["layers"] == 3 and model["attention"]["bias"] is True
    assert model["ffn"]["hidden"] == 48 and model["ffn"]["dropout"] == 0.1
    wrong = text.replace("dropout: 0.1", "dropuot: 0.1")
    with pytest.raises(seqzoo.RecipeError, match=r"r\.yaml:6: model\.ffn\.dropuot: unknown key 'dropuot'; did you"):
        resolve(write(tmp_path, "r.yaml", wrong))
    # through an alias: the line where the anchor's key is written, not the base recipe's line for the path
    aliased = text.replace("{heads: 2, bias: true}", "{heads: 2, bias: true}\n  layer_overrides:\n    '0':\n"
                           "      attention: {<<: *attention}")
    overrides = resolve(write(tmp_path, "r.yaml", aliased)).data["model"]["layer_overrides"]
    assert overrides["0"]["attention"]["bias"] is True
    from seqzoo.recipe.yaml_lines import read_yaml

    _, where = read_yaml(aliased, "r.yaml")
    assert where[("model", "layer_overrides", "0", "attention", "heads")] == ("r.yaml", 4)
    assert where[("model", "layer_overrides", "0", "attention")] == ("r.yaml", 7)


def test_invalid_yaml_reports_the_line(tmp_path):
    with pytest.raises(seqzoo.RecipeError, match=r"/r\.yaml:\d+: invalid YAML"):
        resolve(write(tmp_path, "r.yaml", TINY + "  oops: [unclosed\n"))


def test_non_mapping_recipe_is_an_error(tmp_path):
    with pytest.raises(seqzoo.RecipeError, match=r"r\.yaml:1: a recipe must be a mapping of keys, got list"):
        resolve(write(tmp_path, "r.yaml", "- a\n- b\n"))


def test_extends_missing_target(tmp_path):
    with pytest.raises(seqzoo.RecipeError, match=r"r\.yaml:1: extends: no recipe 'nope\.yaml'"):
        resolve(write(tmp_path, "r.yaml", "extends: nope.yaml\n"))


def test_extends_cycle_is_detected(tmp_path):
    write(tmp_path, "a.yaml", "extends: b.yaml\n")
    write(tmp_path, "b.yaml", "extends: a.yaml\n")
    with pytest.raises(seqzoo.RecipeError, match=r"extends: cycle .*a\.yaml -> b\.yaml -> a\.yaml"):
        resolve(tmp_path / "a.yaml")


def test_missing_recipe_file_lists_shipped():
    with pytest.raises(seqzoo.RecipeError, match=r"no-such\.yaml:1: no such recipe file or shipped recipe; shipped: "
                                                 r".*tiny-gpt"):
        resolve("no-such.yaml")


def test_a_misspelt_shipped_recipe_gets_a_suggestion():
    with pytest.raises(seqzoo.RecipeError, match=r"tiny-gtp:1: no such recipe file or shipped recipe; did you mean "
                                                 r"'tiny-gpt'\?"):
        resolve("tiny-gtp")


def test_override_without_equals_is_an_error():
    with pytest.raises(seqzoo.RecipeError, match=r"an override is key\.path=value"):
        resolve("tiny-gpt", ["model.layers"])


def test_vocab_smaller_than_tokenizer_is_an_error():
    with pytest.raises(seqzoo.RecipeError, match=r"model\.vocab_size: 100 is smaller than the bytes tokenizer's 259 "
                                                 r"ids"):
        resolve("tiny-gpt", ["model.vocab_size=100"])


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_bytes(b"seqzoo: 1\nmodel:\n  kind: \xff\n")
    with pytest.raises(seqzoo.RecipeError, match=r"r\.yaml:3: recipe is not valid UTF-8"):
        resolve(path)


def test_rope_rotary_dim_conflict_is_a_recipe_error():
    with pytest.raises(seqzoo.RecipeError, match=r"^--set\[1\]:1: model\.position: rope rotary_dim=7 must be even"):
        seqzoo.build("tiny-gpt", ["model.position={kind: rope, rotary_dim: 7}"], device="meta")


def test_scientific_notation_without_a_dot_is_a_number():
    """YAML 1.1 reads 1e-3 as a string; a float field takes it as the number it means."""
    data = resolve("tiny-gpt", ["model.norm={kind: layernorm, eps: 1e-12}"]).data
    assert data["model"]["norm"]["eps"] == 1e-12
    with pytest.raises(seqzoo.RecipeError, match=r"model\.norm\.eps: expected a number, got 'e-12'"):
        resolve("tiny-gpt", ["model.norm={kind: layernorm, eps: e-12}"])


def test_dict_recipe_extending_a_file_reports_its_own_keys_as_the_dict():
    with pytest.raises(seqzoo.RecipeError, match=r"^<recipe>:1: model\.attention\.score: unknown score 'scaled_dt'"):
        resolve({"extends": "tiny-gpt", "model": {"attention": {"heads": 4, "score": "scaled_dt"}}})
    # a key the dict does not set keeps the base file's line
    with pytest.raises(seqzoo.RecipeError, match=r"tiny-gpt\.yaml:\d+: model\.attention\.heads: dim=30 must be "
                                                 r"divisible by heads=4"):
        resolve({"extends": "tiny-gpt", "model": {"dim": 30}})


# -- the first hour: errors that name the file, the key and the fix -----------------------------------
def test_empty_recipe_file_says_it_is_empty(tmp_path):
    path = write(tmp_path, "empty.yaml", "\n\n")
    with pytest.raises(seqzoo.RecipeError, match=r"empty\.yaml:1: the recipe file is empty; a recipe needs at "
                                                 r"least a model: section"):
        resolve(path)


def test_a_dict_recipe_with_a_label_names_it_and_the_key():
    recipe = resolve("tiny-gpt").data
    recipe["model"]["attention"]["score"] = {"kind": "scaled_dt"}
    with pytest.raises(seqzoo.RecipeError, match=r"^my-gpt\.safetensors: recipe key model\.attention\.score\.kind: "
                                                 r"unknown score 'scaled_dt'; did you mean 'scaled_dot'\?$"):
        resolve(recipe, label="my-gpt.safetensors")


def test_a_checkpoint_given_as_a_recipe_is_recognised(tmp_path):
    ckpt = seqzoo.save(seqzoo.build("tiny-gpt", device="cpu"), tmp_path / "m.safetensors")
    with pytest.raises(seqzoo.RecipeError, match=r"m\.safetensors: is a checkpoint \(safetensors\), not a YAML "
                                                 r"recipe"):
        resolve(ckpt)


def test_every_mistake_is_reported_at_once_like_a_compiler(tmp_path, capsys):
    path = write(tmp_path, "bad.yaml", """
        seqzoo: 1
        extends: tiny-gpt
        model:
          dimm: 64
          layers: -1
          attention: {heads: 4, score: scaled_dt}
        train: {stepz: 3}
    """)
    with pytest.raises(seqzoo.RecipeError) as caught:
        resolve(path)
    assert str(caught.value).splitlines() == [
        f"{path}:4: model.dimm: unknown key 'dimm'; did you mean 'dim'?",
        f"{path}:5: model.layers: -1 is out of range: must be >= 1",
        f"{path}:6: model.attention.score: unknown score 'scaled_dt'; did you mean 'scaled_dot'?",
        f"{path}:7: train.stepz: unknown key 'stepz'; did you mean 'steps'?"]
    from seqzoo.cli import main

    assert main(["show", str(path)]) == 2
    assert len([line for line in capsys.readouterr().err.splitlines() if line.startswith("seqzoo: error: ")]) == 4


def test_at_most_ten_mistakes_are_listed(tmp_path):
    keys = "\n".join(f"  wrong{i}: 1" for i in range(13))
    path = write(tmp_path, "many.yaml", f"seqzoo: 1\nextends: tiny-gpt\nmodel:\n{keys}\n")
    with pytest.raises(seqzoo.RecipeError) as caught:
        resolve(path)
    lines = str(caught.value).splitlines()
    assert len(lines) == 11 and lines[-1] == "... and 3 more error(s)"


def test_a_component_that_refuses_its_parameters_is_located_where_its_spec_was_written(tmp_path):
    """A constructor's ConfigError (valid keys, impossible together) points at the component's own
    line, also inside layer_types, not at ``model:``."""
    recipe = TINY + "  mixer:\n    kind: mamba2\n    state: 16\n    head_dim: 48\n"
    with pytest.raises(seqzoo.RecipeError, match=r"r\.yaml:11: model\.mixer: mamba2: the inner width 64 must "
                                                 r"split into heads of head_dim=48"):
        seqzoo.build(str(write(tmp_path, "r.yaml", recipe)), device="meta")
    hybrid = TINY + ("  layer_types:\n    ssm:\n      mixer: {kind: mamba2, state: 16, head_dim: 48}\n"
                     "    attention: {}\n  pattern: [ssm, attention]\n")
    with pytest.raises(seqzoo.RecipeError, match=r"r\.yaml:13: model\.layer_types\.ssm\.mixer: mamba2:"):
        seqzoo.build(str(write(tmp_path, "r.yaml", hybrid)), device="meta")
    # a router told to pick more experts than its block has: the router's line in the moe block
    with pytest.raises(seqzoo.RecipeError, match=r"tiny-moe\.yaml:\d+: model\.ffn\.router: router: top_k=9 must "
                                                 r"be at most experts=4"):
        seqzoo.build("tiny-moe", ["model.ffn.top_k=9"], device="meta")


def test_a_device_torch_does_not_know_is_refused_when_the_recipe_is_read():
    with pytest.raises(seqzoo.RecipeError, match=r"^--set\[1\]:1: runtime\.device: unknown device 'tpu'; use "
                                                 r"auto, cpu, cuda, cuda:N or meta$"):
        resolve("tiny-gpt", ["runtime.device=tpu"])
    assert resolve("tiny-gpt", ["runtime.device=cuda:1"]).data["runtime"]["device"] == "cuda:1"  # there or not
