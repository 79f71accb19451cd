"""Converters as data: ``HFConfig`` reads config.json values by type with one-line errors, and a
LLaMA-like family is a short declarative file — a plugin of a dozen lines imports a transformers
checkpoint with the same logits and exports it back, with no code of its own."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

import seqzoo
from seqzoo.io.hf.config import HFConfig
from seqzoo.io.hf.decoder import DecoderConverter, DecoderFamily
from seqzoo.testing import parity

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


# -- the typed reader ----------------------------------------------------------------------------------
@pytest.mark.parametrize("read, key, value, message", [
    ("positive_int", "layers", 0, r"config.json: layers 0 is not supported; it must be a positive integer"),
    ("positive_int", "layers", True, r"layers True is not supported; it must be a positive integer"),
    ("positive_int", "layers", 2.0, r"layers 2.0 is not supported"),
    ("positive_number", "eps", 0, r"eps 0 is not supported; it must be a positive number"),
    ("positive_number", "eps", "1e-5", r"eps '1e-5' is not supported"),
    ("fraction", "partial", 1.5, r"partial 1.5 is not supported; it must be a number in \(0, 1\]"),
    ("fraction", "partial", 0, r"partial 0 is not supported"),
    ("flag", "tied", 1, r"tied 1 is not supported; it must be true or false"),
])
def test_the_reader_refuses_what_seqzoo_cannot_express_in_one_line(read, key, value, message):
    config = HFConfig({key: value})
    with pytest.raises(seqzoo.CheckpointError, match=message):
        getattr(config, read)(key)


def test_the_reader_reads_over_defaults_and_accepts_what_fits():
    c = HFConfig({"layers": 3, "tied": False}, {"layers": 1, "eps": 1e-6, "partial": 0.5, "attn": [0, 2]})
    assert (c.positive_int("layers"), c.positive_number("eps"), c.fraction("partial"), c.flag("tied")) \
        == (3, 1e-6, 0.5, False)
    assert c.layer_indices("attn", 3) == [0, 2]
    with pytest.raises(seqzoo.CheckpointError, match=r"attn \[0, 2\] is not supported; it must list layer "
                                                     r"indices 0..1"):
        c.layer_indices("attn", 2)


# -- a family as data ----------------------------------------------------------------------------------
FAMILY = '''
"""A LLaMA-like family with fixed biases, declared as data only."""
import seqzoo
from seqzoo.io.hf.decoder import LLAMA_DEFAULTS, DecoderConverter, DecoderFamily


class ToyConverter(DecoderConverter):
    """toy_llama: LLaMA with q/k/v biases and none on the output or the MLP."""

    family = DecoderFamily("toy_llama", "LlamaForCausalLM", "Toy", defaults=LLAMA_DEFAULTS,
                           qkv_bias=True, out_bias=False)


@seqzoo.hookimpl
def seqzoo_components():
    return [seqzoo.Component("converter", "toy_llama", ToyConverter)]
'''


def test_a_declared_family_imports_and_exports_like_transformers(tmp_path, fresh):
    fresh()
    plugin = tmp_path / "toy_family.py"
    plugin.write_text(textwrap.dedent(FAMILY))
    seqzoo.load_plugin(plugin)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, attention_bias=True))
    with torch.no_grad():
        for layer in hf.model.layers:  # the family has no output bias: zero it so both mean the same model
            layer.self_attn.o_proj.bias.zero_()
            layer.self_attn.o_proj.bias = None
    hf.config.attention_bias = True
    hf.eval().save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    folder = parity.edited_copy(tmp_path / "hf", tmp_path / "toy", {**config, "model_type": "toy_llama"})
    model = seqzoo.from_hf(folder, device="cpu")
    attention = model.recipe["model"]["attention"]
    assert (attention["bias"], attention["out_bias"]) == (True, False)
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-4, rtol=0)
    out = seqzoo.to_hf(model, tmp_path / "out", model_type="toy_llama")
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == "toy_llama" and "attention_bias" not in written  # the family fixes them


def test_family_data_decides_what_export_accepts():
    class Fixed(DecoderConverter):
        family = DecoderFamily("fixed", "LlamaForCausalLM", "Fixed", qkv_bias=True, out_bias=False,
                               window="sliding_window", window_required=True)

    recipe = seqzoo.build("tiny-llama", ["model.attention.window=8", "model.attention.bias=true",
                                         "model.attention.out_bias=false"], device="meta").recipe
    assert Fixed().accepts(recipe) is None
    assert Fixed.model_type == "fixed" and Fixed.architecture == "LlamaForCausalLM"
    no_window = json.loads(json.dumps(recipe))
    no_window["model"]["attention"]["window"] = None
    assert Fixed().accepts(no_window) == "model.attention.window is null; a family without one fits that model"
    alike = json.loads(json.dumps(recipe))
    alike["model"]["attention"]["out_bias"] = None  # = bias: an output bias too
    assert Fixed().accepts(alike) == "model.attention: Fixed has q/k/v biases and no output bias"
