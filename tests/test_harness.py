"""lm-evaluation-harness on seqzoo models (seqzoo.lab.harness): local tasks of every output type
run end to end through ``seqzoo eval --tasks``, and the adapter's loglikelihoods and accuracy equal
lm-eval's own ``hf`` model on the same weights exported with ``to_hf``."""
from __future__ import annotations

import json

import pytest
import torch

import seqzoo
from seqzoo.cli import main

lm_eval = pytest.importorskip("lm_eval")
pytestmark = pytest.mark.filterwarnings("ignore")

QUESTIONS = [("The cat sat on the", ["mat", "moon", "idea"], 0), ("Two plus two is", ["four", "blue"], 0),
             ("Water is", ["wet", "dry", "loud"], 1), ("def f(x): return", [" x", " 7", " None"], 2),
             ("import", [" os", " sys"], 1), ("Hello", [" world", " there", "!"], 2)]


def tasks_folder(tmp_path):
    """Three local tasks over JSONL files: multiple choice, rolling loglikelihood, generation."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "mc.jsonl").write_text("\n".join(json.dumps({"question": q, "choices": c, "answer": a})
                                             for q, c, a in QUESTIONS) + "\n")
    (data / "text.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in
                                               ["for i in range(10):\n    print(i)\n", "x = 1\ny = x + 2\n"]) + "\n")
    (data / "echo.jsonl").write_text("\n".join(json.dumps({"prompt": p, "target": "a"}) for p in ["ab", "cd"]) + "\n")

    def write(name: str, body: str, file: str) -> None:
        (tmp_path / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data / file}\n"
            f"test_split: test\n{body}")

    write("seqzoo_mc", "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\n"
                       "doc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n", "mc.jsonl")
    write("seqzoo_rolling", "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
                            "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n", "text.jsonl")
    write("seqzoo_gen", "output_type: generate_until\ndoc_to_text: '{{prompt}}'\ndoc_to_target: '{{target}}'\n"
                        "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 6\n  do_sample: false\n"
                        "metric_list:\n  - metric: exact_match\n", "echo.jsonl")
    return tmp_path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    model = seqzoo.build("tiny-llama", ["model.position.scaling=null"], device="cpu")
    seqzoo.save(model, folder / "tiny.safetensors")
    seqzoo.to_hf(model, folder / "hf")
    return folder


def test_local_tasks_of_every_kind_run_through_seqzoo_eval(tiny, tmp_path, capsys):
    include = tasks_folder(tmp_path)
    out = tmp_path / "results.json"
    assert main(["eval", str(tiny / "tiny.safetensors"), "--tasks", "seqzoo_mc,seqzoo_rolling,seqzoo_gen",
                 "--include-path", str(include), "--batch-size", "4", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| seqzoo_mc | acc |" in printed and "| seqzoo_rolling | word_perplexity |" in printed
    results = json.loads(out.read_text())["results"]
    assert 0.0 <= results["seqzoo_mc"]["acc,none"] <= 1.0
    assert results["seqzoo_rolling"]["word_perplexity,none"] > 1.0
    assert "exact_match,none" in results["seqzoo_gen"]


def test_loglikelihoods_and_accuracy_equal_lm_evals_hf_model_on_the_exported_weights(tiny, tmp_path):
    from lm_eval.models.huggingface import HFLM

    from seqzoo.lab.harness import adapter_class

    include = tasks_folder(tmp_path)
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(include))
    model = seqzoo.load(tiny / "tiny.safetensors")
    ours = adapter_class()(model, seqzoo.tokenizer(model), batch_size=4)
    theirs = HFLM(pretrained=str(tiny / "hf"), device="cpu", dtype="float32", batch_size=4)
    runs = [lm_eval.simple_evaluate(model=lm, tasks=["seqzoo_mc", "seqzoo_rolling"], task_manager=manager,
                                    log_samples=True) for lm in (ours, theirs)]
    for task in ("seqzoo_mc", "seqzoo_rolling"):
        got = [s["resps"] for s in runs[0]["samples"][task]]
        want = [s["resps"] for s in runs[1]["samples"][task]]
        assert len(scores(got)) == {"seqzoo_mc": 16, "seqzoo_rolling": 2}[task]  # every choice, every text
        torch.testing.assert_close(torch.tensor(scores(got)), torch.tensor(scores(want)), rtol=1e-5, atol=1e-4)
    assert runs[0]["results"]["seqzoo_mc"]["acc,none"] == runs[1]["results"]["seqzoo_mc"]["acc,none"]


def scores(responses) -> list[float]:
    """Every log-likelihood in lm-eval's per-sample responses (nested lists of numbers, or of
    (log-likelihood, is-greedy) pairs), in order."""
    if isinstance(responses, (list, tuple)):
        if len(responses) == 2 and isinstance(responses[1], bool):
            return [float(responses[0])]
        return [value for item in responses for value in scores(item)]
    return [float(responses)]


def test_an_unknown_task_lists_the_closest_names(tiny, tmp_path, capsys):
    include = tasks_folder(tmp_path)
    assert main(["eval", str(tiny / "tiny.safetensors"), "--tasks", "seqzoo_mcc", "--include-path", str(include)]) == 2
    err = capsys.readouterr().err
    assert "unknown lm-eval task 'seqzoo_mcc'; did you mean 'seqzoo_mc'" in err


def test_text_or_tasks_one_of_them(tiny, capsys):
    assert main(["eval", str(tiny / "tiny.safetensors")]) == 2
    assert "give --text FILE (perplexity) or --tasks NAME[,NAME] (lm-eval), one of them" in capsys.readouterr().err


def test_the_builtins_questions_describe_the_right_function_among_four():
    import builtins
    import inspect

    from seqzoo.lab.harness import builtin_questions

    questions = builtin_questions()
    assert len(questions) >= 40 and questions == builtin_questions()  # every machine builds the same set
    for q in questions:
        assert len(q["choices"]) == 4 and len(set(q["choices"])) == 4
        name = q["choices"][q["answer"]].strip()
        described = q["question"].split("does this: ", 1)[1].rsplit(".\n", 1)[0]
        assert described in inspect.getdoc(getattr(builtins, name))
    abs_question = next(q for q in questions if "absolute value" in q["question"])
    assert abs_question["choices"][abs_question["answer"]] == " abs"
