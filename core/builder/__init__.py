"""From recipe to modules: ``plan`` resolves a model section's per-layer parts, ``parts`` builds
them with the components of a registry, ``layout`` describes a patterned stack in one line.

This is the layer between the recipes and the modules (``seqzoo.nn``): nn classes receive built
modules and never resolve a spec; models receive a ``Parts`` and ask it for theirs."""
from .parts import STACK_KEYS, Parts, stack_section
from .plan import LayerPlan, check_layers, layer_plan, merge

__all__ = ["STACK_KEYS", "LayerPlan", "Parts", "check_layers", "layer_plan", "merge", "stack_section"]
