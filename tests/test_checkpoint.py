"""safetensors checkpoints: bit-identical round trip, tied weights once, atomic writes, errors."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open

import seqzoo


def test_save_load_gives_bit_identical_logits(tmp_path, tiny_gpt):
    path = tmp_path / "m.safetensors"
    seqzoo.save(tiny_gpt, path)
    loaded = seqzoo.load(path, device="cpu")
    ids = torch.randint(0, 259, (2, 9))
    with torch.no_grad():
        assert torch.equal(tiny_gpt(ids), loaded(ids))
    assert loaded.recipe == tiny_gpt.recipe


def test_tied_weights_are_stored_once_and_stay_tied(tmp_path, tiny_gpt):
    path = tmp_path / "m.safetensors"
    seqzoo.save(tiny_gpt, path)
    with safe_open(str(path), "pt") as handle:
        names = set(handle.keys())
        meta = handle.metadata()
    assert "embed.weight" in names and "lm_head.weight" not in names
    assert json.loads(meta["seqzoo.tied"]) == {"lm_head.weight": "embed.weight"}
    loaded = seqzoo.load(path, device="cpu")
    assert loaded.lm_head.weight is loaded.embed.weight


def test_untied_model_round_trips(tmp_path):
    model = seqzoo.build("tiny-gpt", ["model.tie_embeddings=false", "model.position=rope"], device="cpu").eval()
    seqzoo.save(model, tmp_path / "m.safetensors")
    loaded = seqzoo.load(tmp_path / "m.safetensors", device="cpu")
    assert loaded.lm_head.weight is not loaded.embed.weight
    ids = torch.randint(0, 259, (1, 5))
    with torch.no_grad():
        assert torch.equal(model(ids), loaded(ids))


def test_metadata_holds_format_recipe_and_components(tmp_path, tiny_gpt):
    seqzoo.save(tiny_gpt, tmp_path / "m.safetensors")
    with safe_open(str(tmp_path / "m.safetensors"), "pt") as handle:
        meta = handle.metadata()
    assert meta["seqzoo.format"] == "1"
    assert json.loads(meta["seqzoo.recipe"]) == tiny_gpt.recipe
    components = json.loads(meta["seqzoo.components"])
    assert components["model.attention.score"]["name"] == "scaled_dot"
    assert components["model"]["plugin"] == "seqzoo.plugins.model.decoder_lm"


def test_a_format_this_seqzoo_does_not_know_is_refused_and_a_file_without_one_loads(tmp_path, tiny_gpt):
    from safetensors.torch import load_file, save_file

    seqzoo.save(tiny_gpt, tmp_path / "m.safetensors")
    with safe_open(str(tmp_path / "m.safetensors"), "pt") as handle:
        meta = handle.metadata()
    tensors = load_file(tmp_path / "m.safetensors")
    save_file(tensors, tmp_path / "new.safetensors", metadata={**meta, "seqzoo.format": "99"})
    with pytest.raises(seqzoo.CheckpointError, match=r"new\.safetensors: checkpoint format '99', but this "
                                                     r"seqzoo reads format '1'; upgrade seqzoo to load it"):
        seqzoo.load(tmp_path / "new.safetensors", device="cpu")
    save_file(tensors, tmp_path / "old.safetensors", metadata={k: v for k, v in meta.items() if k != "seqzoo.format"})
    assert torch.equal(seqzoo.load(tmp_path / "old.safetensors", device="cpu").embed.weight, tiny_gpt.embed.weight)


def test_save_records_the_actual_dtype(tmp_path, tiny_gpt):
    seqzoo.save(tiny_gpt.to(torch.float64), tmp_path / "m.safetensors")
    assert seqzoo.load(tmp_path / "m.safetensors", device="cpu").embed.weight.dtype == torch.float64


def test_save_replaces_atomically_and_leaves_no_temp_files(tmp_path, tiny_gpt):
    path = tmp_path / "m.safetensors"
    seqzoo.save(tiny_gpt, path)
    seqzoo.save(tiny_gpt, path)
    assert os.listdir(tmp_path) == ["m.safetensors"]


def test_failed_save_keeps_the_previous_file(tmp_path, tiny_gpt, monkeypatch):
    path = tmp_path / "m.safetensors"
    seqzoo.save(tiny_gpt, path)
    before = path.read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(seqzoo.io.tensorfile, "write", disk_full)
    with pytest.raises(seqzoo.CheckpointError, match="could not save \\(No space left on device\\); the previous "
                                                     "file is intact"):
        seqzoo.save(tiny_gpt, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.safetensors"]


def test_load_missing_file(tmp_path):
    with pytest.raises(seqzoo.CheckpointError, match=r"nope\.safetensors: no such checkpoint file"):
        seqzoo.load(tmp_path / "nope.safetensors")


def test_load_directory(tmp_path):
    with pytest.raises(seqzoo.CheckpointError, match="is a directory, not a checkpoint file"):
        seqzoo.load(tmp_path)


def test_load_garbage(tmp_path):
    path = tmp_path / "g.safetensors"
    path.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(seqzoo.CheckpointError, match="not a readable safetensors file"):
        seqzoo.load(path)


def test_load_foreign_safetensors_without_recipe(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "f.safetensors"))
    with pytest.raises(seqzoo.CheckpointError, match="without a seqzoo recipe"):
        seqzoo.load(tmp_path / "f.safetensors")


def test_load_reports_missing_unexpected_and_misshaped_tensors_by_name(tmp_path, tiny_gpt):
    from safetensors.torch import save_file

    path = tmp_path / "m.safetensors"
    seqzoo.save(tiny_gpt, path)
    with safe_open(str(path), "pt") as handle:
        meta = handle.metadata()
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}
    del tensors["decoder.final_norm.bias"]
    tensors["stray.weight"] = torch.zeros(1)
    tensors["decoder.final_norm.weight"] = torch.zeros(3)
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(seqzoo.CheckpointError) as info:
        seqzoo.load(path)
    message = str(info.value)
    assert "missing tensors: decoder.final_norm.bias" in message
    assert "unexpected tensors: stray.weight" in message
    assert "decoder.final_norm.weight (3,) != (64,)" in message


def test_save_meta_model_is_refused(tmp_path):
    model = seqzoo.build("tiny-gpt", device="meta")
    with pytest.raises(seqzoo.SeqzooError, match="device='meta'"):
        seqzoo.save(model, tmp_path / "m.safetensors")


def test_load_on_a_missing_cuda_says_plainly_that_cuda_is_not_available(tmp_path, monkeypatch):
    path = seqzoo.save(seqzoo.build("tiny-gpt", device="cpu"), tmp_path / "m.safetensors")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(seqzoo.SeqzooError, match=r"^device 'cuda': CUDA is not available on this machine \(.*\); "
                                                 r"use cpu, or auto, which takes CUDA only when it is there$"):
        seqzoo.load(path, device="cuda")


def test_a_broken_embedded_recipe_names_the_checkpoint_and_the_key(tmp_path):
    from safetensors.torch import load_file, save_file

    path = seqzoo.save(seqzoo.build("tiny-gpt", device="cpu"), tmp_path / "my-gpt.safetensors")
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    recipe = json.loads(metadata["seqzoo.recipe"])
    recipe["model"]["attention"]["score"] = {"kind": "scaled_dt"}
    save_file(load_file(str(path)), str(path), metadata={**metadata, "seqzoo.recipe": json.dumps(recipe)})
    with pytest.raises(seqzoo.CheckpointError, match=r"my-gpt\.safetensors: recipe key model\.attention\.score\.kind: "
                                                     r"unknown score 'scaled_dt'"):
        seqzoo.load(path)
