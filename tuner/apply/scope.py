"""Applying a ``PrecisionConfig`` to Keras: the only part of the config that touches TensorFlow.

``precision_scope(cfg)`` sets the global dtype policy, floatx and epsilon, and gives every layer
that ``cfg.float32`` selects a float32 dtype policy. It yields a :class:`Float32Placer`, whose
``report()`` says which layers each group and each pattern matched; a pattern that matched no
layer gives a warning once the model is built. Which layers a group or a pattern selects, and
the layers' paths, are tuner.apply.layers' (``float32_matches`` answers the same question for a
model that is already built).

Placement uses Keras's own per-layer mechanism: a selected layer gets
``layer.dtype_policy = keras.DTypePolicy("float32")``, and the 16-bit layer that follows it casts
its float inputs back (Keras autocasts a layer's inputs to its compute dtype). ``DTypePolicyMap``
(policies keyed by layer path) cannot do the selecting: groups select by class and attributes,
a layer has a path only once it is built, and ``build_model()`` hands us no model to walk before
its layers build. What the scope must get right is *when* each layer is decided:

- after its constructor has set what we match on (``Dense`` sets ``activation`` after
  ``Layer.__init__`` returns), and before it creates weights (under pure float16/bfloat16 a
  float32 layer needs float32 weights);
- for every layer: those a parent constructs or builds itself (MultiHeadAttention's softmax,
  a wrapper's inner layer, an LSTM's cell), and layers without weights, which Keras marks built
  at construction, so that they never build later.

Hence the two patches of Keras internals that stay, both only while the scope is open.
``Layer.__init__`` is wrapped because it is the one place that sees every layer the user's code
(or a parent layer) constructs: the layer is recorded and its instance's ``build`` (an instance
attribute that Keras itself sets in ``Layer.__new__``) is wrapped, so that the layer is decided
just before it builds and its sublayers just after. That wrapper stays with the layer, so a
subclassed model first called after the scope is placed too. ``Layer.__call__`` is hooked so
that layers without weights are decided before their first (symbolic) call, which keeps a
functional model's symbolic dtypes equal to what runs, and so that a layer called inside a
placed layer is placed. Whatever was constructed in the scope and is still undecided is decided
when the scope ends.

A float32 island must fit any caller. Inside a Keras graph (a functional or Sequential model)
the next layer casts its inputs, but a custom layer's ``call`` (or a subclassed model's) may
mix a sublayer's output with its own 16-bit tensors in raw ops (``x + self.attention(x, x)``),
which TensorFlow refuses across dtypes. So a placed layer hands its float outputs back in the
compute dtype of the layer that owns it, unless that owner is a functional or Sequential model;
a subclassed model that returns such an output unchanged returns the float32 original (a
float32 softmax head keeps its float32 output). The owner is the structural parent, recorded
whenever the scope sees one (a call, a build, the scope's end); the wrapper on the placed
layer's ``call`` is an instance attribute, so it works after the scope too.

Placing a layer places everything inside it (an LSTM's cell computes what the LSTM computes),
and a ``Wrapper`` (``TimeDistributed``) whose inner layer is selected is placed with it: a
wrapper runs its inner layer's ``call`` directly, under its own autocast scope, which would read
the inner layer's float32 weights as 16-bit and skip the cast of its inputs. A layer given an
explicit dtype other than the config's policy keeps what the user (or a parent layer) chose.

``float32.outputs`` (tuner.apply.float32_outputs) wraps each model's ``call`` as it is constructed
and casts its float outputs to float32 only where it is the outermost layer of the call, which
Keras's own call context (its private ``current_call_ctx`` global, the ``entry_layer`` that
``Layer.__call__`` records) tells: nothing else separates the model ``build_model()`` returns from
the models inside it before it is returned (the tuner's worker trains inside the scope).

Past 300 lines: the placement is one mechanism (the two patches, the island, the groups'
selection, the report); its parts only make sense together.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import sys
import warnings
import weakref
from typing import Any, Iterator

import keras

from tuner.apply.compiling import compiling_as_tuned
from tuner.apply.config_data import ConfigData
from tuner.apply.dtype_origins import (
    DtypeOrigin,
    SavedDtypes,
    constructor_dtype,
    origin_of,
    record_origin,
)
from tuner.apply.float32_outputs import cast_outputs_to_float32
from tuner.apply.layers import (
    float_needing_cast,
    hook_layer_calls,
    layer_groups,
    layer_paths,
    matching_patterns,
    prospective_path,
    runs_a_graph,
    sublayers,
)

_FLOAT32 = "float32"


class Float32Placer:
    """Decides which layers compute in float32 under one config, and remembers why.

    Decisions only ever move a layer to float32, so deciding a layer again when more is known
    (its path, once its parent is built) is safe.
    """

    def __init__(self, cfg: ConfigData) -> None:
        self.policy = cfg.policy
        self.groups = tuple(cfg.float32.groups)
        self.patterns = tuple(cfg.float32.layers)
        self.outputs = cfg.float32.outputs and cfg.compute_dtype != _FLOAT32
        self._constructed: list[weakref.ref] = []
        self._explicit: weakref.WeakSet = weakref.WeakSet()
        self._decided: weakref.WeakSet = weakref.WeakSet()
        self._placed: weakref.WeakSet = weakref.WeakSet()
        self._unbuilt: weakref.WeakSet = weakref.WeakSet()   # when the scope ended
        self._matches: dict[tuple[str, str], dict[int, tuple[weakref.ref, str]]] = {}
        self._active: list[keras.layers.Layer] = []  # layers being called or built right now
        self._parents: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._handing_back: weakref.WeakSet = weakref.WeakSet()
        self._returning_originals: weakref.WeakSet = weakref.WeakSet()
        self._originals: dict[int, dict[int, tuple[Any, Any]]] = {}  # per subclassed model
        self._scope_open = True
        self._checked = False

    @property
    def placing(self) -> bool:
        return bool(self.groups or self.patterns or self.outputs)

    # -- plain-data answers ----------------------------------------------------------------
    def report(self) -> dict[str, dict[str, list[str]]]:
        """``{"groups": {group: [path, ...]}, "layers": {pattern: [path, ...]}}``: the layers
        each group and pattern selected so far (a subclassed model's once it is built)."""
        found: dict[str, dict[str, list[str]]] = {
            "groups": {group: [] for group in self.groups},
            "layers": {pattern: [] for pattern in self.patterns}}
        for (kind, key), layers in self._matches.items():
            for ref, path in layers.values():
                layer = ref()
                if layer is not None:
                    found[kind][key].append(layer.path or path)
        return found

    def unmatched_patterns(self) -> list[str]:
        return [pattern for pattern, paths in self.report()["layers"].items() if not paths]

    @staticmethod
    def origin_of(layer: keras.layers.Layer) -> DtypeOrigin:
        """Where ``layer``'s dtype came from (tuner.apply.dtype_origins)."""
        return origin_of(layer)

    # -- what the scope's hooks call -------------------------------------------------------
    def note_origin(self, layer: keras.layers.Layer, origin: DtypeOrigin) -> None:
        record_origin(layer, origin)
        if origin in (DtypeOrigin.CODE, DtypeOrigin.SAVED_KEPT) \
                and getattr(layer.dtype_policy, "name", None) != self.policy:
            self._explicit.add(layer)  # the user (a parent layer, a saved model) chose it

    def constructed(self, layer: keras.layers.Layer, origin: DtypeOrigin) -> None:
        self.note_origin(layer, origin)
        if not self.placing:
            return
        self._constructed.append(weakref.ref(layer))
        self._wrap_build(layer)
        if self.outputs and isinstance(layer, keras.Model):
            cast_outputs_to_float32(layer)

    def _wrap_build(self, layer: keras.layers.Layer) -> None:
        keras_build = layer.build
        placer = self

        @functools.wraps(keras_build)  # keeps Keras's signature and its `_is_default` mark
        def build(*args, **kwargs):
            placer.decide(layer, prospective_path(layer))
            placer._active.append(layer)
            try:
                keras_build(*args, **kwargs)
            finally:
                placer._active.pop()
            placer._after_build(layer)

        object.__setattr__(layer, "build", build)  # bypass Keras's attribute tracking

    @contextlib.contextmanager
    def calling(self, layer: keras.layers.Layer) -> Iterator[None]:
        if layer not in self._decided:
            self.decide(layer, prospective_path(layer))
        self._record_children(layer)
        self._active.append(layer)
        try:
            yield
        finally:
            self._active.pop()

    def close(self) -> None:
        """The scope ends: decide what it constructed; check patterns once all is built."""
        self._scope_open = False
        for ref in self._constructed:
            layer = ref()
            if layer is None:
                continue
            if layer not in self._decided:
                self.decide(layer, layer.path)
            self._record_children(layer)
            if not layer.built:
                self._unbuilt.add(layer)
        self._check_patterns_when_built()

    def place_in_built_model(self, model: keras.Model, layer: keras.layers.Layer,
                             path: str) -> None:
        """Decide ``layer``, at ``path`` in ``model``, which is built and training (the guard
        moves a layer mid-training): nothing is constructed any more and no pattern is left to
        check; every layer's owner is read off the model, so the placed layer hands its
        outputs back in its owner's dtype."""
        self._scope_open = False
        self._checked = True
        for member in [model] + [sublayer for sublayer, _ in layer_paths(model)]:
            self._record_children(member)
        self.decide(layer, path)

    def place_built_model(self, model: keras.Model) -> None:
        """Decide every layer of ``model``, which is built and was not constructed in a scope
        (``cfg.apply(model)``, tuner.apply.existing_model)."""
        self._scope_open = False
        self._checked = True
        members = layer_paths(model)
        for member in [model] + [layer for layer, _ in members]:
            self._record_children(member)
        for member, path in members:
            self.decide(member, path)

    # -- deciding --------------------------------------------------------------------------
    def decide(self, layer: keras.layers.Layer, path: str | None) -> None:
        if isinstance(layer, keras.layers.InputLayer) or layer in self._explicit:
            return
        self._decided.add(layer)
        selectors = self._selectors(layer, path)
        for key in selectors:
            known = self._matches.setdefault(key, {}).get(id(layer))
            known_path = known[1] if known and known[0]() is layer else None
            self._matches[key][id(layer)] = (weakref.ref(layer),
                                             path or known_path or layer.name)
        if selectors or self._inside_placed() or self._wraps_selected(layer):
            self._place_subtree(layer)
            self._hand_back(layer)

    def _selectors(self, layer: keras.layers.Layer, path: str | None) -> list[tuple[str, str]]:
        groups = layer_groups(layer)
        return ([("groups", group) for group in self.groups if group in groups]
                + [("layers", pattern) for pattern in
                   matching_patterns(layer, path, self.patterns)])

    def _inside_placed(self) -> bool:
        return any(parent in self._placed for parent in self._active)

    def _wraps_selected(self, layer: keras.layers.Layer) -> bool:
        inner = getattr(layer, "layer", None)
        return (isinstance(layer, keras.layers.Wrapper) and inner is not None
                and (inner in self._placed or bool(self._selectors(inner, inner.path))))

    def _place_subtree(self, layer: keras.layers.Layer) -> None:
        for member in [layer] + [sub for sub, _ in layer_paths(layer)]:
            if member in self._explicit:
                continue
            if member.dtype_policy.name != _FLOAT32:
                member.dtype_policy = keras.DTypePolicy(_FLOAT32)
                record_origin(member, DtypeOrigin.PLACEMENT)
            self._placed.add(member)

    def _after_build(self, layer: keras.layers.Layer) -> None:
        if layer in self._placed:  # sublayers it created while building follow it
            self._place_subtree(layer)
        self._record_children(layer)
        for sublayer, path in layer_paths(layer):  # paths are known now
            self.decide(sublayer, path)
            self._record_children(sublayer)
        self._unbuilt.discard(layer)
        self._check_patterns_when_built()

    # -- handing float32 results back to the owner's dtype ------------------------------------
    def _record_children(self, parent: keras.layers.Layer) -> None:
        for child in sublayers(parent):
            if child not in self._parents:
                self._parents[child] = parent
                if child in self._placed:
                    self._hand_back(child)

    def _owner_may_return_it(self, layer: keras.layers.Layer) -> None:
        owner = self._parents.get(layer)
        if isinstance(owner, keras.Model) and not runs_a_graph(owner):
            self._return_originals(owner)

    def _hand_back(self, layer: keras.layers.Layer) -> None:
        """Wrap the placed layer's ``call`` so that its float outputs come back in the compute
        dtype of the layer that owns it (see the module docstring)."""
        self._owner_may_return_it(layer)
        if layer in self._handing_back:
            return
        self._handing_back.add(layer)
        keras_call = layer.call
        placer = self

        @functools.wraps(keras_call)  # Keras reads call's signature (training, mask)
        def call(*args, **kwargs):
            output = keras_call(*args, **kwargs)
            owner = placer._parents.get(layer)
            if owner is None or runs_a_graph(owner) or owner in placer._placed:
                return output
            return keras.tree.map_structure(
                lambda value: placer._cast_for(owner, value), output)

        object.__setattr__(layer, "call", call)

    def _cast_for(self, owner: keras.layers.Layer, value: Any) -> Any:
        target = owner.compute_dtype
        if not float_needing_cast(value, target):
            return value
        cast = keras.ops.cast(value, target)
        if owner in self._returning_originals:  # it may return it: give it the original
            self._originals.setdefault(id(owner), {})[id(cast)] = (cast, value)
        return cast

    def _return_originals(self, model: keras.Model) -> None:
        if model in self._returning_originals:
            return
        self._returning_originals.add(model)
        keras_call = model.call
        placer = self

        @functools.wraps(keras_call)
        def call(*args, **kwargs):
            try:
                output = keras_call(*args, **kwargs)
                handed = placer._originals.get(id(model), {})

                def original(value):
                    entry = handed.get(id(value))
                    return entry[1] if entry is not None and entry[0] is value else value

                return keras.tree.map_structure(original, output) if handed else output
            finally:
                placer._originals.pop(id(model), None)

        object.__setattr__(model, "call", call)

    def _check_patterns_when_built(self) -> None:
        # A subclassed model's layers get their paths when it is built, often after the scope.
        if self._checked or self._scope_open or len(self._unbuilt):
            return
        self._checked = True
        layers = [layer for layer in (ref() for ref in self._constructed) if layer is not None]
        known = sorted({layer.name for layer in layers} | {layer.path for layer in layers
                                                           if layer.path})
        for pattern in self.unmatched_patterns():
            close = difflib.get_close_matches(pattern, known, n=3, cutoff=0.4)
            hint = f" Closest layer names: {', '.join(close)}." if close else ""
            warnings.warn(f"float32 layer pattern {pattern!r} matches no layer of the model, so "
                          f"it places nothing.{hint} Fix the pattern (a glob on layer names and "
                          "paths) or remove it from float32.layers.", UserWarning, stacklevel=2)


@contextlib.contextmanager
def precision_scope(cfg: ConfigData) -> Iterator[Float32Placer]:
    previous_policy = keras.config.dtype_policy()
    previous_floatx = keras.config.floatx()
    previous_epsilon = keras.config.epsilon()
    placer = Float32Placer(cfg)
    saved = SavedDtypes()
    original_init = keras.layers.Layer.__init__

    def init(self, *args, **kwargs):
        origin = constructor_dtype(cfg.policy, saved, self, kwargs, sys._getframe(1))
        original_init(self, *args, **kwargs)
        placer.constructed(self, origin)

    try:
        # Pure 16-bit policies also need floatx, so that backend ops default to 16 bits.
        floatx = cfg.compute_dtype if cfg.policy in ("float16", "bfloat16") else "float32"
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(cfg.policy)
        if cfg.epsilon.backend is not None:
            keras.config.set_epsilon(cfg.epsilon.backend)
        # Every scope watches construction: a layer deserialised from a saved model takes the
        # config's policy (tuner.apply.dtype_origins); placing also hooks every layer call.
        keras.layers.Layer.__init__ = init
        # And compile: a model compiled in the scope trains as tuned (tuner.apply.compiling).
        calls = hook_layer_calls(around=placer.calling) if placer.placing \
            else contextlib.nullcontext()
        with compiling_as_tuned(cfg), calls:
            yield placer
        keras.layers.Layer.__init__ = original_init
        if placer.placing:
            placer.close()
    finally:
        keras.layers.Layer.__init__ = original_init
        keras.config.set_dtype_policy(previous_policy)
        keras.config.set_floatx(previous_floatx)
        keras.config.set_epsilon(previous_epsilon)
