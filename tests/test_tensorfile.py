"""Checkpoints are safetensors files written and read a tensor at a time, with an xxh3 checksum per
tensor: the files are the format's (safetensors reads them, and seqzoo reads safetensors' own), a
damaged byte is caught and named, and files without checksums still load."""
from __future__ import annotations

import json

import pytest
import torch
import xxhash
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import seqzoo
from seqzoo.cli import main
from seqzoo.io import tensorfile
from seqzoo.io.checkpoint import EXTRA_PREFIX, read_extras


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"f32": torch.randn(3, 5, generator=g), "bf16": torch.randn(4, 2, generator=g).bfloat16(),
            "f16": torch.randn(7, generator=g).half(), "i64": torch.arange(6).view(2, 3), "i8": torch.arange(-3, 3,
            dtype=torch.int8), "flag": torch.tensor([True, False, True]), "scalar": torch.tensor(2.5),
            "empty": torch.zeros(0, 4), "strided": torch.randn(4, 6, generator=g)[:, ::2]}


def test_a_written_file_is_read_by_safetensors_with_the_same_tensors_and_metadata(tmp_path):
    path = tmp_path / "t.safetensors"
    tensorfile.write(path, tensors(), {"who": "seqzoo"})
    loaded = load_file(str(path))
    for name, tensor in tensors().items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    assert metadata["who"] == "seqzoo"
    digests = json.loads(metadata[tensorfile.CHECKSUMS])
    raw = tensors()["f32"].numpy().tobytes()
    assert digests["f32"] == xxhash.xxh3_64_hexdigest(raw)  # the digest of the tensor's bytes as stored


def test_a_file_written_by_safetensors_is_read_in_place_and_cast(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file({k: v.contiguous() for k, v in tensors().items()}, str(path))
    reader = tensorfile.Reader(path)
    assert reader.checksums == {}
    targets = {name: torch.empty(reader.shape(name), dtype=reader.dtype(name)) for name in reader.names()}
    targets["f32"] = torch.empty(3, 5, dtype=torch.float64)  # another dtype: read, then cast
    reader.read_into(targets.items())
    for name, tensor in tensors().items():
        assert torch.equal(targets[name], tensor.to(targets[name].dtype)), name


def flip_a_byte(path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def data_start(path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


def test_a_damaged_byte_in_a_checkpoint_is_named_and_generate_exits_2(tmp_path, capsys):
    path = tmp_path / "m.safetensors"
    seqzoo.save(seqzoo.build("tiny-gpt"), path)
    reader = tensorfile.Reader(path)
    name = "decoder.blocks.1.mixer.qkv_proj.weight"
    begin, end = reader.header[name]["data_offsets"]
    flip_a_byte(path, data_start(path) + (begin + end) // 2)
    with pytest.raises(seqzoo.CheckpointError, match=rf"m\.safetensors: tensor {name}: its bytes differ from the "
                                                     r"checksum saved with it"):
        seqzoo.load(path)
    assert main(["generate", str(path), "--prompt", "hi", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and name in err[0] and err[0].startswith("seqzoo: error:")


def test_damaged_training_state_is_caught_too(tmp_path):
    path = tmp_path / "m.safetensors"
    seqzoo.save(seqzoo.build("tiny-gpt"), path, extra_tensors={"optim.x": torch.randn(10)})
    reader = tensorfile.Reader(path)
    begin, _ = reader.header[EXTRA_PREFIX + "optim.x"]["data_offsets"]
    assert torch.equal(read_extras(path)[1]["optim.x"], read_extras(path)[1]["optim.x"])
    flip_a_byte(path, data_start(path) + begin)
    with pytest.raises(seqzoo.CheckpointError, match=r"tensor extra/optim\.x: its bytes differ"):
        read_extras(path)


def test_a_header_that_claims_too_much_is_a_clear_error(tmp_path):
    path = tmp_path / "m.safetensors"
    seqzoo.save(seqzoo.build("tiny-gpt"), path)
    data = bytearray(path.read_bytes())
    data[:8] = (len(data) + 1).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(seqzoo.CheckpointError, match=r"not a readable safetensors file"):
        seqzoo.load(path)


def test_a_checkpoint_without_checksums_still_loads(tmp_path):
    """Older seqzoo and other tools write no checksums: such a file loads, unchecked."""
    model = seqzoo.build("tiny-gpt")
    path = tmp_path / "m.safetensors"
    seqzoo.save(model, path)
    with safe_open(str(path), framework="pt") as handle:
        metadata = {k: v for k, v in handle.metadata().items() if k != tensorfile.CHECKSUMS}
        stored = {name: handle.get_tensor(name) for name in handle.keys()}
    save_file(stored, str(path), metadata=metadata)
    loaded = seqzoo.load(path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_model_is_built_in_its_dtype_and_round_trips_exactly(tmp_path, dtype):
    model = seqzoo.build("tiny-llama", dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
    path = tmp_path / "m.safetensors"
    seqzoo.save(model, path)
    loaded = seqzoo.load(path)
    for name, tensor in model.state_dict().items():
        assert loaded.state_dict()[name].dtype == tensor.dtype and torch.equal(loaded.state_dict()[name], tensor)
