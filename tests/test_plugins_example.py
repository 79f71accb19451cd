"""The example plugin package, really installed: ``pip install --no-deps --target`` into a temp
folder that goes on ``PYTHONPATH`` of subprocesses, so ``importlib.metadata`` finds its entry point
exactly as it would in site-packages, and this test process's registry never sees it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "seqzoo-example-plugin"
DIST = "seqzoo-example-plugin 0.1.0"


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """The example package installed into a temp folder (built from a copy, so the source tree
    stays free of build artefacts)."""
    work = tmp_path_factory.mktemp("example")
    source = work / "src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                          "--no-build-isolation", "--disable-pip-version-check", "--target",
                          str(work / "site"), str(source)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    return work / "site"


def run(args: list[str], site: Path | None, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SEQZOO_")}
    environ.pop("PYTHONPATH", None)
    if site is not None:
        environ["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          env={**environ, **env}, timeout=180)


def test_example_components_are_listed_with_their_distribution(target, tmp_path):
    out = run(["-m", "seqzoo", "list"], target, tmp_path)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    lines = {tuple(line.split()[:2]): line for line in out.stdout.splitlines()}
    for key in [("score", "sigmoid"), ("position", "kerple"), ("cell", "mingru"), ("mixer", "causal_conv")]:
        assert lines[key].endswith(f"[{DIST}]"), lines[key]
    plugins = run(["-m", "seqzoo", "plugins"], target, tmp_path).stdout
    row = next(line for line in plugins.splitlines() if line.startswith("example "))
    assert row.split()[1:] == ["seqzoo-example-plugin", "0.1.0", "loaded", "seqzoo_components", "4",
                               "(cell", "1,", "mixer", "1,", "position", "1,", "score", "1)"]


@pytest.mark.parametrize("value", ["1", "example"])
def test_example_plugin_can_be_disabled(target, tmp_path, value):
    out = run(["-m", "seqzoo", "list", "score"], target, tmp_path, SEQZOO_DISABLE_PLUGINS=value)
    assert out.returncode == 0 and "sigmoid" not in out.stdout and "scaled_dot" in out.stdout


BUILD_SAVE_LOAD = textwrap.dedent("""
    import json, sys, torch, seqzoo
    from seqzoo.io.checkpoint import read_metadata

    recipe, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = seqzoo.build(recipe, device="cpu").eval()
    seqzoo.save(model, out)
    again = seqzoo.load(out)
    ids = torch.randint(0, 256, (2, 7))
    with torch.no_grad():
        same = torch.equal(model(ids), again(ids))
    print(json.dumps({"same": same, "components": json.loads(read_metadata(out)["seqzoo.components"])}))
""")


def test_example_recipe_builds_saves_and_loads_with_provenance(target, tmp_path):
    checkpoint = tmp_path / "sigmoid.safetensors"
    out = run(["-c", BUILD_SAVE_LOAD, str(EXAMPLE / "recipes" / "tiny-sigmoid.yaml"), str(checkpoint)],
              target, tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["same"]
    assert result["components"]["model.attention.score"] == {
        "kind": "score", "name": "sigmoid", "plugin": "example",
        "distribution": "seqzoo-example-plugin", "version": "0.1.0"}
    assert result["components"]["model.position"]["name"] == "kerple"
    assert result["components"]["model.norm"]["distribution"] == "seqzoo"

    # Without the plugin: one line, the missing distribution first, with the recipe's own
    # `requires:` range as the one install hint (no warning that says another version).
    gone = run(["-m", "seqzoo", "generate", str(checkpoint), "--ids", "1,2"], None, tmp_path)
    assert gone.returncode == 2
    assert gone.stderr.strip().splitlines() == [
        f"seqzoo: error: {checkpoint}: recipe key model.attention.score: score 'sigmoid' comes from "
        f"seqzoo-example-plugin 0.1.0, which is not installed here; pip install 'seqzoo-example-plugin>=0.1'"]


def test_example_cell_recipe_builds_saves_and_loads(target, tmp_path):
    out = run(["-c", BUILD_SAVE_LOAD, str(EXAMPLE / "recipes" / "tiny-mingru.yaml"), str(tmp_path / "m.safetensors")],
              target, tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["same"] and result["components"]["model.cell"]["name"] == "mingru"


def test_example_components_pass_the_kit(target, tmp_path):
    out = run(["-m", "seqzoo", "check", "--from", "seqzoo-example-plugin"], target, tmp_path)
    failed = [line for line in out.stdout.splitlines() if line.startswith("FAILED")]
    assert failed == []  # sigmoid attention declares normalization = "sigmoid": its softmax check skips
    assert out.returncode == 0
    for component in ("score/sigmoid", "position/kerple", "cell/mingru", "mixer/causal_conv"):
        assert f"PASSED  {component} shapes" in out.stdout
    assert "PASSED  cell/mingru step_matches_sequence" in out.stdout or "cell" not in out.stdout
    # the conv mixer decodes through its (B, k - 1, C) state, with left padding and reordered rows
    for check in ("decode_steps", "left_padding", "state_reorder"):
        assert f"PASSED  mixer/causal_conv {check}" in out.stdout


CONV_MIXER_GENERATION = textwrap.dedent("""
    import json, sys, torch, seqzoo

    torch.manual_seed(0)
    model = seqzoo.build(sys.argv[1], device="cpu").eval()
    mixers = [type(block.mixer).__name__ for block in model.decoder.blocks]
    ids = torch.randint(0, 256, (2, 5))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, :2] = 0  # the second prompt is left-padded
    cached = seqzoo.generate(model, ids, 8, eos_id=None)
    uncached = seqzoo.generate(model, ids, 8, eos_id=None, use_cache=False)
    padded = seqzoo.generate(model, ids, 8, eos_id=None, attention_mask=mask)
    padded_uncached = seqzoo.generate(model, ids, 8, eos_id=None, attention_mask=mask, use_cache=False)
    print(json.dumps({"mixers": mixers, "new": cached.shape[1] - ids.shape[1],
                      "same": torch.equal(cached, uncached), "padded_same": torch.equal(padded, padded_uncached)}))
""")


def test_example_conv_mixer_recipe_builds_and_generates_with_its_state(target, tmp_path):
    recipe = str(EXAMPLE / "recipes" / "tiny-conv-mixer.yaml")
    out = run(["-c", BUILD_SAVE_LOAD, recipe, str(tmp_path / "m.safetensors")], target, tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["same"]
    assert result["components"]["model.layer_types.conv.mixer"] == {
        "kind": "mixer", "name": "causal_conv", "plugin": "example",
        "distribution": "seqzoo-example-plugin", "version": "0.1.0"}

    out = run(["-c", CONV_MIXER_GENERATION, recipe], target, tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["mixers"] == ["CausalConv", "AttentionMixer"] * 2  # pattern [conv, attention]
    assert result["new"] == 8
    assert result["same"], "greedy generation through the conv state differs from the uncached forward"
    assert result["padded_same"], "with left padding, cached and uncached greedy generation differ"
