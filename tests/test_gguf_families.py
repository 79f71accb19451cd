"""GGUF for every family seqzoo writes (docs/gguf.md): seqzoo -> GGUF -> seqzoo is exact in F32 for
each one, each file carries the metadata llama.cpp reads, and what GGUF or llama.cpp cannot hold is
refused in one line naming it. (llama.cpp's own verdict on the same files: test_gguf_llama_cpp.py.)"""
from __future__ import annotations

import pytest
import torch

import seqzoo
from seqzoo.errors import CheckpointError
from seqzoo.io.gguf import GGUFFile, families, from_gguf, to_gguf
from seqzoo.io.gguf_types import WRITABLE
from seqzoo.testing.gguf import ENCODER_DECODERS, ENCODERS, FAMILIES, from_config, shipped

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize("family", list(FAMILIES) + list(ENCODERS))
def test_every_family_round_trips_exactly_in_f32(family, tmp_path):
    torch.manual_seed(0)
    make, model_type = {**FAMILIES, **ENCODERS}[family]
    model = make()
    again = from_gguf(to_gguf(model, tmp_path / "m.gguf", model_type=model_type))
    assert again.recipe["model"]["kind"] == model.recipe["model"]["kind"]
    left_out = set(model.state_dict()) - set(again.state_dict())
    # BERT's pooler, ModernBERT's masked-LM head: llama.cpp computes embeddings, with no place for them
    assert all(name.startswith(("pooler.", "mlm_head.", "head.", "lm_head.")) for name in left_out), left_out
    for name, tensor in again.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    ids = torch.randint(0, 256, (2, 11))
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))
    text = "GGUF keeps the 42 bytes of this line."
    assert seqzoo.tokenizer(again).encode(text) == seqzoo.tokenizer(model).encode(text)


@pytest.mark.parametrize("family", list(ENCODER_DECODERS))
def test_an_encoder_decoder_round_trips_exactly_with_its_head(family, tmp_path):
    torch.manual_seed(0)
    model = ENCODER_DECODERS[family][0]()
    path = to_gguf(model, tmp_path / "t5.gguf")
    again = from_gguf(path)
    m, a = model.recipe["model"], again.recipe["model"]
    assert (a["tie_embeddings"], a["rescale_tied_head"]) == (m["tie_embeddings"], m["rescale_tied_head"])
    assert a["encoder_layers"] == m["encoder_layers"] and a["decoder_layers"] == m["decoder_layers"]
    assert a["decoder_start_id"] == m["decoder_start_id"]
    assert set(again.state_dict()) == set(model.state_dict())
    for name, tensor in again.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    src, tgt = torch.randint(0, 256, (2, 11)), torch.randint(0, 256, (2, 5))
    with torch.no_grad():
        assert torch.equal(again(src, tgt), model(src, tgt))
    source = GGUFFile(path)
    if m["tie_embeddings"]:  # llama.cpp's graph does not scale a tied head: the file's head is scaled
        assert torch.equal(source.tensor("output.weight"), source.tensor("token_embd.weight") * m["dim"] ** -0.5)
    assert "enc.blk.1.attn_rel_b.weight" not in source.tensors  # one bucket table per stack, in layer 0


def test_a_t5_head_that_is_not_the_scaled_embedding_reads_back_as_its_own(tmp_path):
    model = shipped("tiny-t5", "model.rescale_tied_head=false")
    path = to_gguf(model, tmp_path / "t5.gguf")
    assert "output.weight" not in GGUFFile(path).tensors  # an unscaled tied head: llama.cpp reuses the embedding
    assert from_gguf(path).recipe["model"]["tie_embeddings"] is True
    scaled = shipped("tiny-t5")
    rounded = from_gguf(to_gguf(scaled, tmp_path / "f16.gguf", dtype="F16"))
    assert rounded.recipe["model"]["tie_embeddings"] is False  # F16 rounds the scaled copy: a head of its own
    src, tgt = torch.randint(0, 256, (1, 9)), torch.randint(0, 256, (1, 4))
    with torch.no_grad():
        assert (rounded(src, tgt) - scaled(src, tgt)).abs().max() < 1e-3


def test_the_table_of_families_names_every_llama_cpp_architecture():
    assert families() == {
        "bert": ["bert"], "bloom": ["bloom"], "deepseek2": ["deepseek_v3"],
        "falcon-h1": ["falcon_h1"], "gemma2": ["gemma2"], "gemma3": ["gemma3_text"], "gpt2": ["gpt2"],
        "gptneox": ["gpt_neox"], "gpt-oss": ["gpt_oss"], "granitehybrid": ["granitemoehybrid"], "jamba": ["jamba"],
        "kimi-linear": ["kimi_linear"], "lfm2": ["lfm2"], "lfm2moe": ["lfm2_moe"],
        "llama": ["llama", "mistral", "mixtral"], "modern-bert": ["modernbert"], "mamba": ["falcon_mamba", "mamba"],
        "mamba2": ["mamba2"], "nemotron_h": ["nemotron_h"], "nemotron_h_moe": ["nemotron_h"], "olmo2": ["olmo2"],
        "olmoe": ["olmoe"], "phi3": ["phi3"], "qwen2": ["qwen2"],
        "qwen2moe": ["qwen2_moe"], "qwen3": ["qwen3"], "qwen3moe": ["qwen3_moe"], "qwen35": ["qwen3_5_text"],
        "qwen35moe": ["qwen3_5_moe_text"], "qwen3next": ["qwen3_next"], "smollm3": ["smollm3"], "t5": ["t5"]}


def meta(path, arch: str, key: str):
    return GGUFFile(path).meta[f"{arch}.{key}"]


def test_files_carry_what_llama_cpp_reads(tmp_path):
    path = to_gguf(shipped("tiny-llama"), tmp_path / "yarn.gguf")
    assert meta(path, "llama", "rope.scaling.type") == "yarn"
    assert meta(path, "llama", "rope.scaling.factor") == 4.0
    assert meta(path, "llama", "rope.scaling.original_context_length") == 64
    path = to_gguf(shipped("tiny-gemma2"), tmp_path / "g2.gguf")
    assert meta(path, "gemma2", "attn_logit_softcapping") == 50.0
    assert meta(path, "gemma2", "final_logit_softcapping") == 30.0
    assert meta(path, "gemma2", "attention.sliding_window") == 8
    assert meta(path, "gemma2", "attention.sliding_window_pattern") == [True, False, True, False]
    source = GGUFFile(path)
    assert "output.weight" not in source.tensors  # llama.cpp's gemma2 loads no output head
    model = shipped("tiny-gemma2")  # norms are stored as 1 + w
    assert torch.equal(source.tensor("blk.0.attn_norm.weight"), model.decoder.blocks[0].mixer_norm.weight + 1)
    path = to_gguf(shipped("tiny-mamba"), tmp_path / "mamba.gguf")
    assert meta(path, "mamba", "ssm.state_size") == 16 and meta(path, "mamba", "ssm.conv_kernel") == 4
    a_log = shipped("tiny-mamba").state_dict()["decoder.blocks.0.mixer.A_log"]
    assert torch.allclose(GGUFFile(path).tensor("blk.0.ssm_a"), -torch.exp(a_log))
    path = to_gguf(shipped("tiny-moe"), tmp_path / "moe.gguf")
    assert meta(path, "llama", "expert_count") == 4 and meta(path, "llama", "expert_used_count") == 2
    assert GGUFFile(path).shape("blk.0.ffn_gate_exps.weight")[0] == 4
    path = to_gguf(from_config("qwen2_moe", num_key_value_heads=4, moe_intermediate_size=32,
                               shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
                               tie_word_embeddings=True), tmp_path / "q.gguf")
    source = GGUFFile(path)  # qwen2moe needs an output head: a tied one is written out, and read back tied
    assert torch.equal(source.tensor("output.weight"), source.tensor("token_embd.weight"))
    assert from_gguf(path).recipe["model"]["tie_embeddings"] is True
    llama3 = "model.position.scaling={kind: llama3, factor: 8.0, original_max_seq_len: 64}"
    path = to_gguf(shipped("tiny-llama", llama3), tmp_path / "l3.gguf")
    assert GGUFFile(path).shape("rope_freqs.weight") == (8,)  # head_dim / 2 frequency divisors


@pytest.mark.parametrize("kind, tol", [("F16", 2e-3), ("BF16", 1e-2), ("Q8_0", 1e-2), ("Q5_0", 0.08),
                                       ("Q5_1", 0.08), ("Q4_0", 0.15), ("Q4_1", 0.15)])
def test_quantised_types_dequantise_within_their_error_and_keep_vectors_f32(kind, tol, tmp_path):
    torch.manual_seed(0)
    model = shipped("tiny-mamba2")
    again = from_gguf(to_gguf(model, tmp_path / "m.gguf", dtype=kind))
    assert kind in GGUFFile(tmp_path / "m.gguf").types()
    for name, tensor in model.state_dict().items():
        error = (again.state_dict()[name] - tensor).abs().max() / tensor.abs().max()
        assert error <= tol, (name, error.item())
        if tensor.dim() == 1:
            assert torch.allclose(again.state_dict()[name], tensor, atol=1e-6), name


def test_the_cli_offers_every_type_to_gguf_writes():
    import argparse

    from seqzoo.cli.gguf import register_cli

    commands = argparse.ArgumentParser().add_subparsers()
    register_cli(lambda name, **kw: commands.add_parser(name, **kw))
    action = next(a for a in commands.choices["export-gguf"]._actions if a.dest == "type")
    assert tuple(action.choices) == WRITABLE == ("F32", "F16", "BF16", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1")


# -- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, model_type, message", [
    (lambda: shipped("tiny-gru-mixer"), None, r"a recurrent \(gru\) mixer: GGUF has no architecture with it"),
    (lambda: shipped("tiny-hybrid"), None, r"a Hugging Face bamba; seqzoo writes no GGUF form of that family yet"),
    (lambda: shipped("tiny-llama", "model.attention.score=additive"), None, r"the additive attention score"),
    (lambda: shipped("tiny-mistral"), None, r"llama architecture has no sliding window: this model attends to its "
                                            r"last 8 tokens"),
    (lambda: shipped("tiny-gemma2", "model.final_softcap=null"), None, r"gemma2 always softcaps"),
    (lambda: from_config("qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=0), None,
     r"qwen architectures attend to every past token"),
    (lambda: from_config("qwen3_moe", head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                         norm_topk_prob=False), None, r"renormalises the top-k routing weights"),
    (lambda: from_config("olmoe", num_experts=4, num_experts_per_tok=2), None, r"needs as many KV heads as heads"),
    (lambda: shipped("tiny-smollm3", "model.pattern=[nope, rope, rope, rope]"), None,
     r"smollm3 skips RoPE in layers 3, 7, 11, ... and no others"),
    (lambda: shipped("tiny-t5", "model.position.max_distance=64"), None,
     r"t5 buckets relative positions up to a distance of 128; this model's max_distance is 64"),
    (lambda: shipped("tiny-t5", "model.ffn={kind: geglu, hidden: 128, bias: false, approximate: none}"), None,
     r"t5 runs a ReLU feed-forward, or a tanh-GELU gated one; this model's is gated-gelu_python"),
])
def test_what_llama_cpp_cannot_run_is_refused_by_name(make, model_type, message, tmp_path):
    model = make()
    with pytest.raises(CheckpointError, match=message):
        to_gguf(model, tmp_path / "no.gguf", model_type=model_type)
    assert not (tmp_path / "no.gguf").exists()  # refused before a byte is written


def test_a_tensor_a_block_type_cannot_take_is_named_and_written_f16(tmp_path):
    model = from_config("qwen3", head_dim=24, hidden_size=48, num_attention_heads=2, num_key_value_heads=1)
    with pytest.warns(UserWarning, match=r"blk\.0\.attn_q\.weight \(rows of 48\).*Q8_0's blocks of 32 do not divide"):
        path = to_gguf(model, tmp_path / "q.gguf", dtype="Q8_0")
    types = {name: t.tensor_type.name for name, t in GGUFFile(path).tensors.items()}
    assert types["token_embd.weight"] == "F16" and types["blk.0.ffn_down.weight"] == "Q8_0"  # rows of 48 / 96
    with pytest.raises(CheckpointError, match=r"tensor type 'Q4_K' is not supported.*cannot quantise K-quants"):
        to_gguf(model, tmp_path / "k.gguf", dtype="Q4_K")


def write(path, architecture, keys=None, tensors=("token_embd.weight",)):
    writer = gguf.GGUFWriter(str(path), architecture)
    for key, value in (keys or {}).items():
        (writer.add_uint32 if isinstance(value, int) else writer.add_string)(key, value)
    for name in tensors:
        writer.add_tensor(name, torch.zeros(4, 8).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_files_seqzoo_cannot_read_are_refused_with_the_key_named(tmp_path):
    unknown = r"general\.architecture 'rwkv6' is not supported; seqzoo reads bert, bloom"
    with pytest.raises(CheckpointError, match=unknown):
        from_gguf(write(tmp_path / "r.gguf", "rwkv6"))
    with pytest.raises(CheckpointError, match=r"metadata gpt2\.block_count is missing"):
        from_gguf(write(tmp_path / "g.gguf", "gpt2"))
    path = to_gguf(shipped("tiny-llama"), tmp_path / "l.gguf")
    source = GGUFFile(path)
    keys = {k: v for k, v in source.meta.items() if k.startswith("llama.")}
    writer = gguf.GGUFWriter(str(tmp_path / "w.gguf"), "llama")
    for key, field in source.reader.fields.items():
        if key.startswith(("llama.", "tokenizer.")):
            value = field.contents()
            if isinstance(value, list):
                writer.add_array(key, value)
            elif isinstance(value, str):
                writer.add_string(key, value)
            elif isinstance(value, float):
                writer.add_float32(key, value)
            else:
                writer.add_uint32(key, value)
    writer.add_uint32("llama.attention.sliding_window", 16)  # a behaviour seqzoo's llama would not apply
    for name in source.tensors:
        writer.add_tensor(name, source.tensor(name).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert keys
    with pytest.raises(CheckpointError, match=r"metadata llama\.attention\.sliding_window is not read by seqzoo"):
        from_gguf(tmp_path / "w.gguf")


def test_bert_leaves_its_pooler_out_and_keeps_its_wordpiece_vocabulary(tmp_path):
    model = shipped("tiny-bert")
    assert "decoder" not in model.recipe["model"]["kind"]
    with pytest.warns(UserWarning, match=r"pooler\.dense\.bias, pooler\.dense\.weight not written: llama\.cpp's bert"):
        path = to_gguf(model, tmp_path / "bert.gguf")
    assert GGUFFile(path).meta["tokenizer.ggml.token_type_count"] == 2
    assert not any(n.startswith("pooler") for n in GGUFFile(path).tensors)


def test_a_wordpiece_vocabulary_goes_out_in_llama_cpp_spelling_and_comes_back():
    from seqzoo.io.gguf.tokenizer import read_wordpiece, wordpiece

    doc = {"model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                     "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "play": 4, "##ing": 5, "the": 6}},
           "normalizer": {"type": "BertNormalizer", "lowercase": True, "strip_accents": None},
           "added_tokens": [{"content": t, "id": i, "special": True} for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]",
                                                                                          "[SEP]"])]}
    vocab = wordpiece(doc, 8)
    assert vocab["tokens"] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "\u2581play", "ing", "\u2581the", "[PAD7]"]
    assert vocab["types"] == [3, 3, 3, 3, 1, 1, 1, 5] and vocab["strip_accents"] is True
    meta = {"tokenizer.ggml.tokens": vocab["tokens"], "tokenizer.ggml.token_type": vocab["types"],
            "tokenizer.ggml.unknown_token_id": 1, "tokenizer.ggml.cls_token_id": 2,
            "tokenizer.ggml.seperator_token_id": 3, "tokenizer.ggml.normalizer.lowercase": True}
    from tokenizers import Tokenizer

    back = Tokenizer.from_str(read_wordpiece(meta))
    assert back.encode("The PLAYING").ids == [2, 6, 4, 5, 3]


def test_the_cli_writes_a_named_family_and_refuses_in_one_line(tmp_path, capsys):
    from seqzoo.cli import main

    seqzoo.save(from_config("phi3", partial_rotary_factor=0.5), tmp_path / "phi.safetensors")
    assert main(["export-gguf", str(tmp_path / "phi.safetensors"), str(tmp_path / "phi.gguf"),
                 "--model-type", "phi3", "--type", "Q8_0"]) == 0
    assert GGUFFile(tmp_path / "phi.gguf").architecture == "phi3"
    assert "phi3, 2 layers, dim 64" in capsys.readouterr().out
    seqzoo.save(shipped("tiny-gru-mixer"), tmp_path / "gru.safetensors")
    assert main(["export-gguf", str(tmp_path / "gru.safetensors"), str(tmp_path / "gru.gguf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a recurrent (gru) mixer" in err[0]


def test_a_tokenizer_gguf_cannot_hold_here_is_refused_before_a_byte_is_written(tmp_path):
    from tokenizers import Tokenizer, models

    unigram = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0)], unk_id=0))
    (tmp_path / "tokenizer.json").write_text(unigram.to_str())
    model = shipped("tiny-llama", "model.vocab_size=320", "model.position.scaling=null",
                    f"tokenizer={{kind: hf, path: {tmp_path / 'tokenizer.json'}}}")
    with pytest.raises(CheckpointError, match=r"the Unigram tokenizer normalises with \[\] and splits with \[None\]; "
                                              r"llama.cpp's t5 vocabulary holds T5's layout"):
        to_gguf(model, tmp_path / "u.gguf")
    assert not list(tmp_path.glob("u.gguf*"))


#: Text for the Unigram checks: runs of spaces, tabs and newlines, leading and trailing spaces,
#: NFKC's full-width and circled forms, characters the vocabulary lacks, an added token.
UNIGRAM_TEXTS = ["The interpreter reads the program, line by line: 12345!", "  two  spaces\tand\nlines  ",
                 "naïve ＡＢＣ ① 日本語 ☃", "<extra_id_0> fills the gap"]


def test_a_unigram_vocabulary_goes_out_as_t5s_and_tokenizes_as_sentencepiece(tmp_path):
    sentencepiece = pytest.importorskip("sentencepiece")
    from seqzoo.testing.gguf import unigram_model

    model, spm = unigram_model(tmp_path)
    path = to_gguf(model, tmp_path / "ugm.gguf")
    meta = GGUFFile(path).meta
    assert meta["tokenizer.ggml.model"] == "t5" and meta["tokenizer.ggml.remove_extra_whitespaces"] is True
    assert len(meta["tokenizer.ggml.precompiled_charsmap"]) > 100_000  # SentencePiece's NFKC map, as it is
    assert meta["tokenizer.ggml.token_type"][:4] == [3, 3, 2, 1]  # <pad> </s> control, <unk> unknown, ▁ normal
    assert meta["tokenizer.ggml.token_type"][600:] == [3] * 4 + [5] * 4  # <extra_id_N> control, padding unused
    assert meta["tokenizer.ggml.add_eos_token"] is True and meta["tokenizer.ggml.add_bos_token"] is False
    again = from_gguf(path)
    reference = sentencepiece.SentencePieceProcessor(model_file=spm)
    ours, theirs = seqzoo.tokenizer(model), seqzoo.tokenizer(again)
    for text in UNIGRAM_TEXTS:
        ids = ours.encode(text)
        assert theirs.encode(text) == ids, text
        assert theirs.decode(ids) == ours.decode(ids)
        if "<extra_id" not in text:  # SentencePiece knows no added tokens
            assert ids == reference.encode(text) + [1], text
    from tokenizers import Tokenizer

    grown = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))  # a token added beyond the pieces
    grown.add_tokens(["<sep>"])
    grown.save(str(tmp_path / "grown.json"))
    model = shipped("tiny-t5", "model.vocab_size=608", f"tokenizer={{kind: hf, path: {tmp_path / 'grown.json'}}}")
    path = to_gguf(model, tmp_path / "grown.gguf")
    assert GGUFFile(path).meta["tokenizer.ggml.token_type"][604] == 4  # user-defined
    text = "one <sep> two"
    assert seqzoo.tokenizer(from_gguf(path)).encode(text) == seqzoo.tokenizer(model).encode(text)


def test_a_sentencepiece_style_vocabulary_round_trips_with_the_same_tokens(tmp_path):
    from seqzoo.testing.gguf import sentencepiece_model

    model = sentencepiece_model(tmp_path)
    source = GGUFFile(to_gguf(model, tmp_path / "spm.gguf"))
    assert source.meta["tokenizer.ggml.model"] == "llama" and source.meta["tokenizer.ggml.add_space_prefix"] is True
    assert source.meta["tokenizer.ggml.token_type"][3:259] == [6] * 256  # <0x00> .. <0xFF>
    again = from_gguf(tmp_path / "spm.gguf")
    for text in SPM_TEXTS:
        assert seqzoo.tokenizer(again).encode(text) == seqzoo.tokenizer(model).encode(text), text
        assert seqzoo.tokenizer(again).decode(seqzoo.tokenizer(again).encode(text)[1:]) == text


SPM_TEXTS = ["The interpreter reads a program and runs it.", "  two  spaces, naïve café ✓ 12345\nnew line",
             "def f(x):\n    return x ** 2"]
