"""The seqzoo command line, run as a user would from a fresh shell."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import seqzoo
from seqzoo.cli import main


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "seqzoo", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_build_then_generate_from_a_fresh_shell(tmp_path):
    built = run("build", "tiny-gpt", "-o", "m.safetensors", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    assert "233,024 parameters" in built.stdout
    out = run("generate", "m.safetensors", "--prompt", "hello", "--max-new-tokens", "5", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("hello")


def test_bad_score_name_exits_2_with_one_line(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(textwrap.dedent("""\
        seqzoo: 1
        extends: tiny-gpt
        model:
          attention:
            heads: 4
            score: scaled_dt
    """))
    out = run("build", str(recipe), cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].endswith("bad.yaml:6: model.attention.score: unknown score 'scaled_dt'; did you mean 'scaled_dot'?")
    assert "Traceback" not in out.stderr


def test_a_task_that_refuses_its_settings_is_located_in_the_recipe_before_training(tmp_path, capsys):
    """The task's own rules (min_len <= max_len; its symbols inside the vocabulary) are found when
    training starts, and named by file, line and key like any recipe error; nothing is written."""
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("extends: tiny-gpt\ntrain:\n  steps: 2\n  task:\n    kind: copy\n    min_len: 9\n"
                      "    max_len: 3\n")
    assert main(["train", str(recipe), "-o", str(tmp_path / "m.safetensors"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("bad.yaml:4: train.task: task copy: min_len=9 is larger than max_len=3") and "\n" not in err
    recipe.write_text("extends: tiny-gpt\ntrain:\n  steps: 2\n  task: {kind: copying, alphabet: 500}\n")
    assert main(["train", str(recipe), "-o", str(tmp_path / "m.safetensors"), "--quiet"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "bad.yaml:2: train: task copying: symbols use ids 3..502, beyond the model's vocab_size=259; lower "
        "alphabet or first")
    assert not list(tmp_path.glob("m.*"))


@pytest.mark.parametrize("args, message", [
    (["generate", "m.safetensors", "--prompt", "x", "--max-new-tokens", "abc"],
     "seqzoo generate: error: argument --max-new-tokens: invalid int value: 'abc' (see seqzoo generate --help)"),
    (["data", "prepare"], "seqzoo data prepare: error: the following arguments are required: SRC, -o/--output "
                          "(see seqzoo data prepare --help)"),
])
def test_a_command_line_argparse_refuses_is_one_line_too(args, message):
    out = run(*args)
    assert out.returncode == 2 and out.stderr == message + "\n"


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(seqzoo.RecipeError):
        main(["--debug", "build", "tiny-gpt", "--set", "model.layers=zero"])


@pytest.mark.parametrize("args, message", [
    (["generate", "missing.safetensors", "--prompt", "x"], "missing.safetensors: no such checkpoint file"),
    (["build", "tiny-gpt", "--set", "model.layers=0"], "model.layers: 0 is out of range: must be >= 1"),
    (["list", "scor"], "unknown component kind 'scor'; did you mean 'score'?"),
])
def test_bad_input_exits_2_with_a_clear_line(capsys, args, message):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_list_shows_every_component_with_summary_and_origin(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for component in seqzoo.registry().list():
        assert any(line.split()[:2] == [component.kind, component.name] and component.summary in line
                   for line in out.splitlines())
    assert "[seqzoo 0.1.0]" in out


def test_list_kind_filters(capsys):
    assert main(["list", "norm"]) == 0
    assert {line.split()[0] for line in capsys.readouterr().out.splitlines()} == {"norm"}


def test_show_prints_resolved_recipe_and_parameter_count_without_allocating(capsys):
    assert main(["show", "gpt2"]) == 0
    out = capsys.readouterr().out
    assert "parameters: 124,439,808" in out
    assert "kind: decoder_lm" in out and "DecoderLM(" in out


def test_generate_with_ids_bypasses_the_tokenizer(tmp_path, capsys):
    assert main(["build", "tiny-gpt", "-o", str(tmp_path / "m.safetensors")]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "m.safetensors"), "--ids", "1,2,3", "--max-new-tokens", "4"]) == 0
    ids = capsys.readouterr().out.strip().split(",")
    assert ids[:3] == ["1", "2", "3"] and len(ids) == 7


def test_generate_rejects_ids_outside_the_vocabulary(tmp_path, capsys):
    assert main(["build", "tiny-gpt", "-o", str(tmp_path / "m.safetensors")]) == 0
    assert main(["generate", str(tmp_path / "m.safetensors"), "--ids", "1,999"]) == 2
    assert "outside the vocabulary [0, 259)" in capsys.readouterr().err


def test_generate_compile_on_a_seq2seq_model_is_one_clear_line(tmp_path, capsys):
    assert main(["build", "tiny-t5", "-o", str(tmp_path / "t5.safetensors")]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "t5.safetensors"), "--ids", "1,2", "--compile"]) == 2
    err = capsys.readouterr().err.strip()
    assert "compile=True needs a decoder-only model" in err and "\n" not in err


def test_show_llama2_7b_by_path_counts_without_allocating(capsys):
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "llama2-7b.yaml"
    assert main(["show", str(recipe)]) == 0
    assert "parameters: 6,738,415,616" in capsys.readouterr().out


def test_help_starts_without_importing_torch():
    """`seqzoo --help` builds every subcommand's arguments without loading torch or the registry."""
    code = ("import sys\nfrom seqzoo.cli.commands import _parser\n_parser()\n"
            "print(sorted(m for m in ('torch', 'seqzoo.registry', 'seqzoo.interfaces') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_ctrl_c_while_starting_up_is_one_line(monkeypatch, capsys):
    import seqzoo.cli.commands as commands

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "_parser", interrupted)
    assert main(["--help"]) == 130
    assert capsys.readouterr().err == "seqzoo: interrupted\n"


def test_show_gives_a_mixtures_active_parameters_and_writes_specs_as_yaml(capsys):
    """tiny-moe: 2 layers of 4 SwiGLU experts (3·64·64 = 12,288 weights each), top-2: a token skips
    two experts per layer, 49,152 of the 156,864 parameters."""
    assert main(["show", "tiny-moe"]) == 0
    assert "parameters: 156,864 (107,712 active per token)" in capsys.readouterr().out
    assert main(["show", "tiny-moe", "--set", "model.layer_types={dense: {ffn: {kind: swiglu, hidden: 128}}, "
                 "moe: {ffn: {kind: moe, experts: 4, expert: {kind: swiglu, hidden: 32}}}}",
                 "--set", "model.pattern=[dense, moe]"]) == 0
    out = capsys.readouterr().out
    assert "1 moe (ffn moe, experts 4, expert {kind: swiglu, hidden: 32})" in out
    assert main(["show", "tiny-gpt"]) == 0
    assert "parameters: 233,024\n" in capsys.readouterr().out  # a dense model: no active count
