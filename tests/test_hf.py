"""Parity with Hugging Face transformers: small random models of every supported family are saved
with ``save_pretrained``, imported with ``seqzoo.from_hf``, and must give the same logits (hidden
states and pooler output for BERT) within 1e-4 in float32, export back to a folder transformers loads
with the same outputs, and decode greedily token for token like ``generate`` (KV-cached)."""
from __future__ import annotations

import json

import pytest
import torch

import seqzoo
from seqzoo.testing import parity
from seqzoo.testing.parity import hf_greedy

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 128      # vocabulary of every test model
T = 12       # test sequence length
TOL = 1e-4   # the bar, float32

SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             bos_token_id=1, eos_token_id=2, pad_token_id=0)
WIDE = {**SMALL, "hidden_size": 64}  # head_dim 16: enough rotary pairs for the scaling bands


def rope(kind: str, **params) -> dict:
    return {"rope_parameters": {"rope_type": kind, "rope_theta": 10000.0, **params}}


def gpt2(**kw):
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=1,
        eos_token_id=2, **kw))


def llama(**kw):
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**SMALL, **kw}))


def qwen3(**kw):
    return parity.randomised(transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{**SMALL, **kw})))


# name -> (build the HF model, sequence length)
DECODERS = {
    "gpt2": (lambda: gpt2(), T),
    "gpt2-exact-gelu-untied": (lambda: gpt2(activation_function="gelu", tie_word_embeddings=False), T),
    "llama": (lambda: llama(rope_parameters={"rope_type": "default", "rope_theta": 500000.0}), T),
    "llama-mqa-tied-biases": (lambda: llama(num_key_value_heads=1, tie_word_embeddings=True,
                                            attention_bias=True, mlp_bias=True), T),
    "llama-linear": (lambda: llama(**rope("linear", factor=2.0)), T),
    # L = 16 < 20 tokens: the NTK base really changes, in the forward and while decoding.
    "llama-dynamic": (lambda: llama(max_position_embeddings=16, **rope("dynamic", factor=2.0)), 20),
    "llama-yarn": (lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**{
        **WIDE, **rope("yarn", factor=4.0, original_max_position_embeddings=16)})), T),
    "llama-llama3": (lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**{
        **WIDE, **rope("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=16)})), T),
    "mistral": (lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        **SMALL, sliding_window=4)), T),
    "qwen2": (lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SMALL)), T),
    # head_dim 16 (not hidden / heads = 8), per-head QK RMSNorm with non-unit weights
    "qwen3": (lambda: qwen3(head_dim=16), T),
    "qwen3-tied-biases": (lambda: qwen3(head_dim=8, tie_word_embeddings=True, attention_bias=True), T),
    # norms on the sublayer outputs only, QK-norm over the whole projection
    "olmo2": (lambda: parity.randomised(transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**SMALL))), T),
    "bloom": (lambda: transformers.BloomForCausalLM(transformers.BloomConfig(
        vocab_size=V, hidden_size=32, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=2,
        pad_token_id=0)), T),
}
NO_POSITION_IDS = {"bloom"}  # BLOOM's forward takes no position_ids (ALiBi reads the mask)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the converter kit's Imported(hf, model, folder), built once per module."""
    return parity.cached_imports(lambda name: DECODERS[name][0](), tmp_path_factory)


@pytest.mark.parametrize("name", DECODERS)
def test_decoder_matches_transformers_decodes_alike_and_exports(imported, name, tmp_path):
    """Logits plain and left-padded, 32 greedy steps with and without the KV cache, the export."""
    parity.check_causal_lm(imported(name), tmp_path / "out", DECODERS[name][1],
                           position_ids=name not in NO_POSITION_IDS)


def test_imported_recipe_names_the_family_components(imported):
    _, model, _ = imported("mistral")
    m = model.recipe["model"]
    assert m["position"]["kind"] == "rope" and m["norm"]["kind"] == "rmsnorm"
    assert m["attention"]["window"] == 4 and m["attention"]["kv_heads"] == 2
    assert m["ffn"]["kind"] == "swiglu" and m["tie_embeddings"] is False
    _, model, _ = imported("llama-yarn")
    assert model.recipe["model"]["position"]["scaling"]["kind"] == "yarn"
    assert model.recipe["model"]["position"]["scaling"]["original_max_seq_len"] == 16
    _, model, _ = imported("qwen2")
    assert model.recipe["model"]["attention"]["bias"] is True
    assert model.recipe["model"]["attention"]["out_bias"] is False


def test_imported_model_saves_reloads_and_exports_again(imported, tmp_path):
    hf, model, _ = imported("llama-llama3")
    path = seqzoo.save(model, tmp_path / "m.safetensors")
    again = seqzoo.load(path)
    ids = torch.randint(V, (1, T))
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))
    out = seqzoo.to_hf(again, tmp_path / "out")
    reloaded = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        assert (reloaded(ids).logits - hf(ids).logits).abs().max() < 1e-5


def test_to_seqzoo_gives_the_imported_state_dict(imported):
    from safetensors.torch import load_file

    _, model, folder = imported("qwen2")
    converter = seqzoo.registry().get("converter", "qwen2").cls()
    config = json.loads((folder / "config.json").read_text())
    state = converter.to_seqzoo(load_file(folder / "model.safetensors"), config)
    assert sorted(state) == sorted(model.state_dict())
    assert all(torch.equal(state[name], tensor) for name, tensor in model.state_dict().items())


def test_legacy_rope_theta_and_rope_scaling_config_imports(imported, tmp_path):
    hf, _, folder = imported("llama-linear")
    config = json.loads((folder / "config.json").read_text())
    del config["rope_parameters"]
    config.update(rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 2.0})
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_text(json.dumps(config))
    (legacy / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    model = seqzoo.from_hf(legacy)
    assert model.recipe["model"]["position"]["scaling"] == {"kind": "linear", "factor": 2.0}
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < TOL


def test_sharded_checkpoint_imports(tmp_path):
    hf = gpt2().eval()
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    model = seqzoo.from_hf(tmp_path)
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < TOL


def test_dtype_defaults_to_the_stored_weights_and_can_be_chosen(tmp_path):
    gpt2().to(torch.bfloat16).save_pretrained(tmp_path)
    model = seqzoo.from_hf(tmp_path)
    assert model.recipe["runtime"]["dtype"] == "bfloat16" and model.embed.weight.dtype == torch.bfloat16
    model = seqzoo.from_hf(tmp_path, dtype="float32")
    assert model.recipe["runtime"]["dtype"] == "float32" and model.embed.weight.dtype == torch.float32


def test_base_model_checkpoint_without_prefix_imports(tmp_path):
    hf = gpt2().eval()
    hf.transformer.save_pretrained(tmp_path)  # GPT2Model: names without "transformer.", no head
    model = seqzoo.from_hf(tmp_path)
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < TOL


# -- BERT ----------------------------------------------------------------------------------------
def bert(pooler: bool = True):
    config = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=64)
    return transformers.BertModel(config, add_pooling_layer=pooler).eval()


def bert_batch() -> dict:
    ids = torch.randint(3, V, (2, T))
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, 8:] = 0  # right padding, as BERT tokenizers pad
    types = torch.zeros(2, T, dtype=torch.long)
    types[:, 5:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def test_bert_hidden_states_and_pooler_match_transformers(tmp_path):
    hf = bert()
    hf.save_pretrained(tmp_path / "hf")
    model = seqzoo.from_hf(tmp_path / "hf")
    batch = bert_batch()
    with torch.no_grad():
        theirs = hf(**batch)
        hidden = model(**batch)
        pooled = model.pool(hidden)
    assert (hidden - theirs.last_hidden_state).abs().max() < TOL
    assert (pooled - theirs.pooler_output).abs().max() < TOL
    out = seqzoo.to_hf(model, tmp_path / "out")
    again = transformers.BertModel.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        assert (again(**batch).pooler_output - theirs.pooler_output).abs().max() < 1e-5


def test_bert_without_pooler_imports_with_pooler_false(tmp_path):
    hf = bert(pooler=False)
    hf.save_pretrained(tmp_path)
    model = seqzoo.from_hf(tmp_path)
    assert model.recipe["model"]["pooler"] is False
    batch = bert_batch()
    with torch.no_grad():
        assert (model(**batch) - hf(**batch).last_hidden_state).abs().max() < TOL


def test_bert_masked_lm_checkpoint_imports_its_head(tmp_path):
    """The head's own parity tests: tests/test_hf_encoders.py."""
    config = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=64)
    hf = transformers.BertForMaskedLM(config).eval()
    hf.save_pretrained(tmp_path)
    model = seqzoo.from_hf(tmp_path)
    assert model.recipe["model"]["mlm_head"] is not None
    ids = torch.randint(3, V, (2, T))
    with torch.no_grad():
        assert (model.mlm_logits(ids) - hf(ids).logits).abs().max() < TOL


# -- T5 ------------------------------------------------------------------------------------------
def t5(ffn: str, untied: bool):
    config = transformers.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                   num_decoder_layers=2, num_heads=4, feed_forward_proj=ffn,
                                   decoder_start_token_id=0, tie_word_embeddings=ffn == "relu")
    return transformers.T5ForConditionalGeneration(config).eval()


T5_CASES = {
    "v1.0-relu-tied": ("relu", False),            # tied head, scaled by d_model^-1/2
    "v1.1-gated-gelu-untied": ("gated-gelu", True),  # its own head, no scaling
    "v1.0-untied-scaled": ("relu", True),         # own head but scaled: folded into the weight
}


@pytest.mark.parametrize("case", T5_CASES)
def test_t5_logits_generation_and_export_match_transformers(case, tmp_path):
    ffn, untied = T5_CASES[case]
    hf = t5(ffn, untied)
    folder = tmp_path / "hf"
    hf.save_pretrained(folder)
    if untied:  # transformers 5 ties T5 heads when it builds them; a real v1.1 checkpoint has its own
        from safetensors.torch import load_file, save_file

        tensors = load_file(folder / "model.safetensors")
        tensors["lm_head.weight"] = torch.randn(V, 32)
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        hf = transformers.T5ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    model = seqzoo.from_hf(folder)
    assert model.recipe["model"]["tie_embeddings"] is not untied
    src = torch.randint(3, V, (2, 10))
    src_mask = torch.ones(2, 10, dtype=torch.long)
    src_mask[1, 7:] = 0
    tgt = torch.randint(3, V, (2, 6))
    with torch.no_grad():
        theirs = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
        diff = (model(src, tgt, src_mask) - theirs).abs().max().item()
    assert diff < TOL, f"{case}: max |Δ| = {diff:.2e}"
    ours = seqzoo.generate(model, src, 6, attention_mask=src_mask)
    assert ours.tolist() == hf_greedy(hf, src, src_mask, 6).tolist()
    out = seqzoo.to_hf(model, tmp_path / "out")
    again = transformers.T5ForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        exported = again(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    assert (exported - theirs).abs().max() < 1e-5
