"""Perplexity (seqzoo.evaluate, seqzoo eval): transformers' documented sliding-window loop run on
a transformers model with the same weights as the reference, the window plan, a worked example."""
from __future__ import annotations

import math

import pytest
import torch

import seqzoo
from seqzoo.errors import InputError
from seqzoo.train.perplexity import evaluate, windows

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def hf_perplexity(hf, ids: torch.Tensor, context: int, stride: int) -> tuple[float, int]:
    """The loop of transformers' "Perplexity of fixed-length models" guide, each window's mean loss
    weighted by the labels that loss averaged (the guide subtracts one per window, which is right
    only when the window's first label is a target, i.e. for disjoint windows)."""
    seq_len = ids.size(1)
    nll_sum, n_tokens, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + context, seq_len)
        trg_len = end_loc - prev_end_loc
        input_ids = ids[:, begin_loc:end_loc]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            neg_log_likelihood = hf(input_ids, labels=target_ids).loss
        num_loss_tokens = (target_ids[:, 1:] != -100).sum().item()  # the labels the shifted loss scores
        nll_sum += neg_log_likelihood.item() * num_loss_tokens
        n_tokens += num_loss_tokens
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return math.exp(nll_sum / n_tokens), n_tokens


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    hf = transformers.LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("llama")
    hf.save_pretrained(folder)
    return hf, seqzoo.from_hf(folder)


@pytest.mark.parametrize("context, stride", [(32, 32), (32, 8), (40, 13), (100, 100)])
def test_perplexity_equals_transformers_documented_loop(pair, context, stride):
    hf, ours = pair
    ids = torch.randint(128, (1, 100), generator=torch.Generator().manual_seed(1))
    expected, scored = hf_perplexity(hf, ids, context, stride)
    result = evaluate(ours, ids=ids[0], context=context, stride=stride)
    assert result.perplexity == pytest.approx(expected, rel=1e-5)
    # overlapping windows score every token but the text's first; disjoint ones miss each
    # window's first token too (nothing in the window predicts it)
    assert result.tokens == scored == (99 if stride < context or context >= 100 else 100 - len(windows(100, 32, 32)))


def test_window_plan_scores_every_token_once():
    plan = windows(100, 40, 13)
    assert plan[0] == (0, 40, 40) and plan[1] == (13, 53, 13) and plan[-1][1] == 100
    assert sum(scored for _, _, scored in plan) == 100


def test_a_model_that_knows_nothing_has_the_vocabulary_as_perplexity():
    model = seqzoo.build("tiny-gpt", device="cpu")
    with torch.no_grad():  # every logit 0: p = 1/V for every token
        model.lm_head.weight.zero_()
    result = evaluate(model, "hello world, hello perplexity", context=16, stride=8)
    assert result.perplexity == pytest.approx(259.0, rel=1e-5)


def test_bad_windows_and_inputs_are_refused():
    model = seqzoo.build("tiny-gpt", device="cpu")
    with pytest.raises(InputError, match=r"context=8 and stride=9: need context >= 2 and 1 <= stride <= context"):
        evaluate(model, "some text here", context=8, stride=9)
    # 0 is a value, refused, not a stand-in for the default (as the CLI's --context 0 is refused)
    with pytest.raises(InputError, match=r"context=0 and stride=0: need context >= 2"):
        evaluate(model, "some text here", context=0)
    with pytest.raises(InputError, match=r"context=8 and stride=0: need"):
        evaluate(model, "some text here", context=8, stride=0)
    with pytest.raises(InputError, match=r"context=999 is longer than the model's 256 positions"):
        evaluate(model, "some text here", context=999)
    with pytest.raises(InputError, match=r"perplexity needs at least 2"):
        evaluate(model, ids=torch.tensor([5]))
    with pytest.raises(InputError, match=r"not a causal LM"):
        evaluate(seqzoo.build("tiny-bert", device="cpu"), "text")


def test_cli_prints_perplexity_and_tokens_per_second(tmp_path, capsys):
    from seqzoo.cli import main

    seqzoo.save(seqzoo.build("tiny-gpt", device="cpu"), tmp_path / "m.safetensors")
    (tmp_path / "t.txt").write_text("The quick brown fox jumps over the lazy dog. " * 10)
    assert main(["eval", str(tmp_path / "m.safetensors"), "--text", str(tmp_path / "t.txt"), "--context", "64",
                 "--stride", "32", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("perplexity ") and "tokens/s" in out and "stride 32" in out
    assert main(["eval", str(tmp_path / "m.safetensors"), "--text", str(tmp_path / "none.txt")]) == 2


@pytest.mark.parametrize("options, error", [
    (["--context", "0"], "--context must be >= 2, got 0"),
    (["--stride", "0"], "--stride must be >= 1, got 0"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--limit", "0"], "--limit must be >= 1, got 0"),
    (["--include-path", "/nonexistent"],
     "seqzoo eval: --include-path applies to --tasks (lm-eval), not --text; drop it"),
    (["--limit", "3", "--num-fewshot", "1"],
     "seqzoo eval: --limit, --num-fewshot apply to --tasks (lm-eval), not --text; drop them"),
])
def test_cli_refuses_a_zero_that_would_mean_the_default_and_options_it_would_ignore(tmp_path, capsys, options, error):
    from seqzoo.cli import main

    (tmp_path / "t.txt").write_text("text")
    assert main(["eval", str(tmp_path / "m.safetensors"), "--text", str(tmp_path / "t.txt"), *options]) == 2
    assert capsys.readouterr().err.strip() == f"seqzoo: error: {error}"


def test_an_lm_eval_output_with_nowhere_to_go_is_refused_before_the_run(tmp_path, capsys):
    from seqzoo.cli import main

    target = tmp_path / "missing" / "results.json"
    assert main(["eval", str(tmp_path / "m.safetensors"), "--tasks", "arc_easy", "-o", str(target)]) == 2
    assert capsys.readouterr().err.strip() == (f"seqzoo: error: -o {target}: the folder {target.parent} does not "
                                               f"exist; create it first (mkdir -p {target.parent})")
