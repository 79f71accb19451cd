"""Hugging Face checkpoints in and out: ``from_hf(folder) -> model``, ``to_hf(model, folder)``.

A Hugging Face folder is ``config.json`` plus ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``), optionally with ``tokenizer.json``. Only safetensors are read:
a folder with nothing but ``pytorch_model.bin`` (pickle) is refused.

One converter per ``model_type``, registered under kind ``converter`` (``plugins/converter/``, or a
third-party plugin), turns the config into an ordinary seqzoo recipe and declares, as a list of
``Rule`` s, how each seqzoo tensor is made from Hugging Face tensors (renamed, transposed, fused) and
back. The same rules serve both directions, so import and export cannot drift apart, and they are
checked before any weight is copied: every missing, unexpected or mis-shaped tensor is reported by its
Hugging Face name in one ``CheckpointError`` — never a partial load.
"""
from .activations import (
    ACTIVATIONS,
    activation_name,
    activation_spec,
    ffn_activation,
    glu_ffn,
    mlp_ffn,
)
from .checks import (
    decoder_problem,
    first_problem,
    kind_of,
    layer_pattern,
    plain_attention_problem,
    uniform_problem,
)
from .convert import TOKENIZER_FILES, converter_for, exporter_for, from_hf, load_converted, supported, to_hf
from .converter import CausalLMConverter, HFConverter, full_recipe, special_ids
from .folder import CONFIG, INDEX, TOKENIZER, WEIGHTS, HFWeights, read_config
from .rules import Rule, copy, fused, fused_per_head, linear, norm, renamed, split, transposed

__all__ = [
    "ACTIVATIONS", "CONFIG", "INDEX", "TOKENIZER", "TOKENIZER_FILES", "WEIGHTS", "CausalLMConverter",
    "HFConverter", "HFWeights", "Rule", "activation_name", "activation_spec", "converter_for", "copy",
    "decoder_problem", "exporter_for", "ffn_activation", "first_problem", "from_hf", "full_recipe", "fused",
    "fused_per_head", "glu_ffn", "kind_of", "layer_pattern", "linear", "load_converted", "mlp_ffn", "norm",
    "plain_attention_problem", "read_config", "renamed", "special_ids", "split", "supported", "to_hf",
    "transposed", "uniform_problem",
]
