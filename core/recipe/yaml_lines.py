"""YAML with line numbers: ``yaml.safe_load``'s data plus where each key path was written, so
every recipe error can say ``file:line``; nesting is bounded."""
from __future__ import annotations

from typing import Any

import yaml

from ..errors import RecipeError
from ..schema import dotted

MAX_NESTING = 32  # mappings and lists inside each other

Location = tuple[str, int]  # (file, 1-based line)

MERGE_TAG = "tag:yaml.org,2002:merge"  # `<<: *base` — YAML's merge key


def read_yaml(text: str, file: str) -> tuple[Any, dict[tuple, Location]]:
    """Parse ``text`` safely; return the data and the line of every key path (1-based)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None:
            _check_nesting(node, file)
        data = yaml.safe_load(text)
    except RecursionError:
        raise RecipeError(f"{file}:1: nesting too deep to read (limit {MAX_NESTING} levels)") from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark is not None else 1
        problem = error.problem or error.context or "invalid YAML"
        raise RecipeError(f"{file}:{line}: invalid YAML: {problem}") from None
    except yaml.YAMLError as error:
        raise RecipeError(f"{file}:1: invalid YAML: {str(error).splitlines()[0]}") from None
    where: dict[tuple, Location] = {}
    if node is not None:
        _walk(node, (), where, file, {})
    return data, where


def _check_nesting(root: yaml.Node, file: str) -> None:
    """Refuse documents nested deeper than MAX_NESTING (iteratively, and visiting each node once so
    an alias bomb costs no more than its text)."""
    stack, seen = [(root, 1)], set()
    while stack:
        node, depth = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if depth > MAX_NESTING:
            raise RecipeError(f"{file}:{node.start_mark.line + 1}: nested deeper than {MAX_NESTING} "
                              f"levels; a recipe is a few levels of mappings")
        if isinstance(node, yaml.MappingNode):
            stack += [(child, depth + 1) for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            stack += [(child, depth + 1) for child in node.value]


def _walk(node: yaml.Node, path: tuple, where: dict, file: str, seen: dict[int, tuple]) -> None:
    """Record the line of every key path below ``node`` (at ``path``) in ``where``; ``seen`` maps
    each node walked to its path."""
    if id(node) in seen:  # an alias: already mapped, and walking it again could explode
        return
    seen[id(node)] = path
    if isinstance(node, yaml.MappingNode):
        keys: dict[Any, int] = {}
        merged = []
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                merged += value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                continue
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in keys and isinstance(key_node, yaml.ScalarNode):
                raise RecipeError(
                    f"{file}:{line}: {dotted((*path, key))}: duplicate key (first written on line "
                    f"{keys[key]}); keep one"
                )
            keys[key] = line
            child = (*path, _scalar(key_node))
            where[child] = (file, line)
            _walk(value_node, child, where, file, seen)
        # a merged mapping's keys belong to this one; a key written here wins over a merged one, and
        # of several merged mappings PyYAML's data keeps the last one's value, so its line is kept too
        for source in reversed(merged):
            lines: dict[tuple, Location] = {}
            if id(source) in seen:  # `<<: *anchor`: the anchor's lines, moved from where it was written to here
                origin = seen[id(source)]
                lines = {(*path, *key_path[len(origin):]): location for key_path, location in where.items()
                         if key_path[:len(origin)] == origin and len(key_path) > len(origin)}
            else:
                _walk(source, path, lines, file, seen)
            for key_path, location in lines.items():
                where.setdefault(key_path, location)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            where[(*path, index)] = (file, item.start_mark.line + 1)
            _walk(item, (*path, index), where, file, seen)


def _scalar(node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return yaml.SafeLoader("").construct_object(node) if node.tag != "tag:yaml.org,2002:str" else node.value
    return node.value
