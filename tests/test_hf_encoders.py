"""Encoders with their masked-LM heads against transformers: BERT (``BertForMaskedLM``,
``BertForPreTraining``), RoBERTa (``RobertaModel``, ``RobertaForMaskedLM``) and XLM-RoBERTa
(``XLMRobertaForMaskedLM``) are imported from small random models with odd head counts and
randomised LayerNorms and head biases, give transformers' logits within 1e-4 in float32 on padded
batches (RoBERTa also left-padded: its positions follow the pad id), and export to folders the same
class loads with the same logits (1e-5)."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

import seqzoo
from seqzoo.cli.commands import main
from seqzoo.testing import parity

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
# The random references have no tokenizer, so their exports have none either.
pytestmark = pytest.mark.filterwarnings("ignore:.*no tokenizer written")

V = 99    # vocabulary
T = 20    # sequence length of the logit tests
PAD = 1   # RoBERTa's pad id (its positions start at PAD + 1)
SMALL = dict(vocab_size=V, hidden_size=40, num_hidden_layers=3, num_attention_heads=5, intermediate_size=64,
             layer_norm_eps=1e-6)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def randomised(model):
    """HF starts LayerNorms at (1, 0) and the head's output bias at 0: random values show a
    misplaced norm or bias. Returns the model in eval mode."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name:
                parameter.uniform_(0.5, 1.5) if name.endswith("weight") else parameter.uniform_(-0.5, 0.5)
            elif name in ("cls.predictions.bias", "lm_head.bias"):
                parameter.uniform_(-1.0, 1.0)
    return model.eval()


def bert_config(**kw):
    # hidden_act gelu_new: BERT's head uses hidden_act too, so an exact GELU there would show
    return transformers.BertConfig(**{**SMALL, "max_position_embeddings": 64, "hidden_act": "gelu_new", **kw})


def roberta_config(cls=transformers.RobertaConfig, **kw):
    # 64 tokens + the pad offset; gelu_new in the FFN while RoBERTa's head keeps the exact GELU
    return cls(**{**SMALL, "max_position_embeddings": 64 + PAD + 1, "type_vocab_size": 1, "hidden_act": "gelu_new",
                  "pad_token_id": PAD, "bos_token_id": 0, "eos_token_id": 2, **kw})


def bert_batch() -> dict:
    """Right-padded (as BERT tokenizers pad) with two segments."""
    ids = torch.randint(3, V, (2, T))
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, 13:] = 0
    ids[1, 13:] = 0
    types = torch.zeros(2, T, dtype=torch.long)
    types[:, 9:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def roberta_batch(side: str) -> dict:
    """Padded with the pad id on ``side``: the real tokens' positions must not move."""
    ids = torch.randint(3, V, (2, T))
    mask = torch.ones(2, T, dtype=torch.long)
    cut = slice(13, None) if side == "right" else slice(None, 7)
    ids[1, cut], mask[1, cut] = PAD, 0
    return {"input_ids": ids, "attention_mask": mask}


def reimported(pair: parity.Imported, out) -> parity.Imported:
    """The exported folder, loaded by the reference's class, as a new reference for ``pair.model``."""
    again = type(pair.hf).from_pretrained(out, dtype=torch.float32).eval()
    return parity.Imported(again, pair.model, out)


# -- BERT ------------------------------------------------------------------------------------------
def test_bert_masked_lm_logits_and_export_match_transformers(tmp_path):
    pair = parity.import_reference(randomised(transformers.BertForMaskedLM(bert_config())), tmp_path / "hf")
    m = pair.model.recipe["model"]
    assert m["mlm_head"]["activation"] == {"kind": "gelu", "approximate": "tanh"} and m["pooler"] is False
    assert parity.check_masked_lm_logits(pair, bert_batch()) < 1e-4
    out = parity.check_export(pair, tmp_path / "out", T)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    assert parity.check_masked_lm_logits(reimported(pair, out), bert_batch(), tol=1e-5) < 1e-5


def test_bert_pretraining_drops_the_next_sentence_head_in_one_line(tmp_path):
    hf = randomised(transformers.BertForPreTraining(bert_config()))
    hf.save_pretrained(tmp_path / "hf")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = seqzoo.from_hf(tmp_path / "hf")
    lines = [str(w.message) for w in caught]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "dropped the next-sentence head (cls.seq_relationship.bias, cls.seq_relationship.weight)" in lines[0]
    pair = parity.Imported(hf, model, tmp_path / "hf")
    assert model.recipe["model"]["pooler"] is True  # the pooler feeds the dropped head; kept
    assert parity.check_masked_lm_logits(pair, bert_batch()) < 1e-4
    # Exported as BertForMaskedLM (no next-sentence head to write); the pooler stays under bert.
    out = parity.check_export(pair, tmp_path / "out", T, hf_class=transformers.BertForMaskedLM,
                              run=lambda m, ids: m(ids)[0])
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    base = transformers.BertModel.from_pretrained(out, dtype=torch.float32).eval()
    batch = bert_batch()
    with torch.no_grad():
        assert (base(**batch).pooler_output - hf.bert(**batch).pooler_output).abs().max() < 1e-5


def test_import_hf_prints_what_it_dropped(tmp_path, capsys):
    transformers.BertForPreTraining(bert_config()).save_pretrained(tmp_path / "hf")
    assert main(["import-hf", str(tmp_path / "hf"), "-o", str(tmp_path / "m.safetensors")]) == 0
    err = capsys.readouterr().err
    assert "seqzoo: warning: " in err and "dropped the next-sentence head" in err
    assert seqzoo.load(tmp_path / "m.safetensors").has_mlm_head


def test_bert_checkpoint_storing_the_tied_decoder_imports(tmp_path):
    """Older checkpoints store cls.predictions.decoder.{weight,bias} beside what they duplicate."""
    from safetensors.torch import load_file, save_file

    hf = randomised(transformers.BertForMaskedLM(bert_config()))
    hf.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"].clone()
    tensors["cls.predictions.decoder.bias"] = tensors.pop("cls.predictions.bias")  # only the decoder's copy
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert parity.check_masked_lm_logits(parity.Imported(hf, seqzoo.from_hf(tmp_path), tmp_path), bert_batch()) < 1e-4
    tensors["cls.predictions.decoder.weight"] += 1
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(seqzoo.CheckpointError, match=r"cls\.predictions\.decoder\.weight differs from "
                                                     r"embeddings\.word_embeddings\.weight"):
        seqzoo.from_hf(tmp_path)


def test_bert_checkpoint_with_tensorflow_layer_norm_names_imports(tmp_path):
    """bert-base-uncased's model.safetensors still names LayerNorm weights gamma and beta."""
    from safetensors.torch import load_file, save_file

    hf = randomised(transformers.BertForPreTraining(bert_config()))
    hf.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    renamed = {n.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): t
               for n, t in tensors.items()}
    assert "bert.embeddings.LayerNorm.gamma" in renamed and "cls.predictions.transform.LayerNorm.beta" in renamed
    save_file(renamed, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.warns(UserWarning, match="dropped the next-sentence head"):
        model = seqzoo.from_hf(tmp_path)
    assert parity.check_masked_lm_logits(parity.Imported(hf, model, tmp_path), bert_batch()) < 1e-4


def test_bert_untied_masked_lm_head_is_refused(tmp_path):
    transformers.BertForMaskedLM(bert_config(tie_word_embeddings=False)).save_pretrained(tmp_path)
    with pytest.raises(seqzoo.CheckpointError, match=r"bert tie_word_embeddings: false is not supported"):
        seqzoo.from_hf(tmp_path)


def test_other_bert_task_heads_are_still_unexpected(tmp_path):
    transformers.BertForSequenceClassification(bert_config()).save_pretrained(tmp_path)
    with pytest.raises(seqzoo.CheckpointError, match=r"unexpected tensors: classifier\.bias, classifier\.weight"):
        seqzoo.from_hf(tmp_path)


# -- RoBERTa and XLM-RoBERTa -----------------------------------------------------------------------
def test_roberta_model_hidden_states_and_export_match_transformers(tmp_path):
    pair = parity.import_reference(randomised(transformers.RobertaModel(roberta_config())), tmp_path / "hf")
    m = pair.model.recipe["model"]
    assert (m["padding_idx"], m["max_seq_len"], m["type_vocab_size"], m["mlm_head"]) == (PAD, 66, 1, None)
    for side in ("right", "left"):
        batch = roberta_batch(side)
        with torch.no_grad():
            theirs = pair.hf(**batch)
            hidden = pair.model(**batch)
        real = batch["attention_mask"].bool()
        assert parity.max_difference(hidden, theirs.last_hidden_state, real) < 1e-4
        assert parity.max_difference(pair.model.pool(hidden), theirs.pooler_output) < 1e-4
    out = parity.check_export(pair, tmp_path / "out", T, run=lambda model, ids: model(ids).last_hidden_state)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["RobertaModel"] and config["pad_token_id"] == PAD


@pytest.mark.parametrize("side", ["right", "left"])
def test_roberta_masked_lm_logits_and_export_match_transformers(side, tmp_path):
    pair = parity.import_reference(randomised(transformers.RobertaForMaskedLM(roberta_config())), tmp_path / "hf")
    assert pair.model.recipe["model"]["mlm_head"]["activation"] == {"kind": "gelu", "approximate": "none"}
    assert parity.check_masked_lm_logits(pair, roberta_batch(side)) < 1e-4
    out = parity.check_export(pair, tmp_path / "out", T)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["RobertaForMaskedLM"]
    assert parity.check_masked_lm_logits(reimported(pair, out), roberta_batch(side), tol=1e-5) < 1e-5


def test_xlm_roberta_masked_lm_logits_and_export_match_transformers(tmp_path):
    hf = transformers.XLMRobertaForMaskedLM(roberta_config(transformers.XLMRobertaConfig))
    pair = parity.import_reference(randomised(hf), tmp_path / "hf")
    for side in ("right", "left"):
        assert parity.check_masked_lm_logits(pair, roberta_batch(side)) < 1e-4
    out = parity.check_export(pair, tmp_path / "out", T, model_type="xlm-roberta")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["XLMRobertaForMaskedLM"]
    assert parity.check_masked_lm_logits(reimported(pair, out), roberta_batch("left"), tol=1e-5) < 1e-5
    # The same layout as RoBERTa: unnamed, it exports as roberta (xlm-roberta only when asked).
    auto = seqzoo.to_hf(pair.model, tmp_path / "auto")
    assert json.loads((auto / "config.json").read_text())["model_type"] == "roberta"


def test_roberta_positions_are_transformers_position_ids():
    model = seqzoo.build("tiny-bert", ["model.padding_idx=1"], device="cpu")
    ids = torch.randint(0, 4, (4, 15))  # pad ids anywhere: left, right and in the middle
    expected = transformers.models.roberta.modeling_roberta.RobertaEmbeddings.create_position_ids_from_input_ids(
        ids, 1)
    assert torch.equal(model.positions(ids), expected)


def test_roberta_sequence_past_the_offset_table_is_a_clear_error():
    model = seqzoo.build("tiny-bert", ["model.padding_idx=1"], device="cpu")  # 128 rows: 126 tokens
    with pytest.raises(seqzoo.InputError, match=r"sequence of 127 tokens needs positions up to 128 .* give at "
                                                r"most 126 tokens"):
        model(torch.zeros(1, 127, dtype=torch.long))


def test_roberta_without_a_pad_id_is_refused(tmp_path):
    transformers.RobertaModel(roberta_config()).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "pad_token_id": None}))
    with pytest.raises(seqzoo.CheckpointError, match=r"roberta pad_token_id: null is not supported"):
        seqzoo.from_hf(tmp_path)


# -- export refusals -------------------------------------------------------------------------------
@pytest.mark.parametrize(("overrides", "model_type", "match"), [
    (["model.padding_idx=1"], "bert", r"model\.padding_idx must be null \(bert numbers positions from 0\)"),
    ([], "roberta", r"model\.padding_idx must be set \(roberta numbers positions after the padding id\)"),
    (["model.mlm_head={decoder_bias: false}"], "bert", r"model\.mlm_head: BERT's head has a dense bias and an "
                                                       r"output bias"),
    (["model.mlm_head={activation: relu}"], "bert", r"model\.mlm_head\.activation must be model\.ffn's"),
    (["model.padding_idx=1", "model.mlm_head={activation: {kind: gelu, approximate: tanh}}"], "roberta",
     r"model\.mlm_head\.activation must be the exact gelu"),
    (["model.mlm_head={norm: rmsnorm}"], "bert", r"model\.mlm_head\.norm must be null"),
])
def test_export_refuses_what_the_family_cannot_express(overrides, model_type, match, tmp_path):
    model = seqzoo.build("tiny-bert", ["model.mlm_head={}", *overrides], device="cpu")
    with pytest.raises(seqzoo.CheckpointError, match=f"cannot export as {model_type}: {match}"):
        seqzoo.to_hf(model, tmp_path, model_type=model_type)


def test_encoder_with_head_exports_on_its_own_as_bert(tmp_path):
    model = seqzoo.build("tiny-bert", ["model.mlm_head={}"], device="cpu")
    out = seqzoo.to_hf(model, tmp_path)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == ["BertForMaskedLM"]


# -- the encoder's new recipe keys -----------------------------------------------------------------
@pytest.mark.parametrize(("overrides", "match"), [
    (["model.padding_idx=259"], r"model\.padding_idx: padding_idx=259 must be a token id below vocab_size=259"),
    (["model.padding_idx=1", "model.max_seq_len=2"], r"model\.max_seq_len: max_seq_len=2 leaves no position "
                                                     r"after padding_idx=1; needs > 2"),
])
def test_bad_padding_idx_is_a_recipe_error(overrides, match):
    with pytest.raises(seqzoo.RecipeError, match=match):
        seqzoo.build("tiny-bert", overrides, device="meta")


def test_masked_lm_logits_of_an_encoder_without_head_is_a_clear_error():
    model = seqzoo.build("tiny-bert", device="cpu")
    with pytest.raises(seqzoo.InputError, match=r"built without an MLM head \(model\.mlm_head: null\)"):
        model.mlm_logits(torch.zeros(1, 3, dtype=torch.long))


def test_mlm_head_is_tied_saved_and_counted_once(tmp_path):
    model = seqzoo.build("tiny-bert", ["model.mlm_head={}"], device="cpu")
    plain = seqzoo.build("tiny-bert", device="cpu")
    extra = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in plain.parameters())
    assert extra == 64 * 64 + 64 + 2 * 64 + 259  # dense, its LayerNorm and the output bias: no decoder matrix
    seqzoo.save(model, tmp_path / "m.safetensors")
    again = seqzoo.load(tmp_path / "m.safetensors")
    ids = torch.randint(0, 259, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(again.mlm_logits(ids), model.eval().mlm_logits(ids))
