"""ModernBERT parity with transformers: small random ``ModernBertModel`` and
``ModernBertForMaskedLM`` models — 5 heads of 8, a local window (|i − j| ≤ local_attention // 2)
shorter than the 20-token sequence, more layers than one global/local period, randomised norms and
biases — imported with ``seqzoo.from_hf`` give transformers' hidden states and masked-LM logits
within 1e-4 in float32 (a right-padded batch at its real tokens included), and export to folders
transformers loads with the same outputs again."""
from __future__ import annotations

import json

import pytest
import torch

import seqzoo
from seqzoo.builder import layer_plan
from seqzoo.builder.layout import describe_layout
from seqzoo.nn.attention import self_attention_inputs
from seqzoo.testing import parity
from seqzoo.testing.parity import TOL, check_export, check_masked_lm_logits, import_reference, max_difference

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.filterwarnings("ignore:.*no tokenizer written:UserWarning")

V, T = 96, 20
SMALL = dict(vocab_size=V, hidden_size=40, intermediate_size=56, num_hidden_layers=4, num_attention_heads=5,
             max_position_embeddings=64, local_attention=6, global_attn_every_n_layers=3,
             global_rope_theta=1000.0, local_rope_theta=50.0, pad_token_id=0, bos_token_id=1,
             eos_token_id=2, cls_token_id=1, sep_token_id=2, initializer_range=0.2)  # logits far from 0

# name -> config overrides. Windows of 3 or 4 keys each side against 20 tokens; 4 or 6 layers
# against a period of 2 or 3; reference attention eager or sdpa (never flash, which unpads).
CASES = {
    "every-3": {},
    "biases-every-2-sdpa": dict(num_hidden_layers=6, global_attn_every_n_layers=2, local_attention=8,
                                norm_bias=True, attention_bias=True, mlp_bias=True,
                                hidden_activation="gelu_pytorch_tanh", attn_implementation="sdpa"),
    # transformers 5's form: a layer type list (layer 0 local) and rope parameters per type
    "layer-types-rope-parameters": dict(
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 2000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 30.0}}),
    # a legacy rope_scaling applies to both layer types; with the older "type" key transformers
    # keeps rope_type default and ignores the factor, and so does the import
    "legacy-linear-scaling": dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "legacy-type-key": dict(rope_scaling={"type": "linear", "factor": 2.0}),
    # yarn on the global layers only, linear on the local ones
    "scaling-per-type": dict(rope_parameters={
        "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1000.0,
                           "original_max_position_embeddings": 16, "attention_factor": 1.2},
        "sliding_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 50.0,
                              "original_max_position_embeddings": 16}}),
}


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def config(**overrides):
    kw = {"attn_implementation": "eager", **SMALL, **overrides}
    return transformers.ModernBertConfig(**kw)


def right_padded() -> tuple[torch.Tensor, torch.Tensor]:
    """ids (2, T) and their mask, the second row padded after 13 real tokens (as tokenizers pad)."""
    ids = torch.randint(3, V, (2, T))
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, 13:] = 0
    ids[1, 13:] = 0
    return ids, mask


def check_outputs(ours, theirs) -> float:
    """Plain and right-padded outputs (at real tokens) agree; returns the larger max |Δ|."""
    ids, _ = right_padded()
    padded, pmask = right_padded()
    with torch.no_grad():
        plain = max_difference(ours(ids, None), theirs(ids, None))
        pad = max_difference(ours(padded, pmask), theirs(padded, pmask), pmask.bool())
    assert plain < TOL, f"outputs: max |Δ| = {plain:.2e}"
    assert pad < TOL, f"right-padded outputs: max |Δ| = {pad:.2e}"
    return max(plain, pad)


@pytest.mark.parametrize("case", CASES)
def test_modernbert_hidden_states_match_transformers(case, tmp_path):
    pair = import_reference(parity.randomised(transformers.ModernBertModel(config(**CASES[case]))), tmp_path / "hf")
    check_outputs(lambda ids, mask: pair.model(ids, attention_mask=mask),
                  lambda ids, mask: pair.hf(ids, attention_mask=mask).last_hidden_state)
    out = check_export(pair, tmp_path / "out", T, run=lambda model, ids: model(ids).last_hidden_state)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["ModernBertModel"]


HEADS = {
    "default-head": {},
    "head-biases-tanh": dict(classifier_bias=True, norm_bias=True, classifier_activation="gelu_pytorch_tanh"),
    "no-decoder-bias-silu": dict(decoder_bias=False, classifier_activation="silu", num_hidden_layers=6),
}


@pytest.mark.parametrize("case", HEADS)
def test_modernbert_masked_lm_logits_match_transformers(case, tmp_path):
    hf = parity.randomised(transformers.ModernBertForMaskedLM(config(**HEADS[case])))
    pair = import_reference(hf, tmp_path / "hf")
    head = pair.model.recipe["model"]["mlm_head"]
    assert head["bias"] == hf.config.classifier_bias and head["decoder_bias"] == hf.config.decoder_bias
    ids, _ = right_padded()
    padded, mask = right_padded()
    check_masked_lm_logits(pair, {"input_ids": ids})
    check_masked_lm_logits(pair, {"input_ids": padded, "attention_mask": mask})
    out = check_export(pair, tmp_path / "out", T)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["ModernBertForMaskedLM"]


def test_modernbert_recipe_reads_as_intended(tmp_path):
    hf = transformers.ModernBertModel(config(num_hidden_layers=6, local_attention=128,
                                             global_rope_theta=160000.0, local_rope_theta=10000.0))
    pair = import_reference(hf, tmp_path)
    m = pair.model.recipe["model"]
    assert m["pattern"] == ["global", "local", "local"]
    assert m["layer_types"] == {"global": {}, "local": {"attention": {"window": 65}, "position": {"base": 10000.0}}}
    assert m["position"]["base"] == 160000.0 and m["layer_overrides"] == {"0": {"mixer_norm": False}}
    plans = layer_plan(m)
    assert [p.attention.window for p in plans] == [None, 65, 65, None, 65, 65]  # |i − j| ≤ 64
    assert [p.position["base"] for p in plans] == [160000.0, 10000.0, 10000.0] * 2
    assert [p.mixer_norm for p in plans] == [False] + [True] * 5
    blocks = pair.model.encoder.blocks
    assert blocks[0].mixer_norm is None and blocks[1].mixer_norm is not None
    assert m["type_vocab_size"] == 0 and not m["pooler"] and m["embed_norm"] == m["norm"]
    assert m["ffn"]["kind"] == "geglu" and m["ffn"]["approximate"] == "none" and not m["ffn"]["bias"]
    assert describe_layout(m).startswith("layers 0 global (mixer_norm False) · 1-2 local (window 65, rope 10000)")


def test_modernbert_encoder_window_is_symmetric():
    """In a bidirectional stack, window W shows keys j with |i − j| < W (W − 1 on each side)."""
    q_pos = torch.arange(7)[None]
    position = seqzoo.registry().create("position", "none", 8, 8, 1, 16)
    mask = self_attention_inputs(position, q_pos, causal=False, window=3).mask[0, 0]
    i, j = torch.meshgrid(torch.arange(7), torch.arange(7), indexing="ij")
    assert torch.equal(mask, (i - j).abs() < 3)
    causal = self_attention_inputs(position, q_pos, causal=True, window=3).mask[0, 0]
    assert torch.equal(causal, (i - j >= 0) & (i - j < 3))


REFUSED = {
    "embedding_dropout": (dict(embedding_dropout=0.1), r"modernbert embedding_dropout 0\.1 is not supported"),
    "attention_dropout": (dict(attention_dropout=0.1), r"modernbert attention_dropout 0\.1 is not supported"),
    "dynamic-rope": (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
                     r"modernbert rope_type 'dynamic' \(full_attention\) is not supported"),
    "longrope": (dict(rope_parameters={"full_attention": {"rope_type": "longrope", "rope_theta": 1e4}}),
                 r"rope_type 'longrope' is not supported"),
    "layer-type": (dict(layer_types=["full_attention", "chunked_attention", "full_attention", "full_attention"]),
                   r"modernbert layer_types .* is not supported"),
    "head-activation": (dict(classifier_activation="mish"), r"classifier_activation 'mish' has no seqzoo"),
    "untied-decoder": (dict(tie_word_embeddings=False), r"tie_word_embeddings false is not supported"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_modernbert_unsupported_option_is_refused(case, tmp_path):
    """An option seqzoo cannot reproduce fails on import in one line naming it and its value."""
    transformers.ModernBertForMaskedLM(config(num_hidden_layers=1)).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    changes, message = REFUSED[case]
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    with pytest.raises(seqzoo.CheckpointError, match=message) as error:
        seqzoo.from_hf(tmp_path)
    assert "\n" not in str(error.value)


def test_modernbert_classifier_checkpoint_is_refused(tmp_path):
    """A sequence classifier's head is not the masked-LM head: its tensors are reported."""
    hf = transformers.ModernBertForSequenceClassification(config(num_hidden_layers=1, num_labels=3))
    hf.save_pretrained(tmp_path)
    with pytest.raises(seqzoo.CheckpointError, match=r"unexpected tensors: .*classifier\.weight"):
        seqzoo.from_hf(tmp_path)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("layer_overrides", {}, r"layer 0: ModernBERT has an attention norm on every layer but the first"),
    ("dropout", 0.1, r"model\.dropout must be 0"),
    ("placement", "post", r"model\.placement must be pre"),
])
def test_modernbert_export_refuses_what_it_cannot_express(key, value, message, tmp_path):
    transformers.ModernBertModel(config()).save_pretrained(tmp_path / "hf")
    recipe = seqzoo.from_hf(tmp_path / "hf").recipe
    recipe["model"][key] = value
    model = seqzoo.build(recipe, device="cpu")
    with pytest.raises(seqzoo.CheckpointError, match=message):
        seqzoo.to_hf(model, tmp_path / "out", model_type="modernbert")


def test_tiny_modernbert_recipe_exports_as_modernbert(tmp_path):
    """The shipped recipe is ModernBERT's shape: transformers runs the exported folder alike."""
    model = seqzoo.build("tiny-modernbert", device="cpu").eval()
    out = seqzoo.to_hf(model, tmp_path)
    hf = transformers.ModernBertForMaskedLM.from_pretrained(out, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    assert hf.config.layer_types[:3] == ["full_attention", "sliding_attention", "sliding_attention"]
    assert hf.config.local_attention == 8 and hf.config.global_attn_every_n_layers == 3
    ids, mask = right_padded()
    ids = ids % model.vocab_size
    with torch.no_grad():
        diff = max_difference(model(ids, attention_mask=mask, head=True), hf(ids, attention_mask=mask).logits,
                              mask.bool())
    assert diff < TOL, diff


def test_modernbert_stored_decoder_copy_must_equal_the_embedding(tmp_path):
    """Older checkpoints store the tied ``decoder.weight``: used when equal, refused when not."""
    from safetensors.torch import load_file, save_file

    hf = parity.randomised(transformers.ModernBertForMaskedLM(config(num_hidden_layers=1)))
    hf.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["decoder.weight"] = tensors["model.embeddings.tok_embeddings.weight"].clone()
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ids, _ = right_padded()
    with torch.no_grad():
        assert max_difference(seqzoo.from_hf(tmp_path)(ids, head=True), hf(ids).logits) < TOL
    tensors["decoder.weight"] = tensors["decoder.weight"] + 1
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(seqzoo.CheckpointError, match=r"decoder\.weight differs from .*tok_embeddings"):
        seqzoo.from_hf(tmp_path)


@pytest.mark.parametrize("recipe", ["tiny-bert", "tiny-neox", "tiny-gemma2"])  # post, parallel, sandwich
def test_mixer_norm_false_drops_only_the_norm_before_the_mixer(recipe):
    """The per-layer ``mixer_norm: false`` that ModernBERT's layer 0 needs works in every placement."""
    model = seqzoo.build(recipe, ["model.layer_overrides={0: {mixer_norm: false}}"], device="cpu").eval()
    blocks = next(m for m in model.modules() if hasattr(m, "blocks")).blocks
    assert blocks[0].mixer_norm is None and blocks[1].mixer_norm is not None
    assert blocks[0].ffn_norm is not None or blocks[0].residual == "parallel_shared"
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(3, 200, (2, 10)))).all()
