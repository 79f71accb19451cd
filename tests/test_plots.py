"""Pictures: `seqzoo plot`, `attention` and `positions` write readable PNGs, the numbers behind
them match docs/formulas.md (RoPE/YaRN wavelengths, ALiBi slopes, T5 buckets, sinusoids) and a
hand-computed attention map, and bad input is one line on stderr with exit 2."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

import seqzoo
from seqzoo.cli import main
from seqzoo.lab.plots import PlotError, attention_panels, load_metrics, metric_series, record_attention
from seqzoo.lab.positions import absolute_table, bias_by_distance, describe_position, rotary_wavelengths

pytest.importorskip("matplotlib")


def png_size(path) -> tuple[int, int]:
    """(height, width) of a PNG, read back by matplotlib."""
    from matplotlib.image import imread

    image = imread(str(path))
    assert image.ndim == 3 and image.std() > 0.01  # not a blank canvas
    return image.shape[0], image.shape[1]


def one_line_error(capsys, *fragments: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("seqzoo: error: ")
    for fragment in fragments:
        assert fragment in err, err
    return err


METRICS = {
    "history": [{"step": 10, "loss": 4.0, "lr": 1e-4, "tokens_per_s": 100.0},
                {"step": 20, "loss": 2.0, "lr": 2e-4, "tokens_per_s": 100.0,
                 "eval": {"loss": 2.5, "accuracy": 0.25, "examples": 8}},
                {"step": 30, "loss": 1.0, "lr": 1e-4, "tokens_per_s": 100.0}],
    "eval": {"loss": 1.5, "accuracy": 0.75, "examples": 8},
    "example_prompt": "abc=", "steps": 30, "seconds": 1.0,
}


@pytest.fixture
def metrics_file(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(METRICS))
    return path


def checkpoint(tmp_path, recipe: str, overrides: list[str] | None = None) -> str:
    path = str(tmp_path / f"{recipe}.safetensors")
    seqzoo.save(seqzoo.build(recipe, overrides, device="cpu"), path)
    return path


# -- plot ------------------------------------------------------------------------------------------
def test_metric_series_puts_the_final_eval_at_the_last_step():
    series = metric_series(METRICS)
    assert series["step"] == [10, 20, 30] and series["lr"] == [1e-4, 2e-4, 1e-4]
    assert series["eval_accuracy_step"] == [20, 30] and series["eval_accuracy"] == [0.25, 0.75]
    assert series["eval_loss"] == [2.5, 1.5]


def test_plot_writes_a_png_with_three_panels(metrics_file, tmp_path):
    out = tmp_path / "curves.png"
    assert main(["plot", str(metrics_file), "-o", str(out)]) == 0
    height, width = png_size(out)
    assert 250 <= height <= 600 and 1000 <= width <= 1600  # three panels side by side


def test_plot_without_accuracy_draws_two_panels(tmp_path):
    path = tmp_path / "text.json"
    path.write_text(json.dumps({"history": [{"step": 1, "loss": 3.0, "lr": 1e-3}], "eval": {"loss": 3.0}}))
    assert main(["plot", str(path)]) == 0  # default output: text.png beside it
    assert 700 <= png_size(tmp_path / "text.png")[1] < 1000


def test_plot_reads_the_json_lines_that_train_writes(tmp_path):
    """``seqzoo train`` logs a history entry a line as it goes (``NAME.metrics.jsonl``), the last
    one with the final evaluation; plot reads that file as it reads ``--metrics``."""
    out = tmp_path / "m.safetensors"
    assert main(["train", "tiny-gpt", "-o", str(out), "--set", "train.steps=4", "--set", "train.log_every=2",
                 "--quiet"]) == 0
    log = tmp_path / "m.metrics.jsonl"
    metrics = load_metrics(log)
    assert [e["step"] for e in metrics["history"]] == [2, 4] and "accuracy" in metrics["eval"]
    assert main(["plot", str(log), "-o", str(tmp_path / "c.png")]) == 0
    bad = tmp_path / "bad.metrics.jsonl"
    bad.write_text(log.read_text() + "{broken\n")
    with pytest.raises(seqzoo.InputError, match=r"bad\.metrics\.jsonl:3: not a JSON line"):
        load_metrics(bad)


def test_plot_of_a_missing_metrics_file_exits_2(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "nope.json"), "-o", str(tmp_path / "x.png")]) == 2
    one_line_error(capsys, "nope.json", "no such metrics file", "--metrics")


@pytest.mark.parametrize("text", ["{not json", '{"history": []}', '[1, 2]'])
def test_plot_of_a_malformed_metrics_file_exits_2(tmp_path, capsys, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    assert main(["plot", str(path), "-o", str(tmp_path / "x.png")]) == 2
    one_line_error(capsys, "bad.json")


def test_missing_matplotlib_is_one_line_naming_the_extra(metrics_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import fail
    assert main(["plot", str(metrics_file), "-o", str(tmp_path / "x.png")]) == 2
    one_line_error(capsys, "matplotlib is not installed", "pip install 'seqzoo[plot]'")


def test_import_seqzoo_does_not_import_matplotlib():
    code = ("import sys, seqzoo, seqzoo.lab.plots, seqzoo.lab.experiments, seqzoo.cli.plots, seqzoo.cli.commands; "
            "seqzoo.cli.commands._parser(); assert 'matplotlib' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- attention -------------------------------------------------------------------------------------
def test_recorded_attention_of_layer_0_matches_a_hand_computation(tiny_gpt):
    """Layer 0 of tiny-gpt (learned positions, pre-norm): softmax(q kᵀ/√D, causal) per head."""
    ids = torch.tensor([[97, 98, 99, 61, 97]])
    with torch.no_grad(), record_attention(tiny_gpt) as records:
        tiny_gpt(ids)
        block, stack = tiny_gpt.decoder.blocks[0], tiny_gpt.decoder
        x = tiny_gpt.embed(ids) + stack.position.table.weight[:5]
        q, k, _ = block.mixer.qkv_proj(block.mixer_norm(x)).split(64, dim=-1)
        q, k = (t.view(1, 5, 4, 16).transpose(1, 2) for t in (q, k))
        logits = q @ k.transpose(-2, -1) / 4.0
        logits = logits.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
        expected = logits.softmax(-1)
    assert list(records) == [f"decoder.blocks.{i}.mixer" for i in range(4)]
    torch.testing.assert_close(records["decoder.blocks.0.mixer"][0], expected, atol=1e-6, rtol=1e-5)


def test_recording_keeps_the_output_and_restores_the_score(tiny_gpt):
    ids = torch.randint(0, 256, (2, 7))
    with torch.no_grad():
        plain = tiny_gpt(ids)
        with record_attention(tiny_gpt) as records:
            recorded = tiny_gpt(ids)
    torch.testing.assert_close(recorded, plain, atol=1e-5, rtol=1e-5)
    assert all("attend" not in vars(block.mixer.score) for block in tiny_gpt.decoder.blocks)
    weights = records["decoder.blocks.3.mixer"][0]  # (B, H, T, S)
    assert weights.shape == (2, 4, 7, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 7))
    assert weights.triu(1).abs().max() == 0  # causal: no weight on later keys


def test_recording_restores_the_score_after_an_error(tiny_gpt):
    with pytest.raises(RuntimeError, match="boom"), record_attention(tiny_gpt):
        raise RuntimeError("boom")
    assert all("attend" not in vars(block.mixer.score) for block in tiny_gpt.decoder.blocks)


def test_attention_of_a_decoder_checkpoint_writes_one_row_per_layer(tmp_path):
    path = checkpoint(tmp_path, "tiny-gpt", ["model.layers=2"])
    out = tmp_path / "attn.png"
    assert main(["attention", path, "--prompt", "abc=", "-o", str(out), "--max-new-tokens", "3"]) == 0
    height, width = png_size(out)
    assert 300 <= height <= 1200 and 600 <= width <= 1600  # 2 layers x 4 heads


def test_attention_of_an_encoder_decoder_has_cross_attention_against_the_source():
    model = seqzoo.build("tiny-t5", device="cpu")
    panels = attention_panels(model, seqzoo.tokenizer(model), "abcd", max_new_tokens=3)
    titles = [p.title for p in panels]
    assert titles == ["encoder L0 self", "encoder L1 self", "decoder L0 self", "decoder L0 cross",
                      "decoder L1 self", "decoder L1 cross"]
    cross = panels[3]
    assert cross.weights.shape[-1] == 5 and cross.cols == ["a", "b", "c", "d", "<eos>"]  # source + eos
    assert cross.weights.shape[-2] == len(cross.rows) and cross.rows[0] == "<bos>"  # decoder start


def test_attention_of_rnn_seq2seq_is_the_alignment_of_the_greedy_decode(tmp_path):
    model = seqzoo.build("tiny-seq2seq", ["model.attention=additive"], device="cpu")
    (panel,) = attention_panels(model, seqzoo.tokenizer(model), "hello", max_new_tokens=4)
    assert panel.weights.shape == (1, 4, 6)  # 4 decoded tokens (no eos learned) x "hello" + eos
    torch.testing.assert_close(panel.weights.sum(-1), torch.ones(1, 4))
    out = tmp_path / "align.png"
    path = checkpoint(tmp_path, "tiny-seq2seq", ["model.attention=bilinear"])
    assert main(["attention", path, "--prompt", "abc", "-o", str(out), "--max-new-tokens", "5"]) == 0
    assert min(png_size(out)) >= 150


@pytest.mark.parametrize("recipe, overrides, message", [
    ("tiny-seq2seq", [], "attention: none"),
    ("rnn-lm", ["model.dim=16", "model.hidden=16"], "has no attention to plot"),
])
def test_attention_of_a_checkpoint_without_attention_exits_2(tmp_path, capsys, recipe, overrides, message):
    path = checkpoint(tmp_path, recipe, overrides)
    assert main(["attention", path, "--prompt", "abc", "-o", str(tmp_path / "a.png")]) == 2
    one_line_error(capsys, message)
    assert not (tmp_path / "a.png").exists()


def test_attention_of_a_file_that_is_not_a_checkpoint_exits_2(metrics_file, tmp_path, capsys):
    assert main(["attention", str(metrics_file), "--prompt", "abc", "-o", str(tmp_path / "a.png")]) == 2
    one_line_error(capsys, "metrics.json")


# -- positions: the numbers ------------------------------------------------------------------------
def rope(**params):
    return seqzoo.registry().create("position", {"kind": "rope", **params}, 64, 16, 4, 64)


def test_rope_wavelengths_are_2pi_base_to_the_2k_over_d():
    d = rotary_wavelengths(rope(base=500.0))
    expected = torch.tensor([2 * math.pi * 500.0 ** (2 * k / 16) for k in range(8)], dtype=torch.float64)
    torch.testing.assert_close(d["original"], expected)
    torch.testing.assert_close(d["scaled"], expected, rtol=1e-5, atol=0)  # read back from the angles
    assert d["attention_factor"] == pytest.approx(1.0)


def test_yarn_keeps_fast_pairs_stretches_slow_ones_and_sharpens():
    """YaRN (Peng et al. 2023) with d = 16, b = 10⁴, L = 64, s = 4: the ramp runs from
    ⌊d·ln(L/(2π·32))/(2 ln b)⌋ → 0 to ⌈d·ln(L/2π)/(2 ln b)⌉ = 3, so pair 0 keeps its wavelength,
    pairs 3.. are stretched by s, pair 1 by 1/(2/3 + 1/(3s)) and the amplitude is 0.1·ln s + 1."""
    d = rotary_wavelengths(rope(scaling={"kind": "yarn", "factor": 4.0}))
    ratio = d["scaled"] / d["original"]
    assert ratio[0].item() == pytest.approx(1.0, rel=1e-5)
    assert ratio[1].item() == pytest.approx(1 / (2 / 3 + 1 / 12), rel=1e-5)
    torch.testing.assert_close(ratio[3:], torch.full((5,), 4.0, dtype=torch.float64), rtol=1e-5, atol=0)
    assert d["attention_factor"] == pytest.approx(0.1 * math.log(4) + 1, rel=1e-6)
    assert d["context"] == 64 and d["length"] == 256


def test_linear_scaling_stretches_every_wavelength_by_the_factor():
    d = rotary_wavelengths(rope(scaling={"kind": "linear", "factor": 2.0}))
    torch.testing.assert_close(d["scaled"], 2 * d["original"], rtol=1e-5, atol=0)


@pytest.mark.parametrize("heads", [4, 8])
def test_alibi_bias_is_minus_slope_times_distance(heads):
    """Press et al. (2022): m_h = 2^(−8h/n) for n a power of two."""
    scheme = seqzoo.registry().create("position", "alibi", 64, 64 // heads, heads, 128)
    offsets, bias = bias_by_distance(scheme, 20)
    assert offsets.tolist() == list(range(21))
    slopes = torch.tensor([2.0 ** (-8 * h / heads) for h in range(1, heads + 1)])
    torch.testing.assert_close(bias, -slopes[:, None] * offsets[None].float())


def test_t5_bias_reads_one_bucket_per_short_distance_and_shares_the_last():
    scheme = seqzoo.registry().create("position", "t5", 64, 16, 4, 512)  # causal: 32 buckets, 16 exact
    table = scheme.table.weight.detach()  # (N, H)
    offsets, bias = bias_by_distance(scheme, 300)
    torch.testing.assert_close(bias[:, :16], table[:16].T)  # distance d < 16: bucket d
    torch.testing.assert_close(bias[:, 128:], table[31][:, None].expand(4, 173))  # >= max_distance
    scheme.causal = False  # an encoder: offsets on both sides, keys after the query in buckets 16..
    offsets, bias = bias_by_distance(scheme, 10)
    assert offsets.tolist() == list(range(-10, 11))
    torch.testing.assert_close(bias[:, 10 + 3], table[16 + 3])  # p_k − p_q = +3
    torch.testing.assert_close(bias[:, 10 - 3], table[3])


def test_sinusoidal_table_is_sin_and_cos_of_p_over_base_powers():
    scheme = seqzoo.registry().create("position", "sinusoidal", 8, 2, 4, 64)
    table = absolute_table(scheme, 50)
    p, k = 37, 2
    assert table[p, 2 * k].item() == pytest.approx(math.sin(p / 10000 ** (2 * k / 8)), abs=1e-5)
    assert table[p, 2 * k + 1].item() == pytest.approx(math.cos(p / 10000 ** (2 * k / 8)), abs=1e-5)


def test_a_content_dependent_bias_has_nothing_to_plot():
    scheme = seqzoo.registry().create("position", "shaw", 64, 16, 4, 64)
    picture = describe_position(scheme, "decoder: shaw")
    assert picture.kind == "nothing" and "depends on the query" in picture.note
    with pytest.raises(PlotError, match="depends on the query's content"):
        bias_by_distance(scheme, 8)


# -- positions: the command ------------------------------------------------------------------------
@pytest.mark.parametrize("recipe, rows", [("tiny-llama", 1), ("tiny-t5", 2), ("tiny-bloom", 1),
                                          ("tiny-transformer", 2)])
def test_positions_writes_one_row_per_stack(tmp_path, recipe, rows):
    out = tmp_path / "pos.png"
    assert main(["positions", recipe, "-o", str(out), "--length", "64"]) == 0
    height, width = png_size(out)
    assert width == 1000 and 330 * rows <= height <= 420 * rows + 60


def test_positions_of_a_checkpoint_show_the_trained_table(tmp_path):
    from seqzoo.lab.positions import position_schemes

    model = seqzoo.build("tiny-gpt", ["model.max_seq_len=32"], device="cpu")
    path = str(tmp_path / "m.safetensors")
    seqzoo.save(model, path)
    [(name, scheme)], note = position_schemes(path)
    assert name == "decoder: learned" and note == ""
    torch.testing.assert_close(absolute_table(scheme, 32), model.decoder.position.table.weight.detach())
    assert main(["positions", path, "-o", str(tmp_path / "p.png")]) == 0


@pytest.mark.parametrize("recipe, overrides, message", [
    ("tiny-gpt", ["--set", "model.position=none"], "order comes only from the causal mask"),
    ("tiny-seq2seq", [], "no position scheme"),
])
def test_positions_with_nothing_to_plot_notes_it_and_exits_0(tmp_path, capsys, recipe, overrides, message):
    out = tmp_path / "pos.png"
    assert main(["positions", recipe, *overrides, "-o", str(out)]) == 0
    assert message in capsys.readouterr().err
    assert png_size(out)[0] <= 200  # a small note, not an empty grid


def test_positions_of_an_unknown_recipe_exits_2(tmp_path, capsys):
    assert main(["positions", "tiny-gtp", "-o", str(tmp_path / "p.png")]) == 2
    one_line_error(capsys, "tiny-gtp")


# -- every other error a user can reach ------------------------------------------------------------
def test_recording_twice_at_once_is_refused(tiny_gpt):
    with record_attention(tiny_gpt), pytest.raises(PlotError, match="already being recorded"):
        with record_attention(tiny_gpt):
            pass
    assert all("attend" not in vars(block.mixer.score) for block in tiny_gpt.decoder.blocks)


def test_a_score_that_is_not_a_softmax_cannot_be_recorded(tiny_gpt):
    tiny_gpt.decoder.blocks[2].mixer.score.normalization = "sigmoid"
    with pytest.raises(PlotError, match="decoder.blocks.2.mixer: score ScaledDot normalises with sigmoid"):
        with record_attention(tiny_gpt):
            pass
    assert all("attend" not in vars(block.mixer.score) for block in tiny_gpt.decoder.blocks)


def test_plotting_no_attention_panels_is_an_error(tmp_path):
    from seqzoo.lab.plots import plot_attention

    with pytest.raises(PlotError, match="no attention weights were recorded"):
        plot_attention([], tmp_path / "a.png")


@pytest.mark.parametrize("args, message", [
    (["attention", "{ckpt}", "--prompt", "a", "--max-new-tokens", "-1"], "--max-new-tokens must be >= 0, got -1"),
    (["positions", "tiny-gpt", "--length", "1"], "--length must be >= 2, got 1"),
    (["positions", "{ckpt}", "--set", "model.layers=1"], "--set applies to recipes, not to checkpoints"),
])
def test_bad_picture_options_exit_2(tmp_path, capsys, args, message):
    ckpt = checkpoint(tmp_path, "tiny-gpt", ["model.layers=1"])
    args = [a.replace("{ckpt}", ckpt) for a in args]
    assert main([*args, "-o", str(tmp_path / "x.png")]) == 2
    one_line_error(capsys, message)


@pytest.mark.parametrize("command, name", [(["positions", "tiny-llama"], "positions.png"),
                                           (["attention", "CKPT", "--prompt", "ab"], "attention.png"),
                                           (["plot", "METRICS"], "metrics.png")])
def test_an_output_that_is_a_folder_exits_2_naming_it(metrics_file, tmp_path, capsys, command, name):
    folder = tmp_path / "pictures"
    folder.mkdir()
    given = {"CKPT": checkpoint(tmp_path, "tiny-gpt"), "METRICS": str(metrics_file)}
    assert main([given.get(part, part) for part in command] + ["-o", str(folder)]) == 2
    one_line_error(capsys, f"-o {folder}: is a directory; give a file name such as {folder / name}")
