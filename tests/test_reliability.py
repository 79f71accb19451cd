"""Bad input never crashes or hangs; checkpoints never corrupt; numerics hold at the edges."""
from __future__ import annotations

import json
import re
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seqzoo
from seqzoo.cli import main
from seqzoo.recipe import resolve

LOCATED = re.compile(r"^[^\n]+:\d+: \S")  # file:line: what — one line
BASE = yaml.safe_dump(resolve("tiny-gpt").data, sort_keys=False)
BASE_DATA = yaml.safe_load(BASE)


def key_paths(data, prefix=()):
    for key, value in data.items():
        yield (*prefix, key)
        if isinstance(value, dict):
            yield from key_paths(value, (*prefix, key))


PATHS = [p for p in key_paths(BASE_DATA) if p[0] != "train"]
NASTY = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 0.0, -1.0, 1e308, 2 ** 63]),
    st.text(max_size=20), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.sampled_from(["scaled_dt", "rope", "layernorm", {"kind": "rope", "base": -1}, {"kind": 3},
                     {"kind": "alibi", "nope": 1}, [[[[[]]]]]]),
)


def outcome(path: Path) -> str:
    """Resolve and build on meta; anything but a model or a located RecipeError fails the test."""
    start = time.perf_counter()
    try:
        seqzoo.build(str(path), device="meta")
        result = "model"
    except seqzoo.RecipeError as error:
        # one located line per mistake (several mistakes are reported together, at most ten)
        lines = str(error).splitlines()
        assert lines and all(LOCATED.match(line) for line in lines[:10]) and len(lines) <= 11, str(error)
        result = "rejected"
    except seqzoo.SeqzooError as error:  # e.g. the model would not fit; still one line
        assert "\n" not in str(error)
        result = "refused"
    assert time.perf_counter() - start < 2.0  # the issue asks for 1 s; 2 leaves room on a loaded CI
    return result


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), value=NASTY)
def test_mutated_values_give_a_model_or_a_located_error(tmp_path, path, value):
    data = json.loads(json.dumps(BASE_DATA))
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(data, allow_unicode=True))
    outcome(recipe)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), key=st.one_of(st.text(min_size=1, max_size=8), st.integers()),
       drop=st.booleans())
def test_unknown_and_missing_keys_give_a_located_error(tmp_path, path, key, drop):
    data = json.loads(json.dumps(BASE_DATA))
    node = data
    for part in path[:-1]:
        node = node[part]
    if drop:
        node.pop(path[-1])
    elif isinstance(node.get(path[-1]), dict):
        node[path[-1]][key] = 1
    else:
        node[key] = 1
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(data))
    outcome(recipe)


TEXT_MUTATIONS = {
    "tab indentation": lambda t: t.replace("  ", "\t", 3),
    "byte order mark": lambda t: "\ufeff" + t,
    "duplicate key": lambda t: t.replace("  layers: 4\n", "  layers: 4\n  layers: 5\n"),
    "non-string key": lambda t: t + "1: one\n",
    "alias bomb": lambda t: t + textwrap.dedent("""\
        bomb:
          a: &a [x, x, x, x, x, x, x, x, x]
          b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
          c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
          d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
          e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
          f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
          g: [*f, *f, *f, *f, *f, *f, *f, *f, *f]
        """),
    "deep nesting": lambda t: t + "deep: " + "[" * 500 + "]" * 500 + "\n",
    "python tag": lambda t: t + "evil: !!python/object/apply:os.system [echo hi]\n",
    "not a mapping": lambda t: "- just\n- a list\n",
    "empty file": lambda t: "",
    "huge integer": lambda t: t.replace("layers: 4", "layers: " + "9" * 400),
    "unterminated": lambda t: t + "x: [1, 2\n",
    "extends missing": lambda t: "extends: nowhere.yaml\n" + t,
}


@pytest.mark.parametrize("name", TEXT_MUTATIONS)
def test_text_level_damage_gives_a_located_error(tmp_path, name):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TEXT_MUTATIONS[name](BASE), encoding="utf-8")
    result = outcome(recipe)
    assert result == ("model" if name == "byte order mark" else "rejected")


def test_invalid_utf8_and_extends_cycles(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(BASE.encode() + b"\nname: \xc3\x28\n")
    assert outcome(bad) == "rejected"
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    assert outcome(tmp_path / "a.yaml") == "rejected"


def test_oversized_recipe_is_refused_before_parsing(tmp_path):
    recipe = tmp_path / "big.yaml"
    recipe.write_text(BASE + "# " + "x" * (1 << 20) + "\n")
    with pytest.raises(seqzoo.RecipeError, match=r"big\.yaml:1: recipe is .* bytes, over the"):
        resolve(recipe)


def test_cli_prints_one_line_and_exits_2_for_a_damaged_recipe(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    for name, mutate in TEXT_MUTATIONS.items():
        if name == "byte order mark":
            continue
        recipe.write_text(mutate(BASE))
        assert main(["build", str(recipe)]) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("seqzoo: error: "), (name, err)


def test_model_too_large_for_memory_is_refused_before_allocating(capsys):
    assert main(["build", "tiny-gpt", "--set", "model.vocab_size=16777216", "--set", "model.dim=65536"]) == 2
    assert "GiB is free" in capsys.readouterr().err
    assert seqzoo.build("tiny-gpt", ["model.vocab_size=16777216", "model.dim=65536"], device="meta")


# -- checkpoints -------------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path, tiny_gpt) -> Path:
    path = tmp_path / "m.safetensors"
    seqzoo.save(tiny_gpt, path)
    return path


def rewrite(path: Path, edit) -> None:
    raw = path.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + length])
    header = edit(header)
    data = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(data)) + data + raw[8 + length:])


@pytest.mark.parametrize("cut", [0, 4, 8, 100, -1000, -1])
def test_truncated_checkpoint_is_a_clear_error(saved, cut):
    raw = saved.read_bytes()
    saved.write_bytes(raw[:cut] if cut >= 0 else raw[:len(raw) + cut])
    with pytest.raises(seqzoo.CheckpointError, match=r"m\.safetensors: (not a readable safetensors file|weights)"):
        seqzoo.load(saved)


def test_header_claiming_gigabytes_is_rejected_without_allocating(saved):
    saved.write_bytes(struct.pack("<Q", 50 << 30) + b"{}")
    start = time.perf_counter()
    with pytest.raises(seqzoo.CheckpointError, match="not a readable safetensors file"):
        seqzoo.load(saved)
    assert time.perf_counter() - start < 1.0


def test_wrong_dtype_is_reported_by_name(saved):
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(saved), "pt") as handle:
        meta, tensors = handle.metadata(), {k: handle.get_tensor(k) for k in handle.keys()}
    tensors["embed.weight"] = tensors["embed.weight"].half()
    save_file(tensors, str(saved), metadata=meta)
    with pytest.raises(seqzoo.CheckpointError, match=r"wrong dtypes \(stored != recipe\): embed\.weight float16 != "
                                                     r"float32"):
        seqzoo.load(saved)


def test_recipe_that_disagrees_with_the_weights(saved):
    def edit(header):
        recipe = json.loads(header["__metadata__"]["seqzoo.recipe"])
        recipe["model"]["dim"] = 32
        header["__metadata__"]["seqzoo.recipe"] = json.dumps(recipe)
        return header

    rewrite(saved, edit)
    with pytest.raises(seqzoo.CheckpointError, match=r"wrong shapes \(stored != recipe\): .*\(64,\) != \(32,\)"):
        seqzoo.load(saved)


@pytest.mark.parametrize("metadata, message", [
    ({"seqzoo.recipe": "{not json"}, "corrupt seqzoo metadata"),
    # The error names the checkpoint and the recipe key, not a line of a file that does not exist.
    ({"seqzoo.recipe": json.dumps({"model": {"kind": "nope"}})},
     r"\.safetensors: recipe key model\.kind: unknown model 'nope'"),
])
def test_bad_recipe_metadata(saved, metadata, message):
    def edit(header):
        header["__metadata__"].update(metadata)
        return header

    rewrite(saved, edit)
    with pytest.raises(seqzoo.CheckpointError, match=message):
        seqzoo.load(saved)


def test_path_through_a_file_is_a_clear_error(saved):
    with pytest.raises(seqzoo.CheckpointError, match="no such checkpoint file"):
        seqzoo.load(saved / "inside")


def test_saving_onto_a_directory_is_a_clear_error(tmp_path, tiny_gpt):
    with pytest.raises(seqzoo.CheckpointError, match="is a directory; give a file name"):
        seqzoo.save(tiny_gpt, tmp_path)


def test_cli_exits_2_on_a_damaged_checkpoint(saved, capsys):
    saved.write_bytes(b"garbage")
    assert main(["generate", str(saved), "--prompt", "x"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


KILL_SAVER = """
import sys, torch, seqzoo
path = sys.argv[1]
models = [seqzoo.build("tiny-gpt", ["model.layers=8", "model.dim=128"], device="cpu") for _ in range(2)]
with torch.no_grad():
    for i, model in enumerate(models):
        for p in model.parameters():
            p.fill_(float(i))
seqzoo.save(models[0], path)
print("ready", flush=True)
i = 0
while True:
    i += 1
    seqzoo.save(models[i % 2], path)
"""


def test_sigkill_during_save_leaves_the_old_or_the_new_file(tmp_path):
    """Kill a process that saves in a loop at many moments: the file always loads, whole."""
    path = tmp_path / "m.safetensors"
    survived = 0
    for attempt in range(12):
        proc = subprocess.Popen([sys.executable, "-c", KILL_SAVER, str(path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.05 + 0.037 * attempt)  # a different point in the save loop each time
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        model = seqzoo.load(path)
        values = {p.flatten()[0].item() for p in model.parameters()}
        assert values in ({0.0}, {1.0})  # one whole model, never a mix
        survived += 1
    assert survived == 12


def test_sigint_during_training_writes_a_resumable_checkpoint_and_exits_130(tmp_path):
    ckpt = tmp_path / "m.safetensors"
    proc = subprocess.Popen([sys.executable, "-m", "seqzoo", "train", "tiny-gpt", "-o", str(ckpt),
                             "--set", "train.steps=100000", "--set", "train.eval_examples=4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    time.sleep(8)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-500:]
    assert "interrupted after step" in err and "--resume" in err
    from seqzoo.io.checkpoint import read_extras

    meta, extras = read_extras(ckpt)
    step = json.loads(meta["seqzoo.train"])["step"]
    assert step > 0 and any(name.startswith("optim.") for name in extras)


# -- numerics -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("position", ["alibi", "t5", "rope"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_stays_finite_at_8k_positions(position, dtype):
    model = seqzoo.build("tiny-gpt", [f"model.position={position}", "model.max_seq_len=8192",
                                      "model.layers=2"], device="cpu").eval()
    ids = torch.randint(0, 256, (1, 48))
    positions = torch.arange(8192 - 48, 8192)[None]
    with torch.no_grad():
        reference = model(ids, positions=positions)
        half = model.to(dtype)(ids, positions=positions)
    assert torch.isfinite(half).all()
    assert (half.float() - reference).abs().max() < 0.05 * reference.abs().max() + 0.05


def test_same_seed_trains_to_the_same_losses():
    from seqzoo.config import TrainConfig
    from seqzoo.train.training import train

    config = TrainConfig(task={"kind": "copy"}, steps=15, batch_size=8, eval_examples=4, log_every=1,
                         warmup=2)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = seqzoo.build("tiny-gpt", ["model.dropout=0.1"], device="cpu")
        runs.append([entry["loss"] for entry in train(model, config, seqzoo.tokenizer(model), quiet=True).history])
    assert runs[0] == runs[1]
