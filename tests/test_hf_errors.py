"""Every way a Hugging Face import or export can go wrong ends in one clear seqzoo error: bad
folders, pickles, unsupported families and config values, and weights that do not match their
config (named tensor by tensor — never a partial load)."""
from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

import seqzoo
from seqzoo.io.hf import HFConverter, copy

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


@pytest.fixture
def gpt2_folder(tmp_path):
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "hf")
    return tmp_path / "hf"


def edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def edit_tensors(folder, change):
    path = folder / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_unsupported_model_type_lists_the_supported_ones(gpt2_folder):
    edit_config(gpt2_folder, model_type="gptj")
    families = sorted(c.name for c in seqzoo.registry().list("converter"))
    assert {"gpt2", "llama", "mixtral", "deepseek_v3", "jamba", "mamba", "bert", "t5"} <= set(families)
    with pytest.raises(seqzoo.CheckpointError,
                       match=re.escape(f"model_type 'gptj' is not supported; supported: {', '.join(families)} (")):
        seqzoo.from_hf(gpt2_folder)


def test_config_without_model_type_is_an_error(gpt2_folder):
    config = json.loads((gpt2_folder / "config.json").read_text())
    del config["model_type"]
    (gpt2_folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(seqzoo.CheckpointError, match=r"config\.json: no model_type; supported: bamba, bert"):
        seqzoo.from_hf(gpt2_folder)


@pytest.mark.parametrize("setup, message", [
    (lambda d: d / "nowhere", r"nowhere: no such folder"),
    (lambda d: (d / "file.txt").write_text("x") and d / "file.txt", r"file\.txt: not a folder"),
    (lambda d: d, r"no config\.json"),
])
def test_bad_folder_is_a_clear_error(tmp_path, setup, message):
    with pytest.raises(seqzoo.CheckpointError, match=message):
        seqzoo.from_hf(setup(tmp_path))


def test_config_that_is_not_json_is_an_error(gpt2_folder):
    (gpt2_folder / "config.json").write_text("{not json")
    with pytest.raises(seqzoo.CheckpointError, match=r"config\.json: not valid JSON"):
        seqzoo.from_hf(gpt2_folder)


def test_pickle_only_folder_is_refused(gpt2_folder):
    (gpt2_folder / "model.safetensors").unlink()
    (gpt2_folder / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(seqzoo.CheckpointError,
                       match=r"has only pytorch_model\.bin \(pickle\); seqzoo reads safetensors only"):
        seqzoo.from_hf(gpt2_folder)


def test_folder_without_weights_is_an_error(gpt2_folder):
    (gpt2_folder / "model.safetensors").unlink()
    with pytest.raises(seqzoo.CheckpointError, match=r"no model\.safetensors or model\.safetensors\.index\.json"):
        seqzoo.from_hf(gpt2_folder)


def test_missing_shard_is_named(tmp_path):
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path, max_shard_size="10KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    message = rf"shard {shard.name} listed in model\.safetensors\.index\.json is missing"
    with pytest.raises(seqzoo.CheckpointError, match=message):
        seqzoo.from_hf(tmp_path)


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop("transformer.h.1.mlp.c_fc.weight"), r"missing tensors: transformer\.h\.1\.mlp\.c_fc\.weight"),
    (lambda t: t.update({"transformer.h.0.extra.weight": torch.zeros(2)}),
     r"unexpected tensors: transformer\.h\.0\.extra\.weight"),
    (lambda t: t.update({"transformer.wpe.weight": torch.zeros(16, 16)}),
     r"wrong shapes \(stored != config\): transformer\.wpe\.weight \(16, 16\) != \(32, 16\)"),
    (lambda t: t.update({"lm_head.weight": torch.zeros(64, 16)}),
     r"lm_head\.weight differs from transformer\.wte\.weight, but the config ties them"),
])
def test_weights_that_do_not_match_the_config_are_named(gpt2_folder, change, message):
    edit_tensors(gpt2_folder, change)
    with pytest.raises(seqzoo.CheckpointError, match=r"weights do not match its gpt2 config: .*" + message):
        seqzoo.from_hf(gpt2_folder)


def test_all_problems_are_reported_at_once(gpt2_folder):
    edit_tensors(gpt2_folder, lambda t: (t.pop("transformer.ln_f.weight"), t.update(stray=torch.zeros(1))))
    with pytest.raises(seqzoo.CheckpointError,
                       match=r"missing tensors: transformer\.ln_f\.weight; unexpected tensors: stray"):
        seqzoo.from_hf(gpt2_folder)


def test_old_buffers_in_a_checkpoint_are_ignored(gpt2_folder):
    edit_tensors(gpt2_folder, lambda t: t.update({"transformer.h.0.attn.bias": torch.ones(1, 1, 32, 32)}))
    assert seqzoo.from_hf(gpt2_folder).recipe["model"]["kind"] == "decoder_lm"


@pytest.mark.parametrize("model_type, changes, message", [
    ("llama", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
     r"rope_type 'longrope' is not supported; supported: default, linear, dynamic, yarn, llama3"),
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     r"partial_rotary_factor 0\.5 is not supported"),
    ("llama", {"rope_parameters": {"full_attention": {"rope_type": "default"}}},
     r"rope_parameters per layer type are not supported"),
    ("llama", {"hidden_act": "mish"}, r"activation 'mish' has no seqzoo equivalent"),
    ("qwen2", {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 4},
     r"qwen2 mixes full and sliding-window layers"),
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True},
     r"gpt2 scale_attn_by_inverse_layer_idx: true is not supported"),
    ("bert", {"position_embedding_type": "relative_key"},
     r"position_embedding_type 'relative_key' is not supported"),
    ("bert", {"is_decoder": True}, r"bert is_decoder: true is not supported"),
    ("bloom", {"apply_residual_connection_post_layernorm": True},
     r"apply_residual_connection_post_layernorm: true is not supported"),
])
def test_unsupported_config_values_are_named(gpt2_folder, model_type, changes, message):
    edit_config(gpt2_folder, model_type=model_type, **changes)
    with pytest.raises(seqzoo.CheckpointError, match=message):
        seqzoo.from_hf(gpt2_folder)


# -- export --------------------------------------------------------------------------------------
def test_export_of_a_model_no_family_fits_explains_each_family(tmp_path):
    model = seqzoo.build("tiny-transformer", device="cpu")
    with pytest.raises(seqzoo.CheckpointError,
                       match=r"no Hugging Face converter can export this encoder_decoder model \(bamba: "
                             r"model\.kind is encoder_decoder, needs decoder_lm; bert: model\.kind is "
                             r"encoder_decoder, needs encoder; .*t5: model\.position must be t5"):
        seqzoo.to_hf(model, tmp_path / "out")


def test_export_as_a_family_that_does_not_fit_says_why(tmp_path):
    model = seqzoo.build("tiny-gpt", device="cpu")
    with pytest.raises(seqzoo.CheckpointError,
                       match=r"cannot export as llama: model\.position is learned, needs rope"):
        seqzoo.to_hf(model, tmp_path / "out", model_type="llama")


def test_export_as_an_unknown_family_lists_the_supported_ones(tmp_path):
    model = seqzoo.build("tiny-gpt", device="cpu")
    with pytest.raises(seqzoo.CheckpointError, match=r"model_type 'gptj' is not supported; supported: bamba, bert"):
        seqzoo.to_hf(model, tmp_path / "out", model_type="gptj")


def test_export_of_a_recipe_built_model_picks_its_family(tmp_path):
    model = seqzoo.build("tiny-gpt", device="cpu")
    out = seqzoo.to_hf(model, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["architectures"] == ["GPT2LMHeadModel"]
    hf = transformers.GPT2LMHeadModel.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(259, (1, 10))
    with torch.no_grad():
        assert (hf(ids).logits - model.eval()(ids)).abs().max() < 1e-4


def test_export_when_several_families_fit_asks_for_one(tmp_path, monkeypatch):
    monkeypatch.setattr(seqzoo.io.hf.convert, "supported", lambda: ["gpt2", "gpt2"])
    with pytest.raises(seqzoo.CheckpointError,
                       match=r"several Hugging Face families fit this model \(gpt2, gpt2\)"):
        seqzoo.to_hf(seqzoo.build("tiny-gpt", device="cpu"), tmp_path / "out")


def test_export_onto_a_file_is_an_error(tmp_path):
    (tmp_path / "taken").write_text("x")
    with pytest.raises(seqzoo.CheckpointError, match=r"taken: exists and is not a folder"):
        seqzoo.to_hf(seqzoo.build("tiny-gpt", device="cpu"), tmp_path / "taken")


def test_export_into_a_sharded_folder_is_an_error(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(seqzoo.CheckpointError, match=r"already holds a sharded checkpoint"):
        seqzoo.to_hf(seqzoo.build("tiny-gpt", device="cpu"), tmp_path)


def test_export_of_a_module_without_recipe_is_an_error(tmp_path):
    with pytest.raises(seqzoo.SeqzooError, match=r"model has no \.recipe"):
        seqzoo.to_hf(torch.nn.Linear(2, 2), tmp_path)


def test_converter_whose_rules_miss_a_tensor_is_reported(tmp_path):
    class Broken(HFConverter):
        model_type = "broken"

        def hf_config(self, model):
            return {}

        def rules(self, config, recipe):
            return [copy("embed.weight", "wte")]

    with pytest.raises(seqzoo.CheckpointError,
                       match=r"converter 'broken' does not match the model it built: no rule fills "
                             r"decoder\.blocks\.0\.ffn\.down\.bias, .* and 46 more"):
        Broken().to_hf(seqzoo.build("tiny-gpt", device="cpu"))


# -- command line ---------------------------------------------------------------------------------
def cli(*argv: str) -> int:
    from seqzoo.cli import main

    return main(list(argv))


def test_cli_import_and_export_round_trip(gpt2_folder, tmp_path, capsys):
    assert cli("import-hf", str(gpt2_folder), "-o", str(tmp_path / "m.safetensors"),
               "--recipe", str(tmp_path / "m.yaml")) == 0
    assert "imported gpt2 as decoder_lm with" in capsys.readouterr().out
    assert seqzoo.build(str(tmp_path / "m.yaml")).recipe == seqzoo.load(tmp_path / "m.safetensors").recipe
    assert cli("export-hf", str(tmp_path / "m.safetensors"), str(tmp_path / "out")) == 0
    assert "as gpt2 ->" in capsys.readouterr().out
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_cli_import_of_a_bad_folder_exits_2_with_one_line(tmp_path, capsys):
    assert cli("import-hf", str(tmp_path), "-o", str(tmp_path / "m.safetensors")) == 2
    err = capsys.readouterr().err
    assert "no config.json" in err and err.count("\n") == 1


@pytest.mark.parametrize("write, message", [
    (lambda d: (d / "config.json").write_text("[1, 2]"), r"config\.json: expected a JSON object, got list"),
    (lambda d: ((d / "model.safetensors").write_bytes(b"garbage"),),
     r"model\.safetensors: not a readable safetensors file"),
    (lambda d: ((d / "model.safetensors").unlink(), (d / "model.safetensors.index.json").write_text("{}")),
     r"model\.safetensors\.index\.json: not a safetensors index \(KeyError"),
    (lambda d: (d / "tokenizer.json").write_text("{bad"), r"hf/tokenizer\.json: not a valid tokenizer\.json \("),
])
def test_unreadable_files_are_named(gpt2_folder, write, message):
    write(gpt2_folder)
    with pytest.raises(seqzoo.CheckpointError, match=message):
        seqzoo.from_hf(gpt2_folder)


def test_a_stored_tokenizer_that_does_not_parse_is_named_by_its_checkpoint(gpt2_folder, tmp_path, capsys):
    # a checkpoint imported before tokenizer.json was checked on import
    model = seqzoo.from_hf(gpt2_folder)
    model.tokenizer_state = "{bad"
    seqzoo.save(model, tmp_path / "m.safetensors")
    assert cli("generate", str(tmp_path / "m.safetensors"), "--prompt", "ab") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"seqzoo: error: {tmp_path / 'm.safetensors'}: hf tokenizer: not a valid tokenizer.json (")
    assert err.count("\n") == 1


def test_index_that_lists_a_tensor_in_the_wrong_shard_is_an_error(gpt2_folder):
    (gpt2_folder / "model.safetensors").rename(gpt2_folder / "part-1.safetensors")
    index = {"weight_map": {"transformer.wte.weight": "part-1.safetensors", "ghost.weight": "part-1.safetensors"}}
    (gpt2_folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(seqzoo.CheckpointError, match=r"tensors listed but not in their shard: ghost\.weight"):
        seqzoo.from_hf(gpt2_folder)


def test_a_model_without_attention_settings_is_weighed_by_every_exporter(tmp_path):
    """A stack with no attention section (every layer a recurrent mixer) is refused or taken by
    each family's exporter in words, never with an AttributeError from one that reads attention."""
    from seqzoo.io.hf.convert import converter_for, supported

    for recipe in ("tiny-rwkv7", "tiny-xlstm", "tiny-mamba", "tiny-gla", "tiny-gru-mixer"):
        model = seqzoo.build(recipe, ["model.attention=null"], device="meta")
        reasons = {name: converter_for(name).accepts(model.recipe) for name in supported()}
        assert reasons["bamba"] == "model.attention is null; Bamba's attention layers need its settings"
        assert reasons["gemma2"] == "model.attention is null; Gemma's attention layers need its settings"
        assert all(reason is None or isinstance(reason, str) for reason in reasons.values())
