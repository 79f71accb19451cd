"""The component interfaces (plus tokenizers) that plugins implement.

Every component is constructed by the core as ``Cls(*core_args, **recipe_params)``: the core passes
the structural arguments listed in ``CORE_ARGS`` for its kind, the recipe passes the rest as keyword
arguments, validated beforehand against the constructor's signature and type hints.

Shape legend: B batch, T query length, S key length, H heads, K kv heads, D head dim, C model dim.
The contracts live one concept per module (``part``, ``attention``, ``mixers``, ``feedforward``,
``surgery``, ``data``, ``models``, ``optimization``); import them from here.
"""
from __future__ import annotations

from .attention import (
    DeferredTable,
    FlexScore,
    PositionBias,
    PositionScheme,
    RopeScaling,
    Rotary,
    ScoreFunction,
    distance_table,
)
from .data import IGNORE, Task, Tokenizer, TokenTask
from .feedforward import (
    Activation,
    AuxiliaryLosses,
    FeedForward,
    Norm,
    Router,
    Routing,
    auxiliary_losses,
    auxiliary_statistics,
)
from .mixers import MaskSpec, Mixer, MixerContext, MixerState, RecurrentCell
from .models import DecodeSession, LanguageModel, MaskedLanguageModel, Model
from .optimization import Schedule, TrainedParameters, UpdateRule
from .part import Part
from .surgery import TransferRule

# Constructor arguments the core supplies, per kind, in order. A component's constructor must take
# these first; everything after them is a recipe parameter.
CORE_ARGS: dict[str, tuple[str, ...]] = {
    "score": ("query_dim", "key_dim", "heads"),
    "position": ("dim", "head_dim", "heads", "max_seq_len"),
    "norm": ("dim",),
    "ffn": ("dim",),
    "cell": ("input_size", "hidden_size"),
    "mixer": ("dim",),
    "router": ("dim", "experts", "top_k"),
    "model": ("parts",),  # the builder (seqzoo.builder.Parts) that turns the model's specs into modules
}

# The base class each kind's components must subclass (kinds not listed are unconstrained).
BASES: dict[str, type] = {
    "score": ScoreFunction,
    "position": PositionScheme,
    "norm": Norm,
    "ffn": FeedForward,
    "cell": RecurrentCell,
    "model": Model,
    "tokenizer": Tokenizer,
    "rope_scaling": RopeScaling,
    "activation": Activation,
    "task": Task,
    "mixer": Mixer,
    "router": Router,
    "transfer": TransferRule,
    "optimizer": UpdateRule,
    "schedule": Schedule,
}

__all__ = [
    "Activation", "AuxiliaryLosses", "BASES", "CORE_ARGS", "DecodeSession", "DeferredTable", "FeedForward",
    "FlexScore", "IGNORE", "LanguageModel", "MaskSpec", "MaskedLanguageModel", "Mixer", "MixerContext", "MixerState",
    "Model", "Norm", "Part", "PositionBias", "PositionScheme", "RecurrentCell", "RopeScaling", "Rotary", "Router",
    "Routing", "Schedule", "ScoreFunction", "Task", "TokenTask", "Tokenizer", "TrainedParameters", "TransferRule",
    "UpdateRule", "auxiliary_losses", "auxiliary_statistics", "distance_table",
]
