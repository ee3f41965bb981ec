"""A Keras model's layers as a float32 placement sees them: the class groups a layer belongs to
(``layer_groups``), the glob patterns it matches (``matching_patterns``), every layer's path at
any depth (``layer_paths``, Keras's own traversal), which layers each group and pattern selects
in a built model (``float32_matches``), a layer's path from inside its call (``call_path``), and
a hook on every layer call (``hook_layer_calls``: the placement, the diagnostics and the memory
count watch calls through it). tuner.apply.scope places what these select.
"""

from __future__ import annotations

import contextlib
import fnmatch
from typing import Any, Iterator, Sequence

import keras

from tuner.apply.keras_internals import (
    current_name_scope_path,
    direct_sublayers,
    is_functional,
    parent_path,
)

_NORMALIZATION_TYPES = tuple(
    getattr(keras.layers, name) for name in
    ("BatchNormalization", "LayerNormalization", "GroupNormalization", "UnitNormalization",
     "RMSNormalization", "SpectralNormalization")
    if hasattr(keras.layers, name))
_ATTENTION_TYPES = tuple(
    getattr(keras.layers, name) for name in
    ("MultiHeadAttention", "Attention", "AdditiveAttention", "GroupQueryAttention")
    if hasattr(keras.layers, name))
_SOFTMAX_NAMES = ("softmax", "log_softmax")
_FLOAT32 = "float32"


def layer_groups(layer: keras.layers.Layer) -> set[str]:
    """The float32 class groups a layer belongs to (custom layers by their class name).

    A model belongs to none: a model whose class is named after attention is a network, not a
    block to keep in float32 (a pattern can still select a sub-model, and with it its layers).
    """
    if isinstance(layer, keras.Model):
        return set()
    class_name = type(layer).__name__
    groups = set()
    if isinstance(layer, _NORMALIZATION_TYPES) or class_name.endswith(("Normalization", "Norm")):
        groups.add("normalization")
    if isinstance(layer, _ATTENTION_TYPES) or "Attention" in class_name:
        groups.add("attention")
    if isinstance(layer, keras.layers.Embedding):
        groups.add("embedding")
    if isinstance(layer, keras.layers.Softmax) or _activation_name(layer) in _SOFTMAX_NAMES:
        groups.add("softmax")
    return groups


def _activation_name(layer: keras.layers.Layer) -> str | None:
    activation = getattr(layer, "activation", None)
    return getattr(activation, "__name__", None) if callable(activation) else None


def matching_patterns(layer: keras.layers.Layer, path: str | None,
                      patterns: Sequence[str]) -> list[str]:
    """The glob patterns that match the layer's name or its path."""
    names = [layer.name] + ([path] if path and path != layer.name else [])
    return [pattern for pattern in patterns
            if any(fnmatch.fnmatchcase(name, pattern) for name in names)]


def sublayers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    # Keras's own traversal (what Model.layers and summary() use): it also lists the layers a
    # parent created itself (MultiHeadAttention's softmax, Bidirectional's copies).
    return direct_sublayers(layer)


def layer_paths(root: keras.layers.Layer) -> list[tuple[keras.layers.Layer, str]]:
    """Every layer inside ``root`` (input layers aside), depth first, once each, with its path.

    The path is Keras's ``layer.path`` where it has one. Layers without weights never get one
    (Keras sets it when it builds a layer, and those are built at construction), so they get
    the prefix that their siblings' paths show, else their parent's path, before their name.
    """
    found: list[tuple[keras.layers.Layer, str]] = []
    seen: set[int] = set()

    def visit(parent: keras.layers.Layer, parent_path: str) -> None:
        children = sublayers(parent)
        prefix = _children_prefix(children, parent_path)
        for child in children:
            if id(child) in seen:
                continue
            seen.add(id(child))
            path = child.path or (f"{prefix}/{child.name}" if prefix else child.name)
            if not isinstance(child, keras.layers.InputLayer):
                found.append((child, path))
            visit(child, path)

    visit(root, root.path or root.name)
    return found


def _children_prefix(children: list[keras.layers.Layer], parent_path: str) -> str:
    # A functional model's layers are built outside its name scope ("dense", not
    # "model/dense"); a subclassed model's inside it: the siblings with a path tell which.
    for child in children:
        if child.path:
            head, _, tail = child.path.rpartition("/")
            if tail == child.name:
                return head
    return parent_path


def float32_matches(model: keras.layers.Layer, groups: Sequence[str],
                    patterns: Sequence[str] = ()) -> dict[str, Any]:
    """Which layers of a built model each float32 group and each layer pattern selects.

    Plain data, paths in model order: ``{"groups": {group: [path, ...]}, "layers":
    {pattern: [path, ...]}, "all_layers": [path, ...]}``.
    """
    found: dict[str, Any] = {"groups": {group: [] for group in groups},
                             "layers": {pattern: [] for pattern in patterns},
                             "all_layers": []}
    for layer, path in layer_paths(model):
        found["all_layers"].append(path)
        for group in layer_groups(layer) & set(groups):
            found["groups"][group].append(path)
        for pattern in matching_patterns(layer, path, patterns):
            found["layers"][pattern].append(path)
    return found


def call_path(layer: keras.layers.Layer) -> str:
    """The layer's path as ``float32_matches`` names it, from inside or around its call:
    Keras's ``layer.path`` where it has one, else the current name scope plus its name."""
    return prospective_path(layer) or layer.name


def prospective_path(layer: keras.layers.Layer) -> str | None:
    """The path Keras gives ``layer`` when it builds or calls it here: its build wrapper opens
    the layer's name scope under the current one (or under the parent path it already has)."""
    if layer.path:
        return layer.path
    parent = parent_path(layer)
    parent = current_name_scope_path() if parent is None else parent
    return f"{parent}/{layer.name}" if parent else layer.name


def float_needing_cast(value: Any, target: str) -> bool:
    """A float tensor whose dtype is not the float dtype ``target``."""
    dtype = getattr(value, "dtype", None)
    return dtype is not None and keras.backend.is_float_dtype(target) \
        and keras.backend.is_float_dtype(dtype) \
        and keras.backend.standardize_dtype(dtype) != target


def runs_a_graph(layer: keras.layers.Layer) -> bool:
    """A functional or Sequential model: its layers cast their own inputs."""
    return is_functional(layer)


@contextlib.contextmanager
def hook_layer_calls(before=None, after=None, around=None) -> Iterator[None]:
    """Run ``before(layer, args, kwargs)`` ahead of (with the call's arguments, before Keras
    casts them), and ``after(layer, output)`` behind, every Keras layer call inside the block
    (the model's own call included), and the call itself inside the context manager
    ``around(layer)``; restored on exit."""
    original_call = keras.layers.Layer.__call__

    def call(layer, *args, **kwargs):
        if before is not None:
            before(layer, args, kwargs)
        with around(layer) if around is not None else contextlib.nullcontext():
            output = original_call(layer, *args, **kwargs)
        if after is not None:
            after(layer, output)
        return output

    keras.layers.Layer.__call__ = call
    try:
        yield
    finally:
        keras.layers.Layer.__call__ = original_call
