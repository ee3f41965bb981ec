"""Applying a ``PrecisionConfig`` to Keras: the only part of the config that touches TensorFlow.

``precision_scope(cfg)`` sets the global dtype policy, floatx and epsilon, and gives the layers
that match ``cfg.float32`` a float32 dtype policy. A layer's policy must be fixed before it
creates its weights (under pure 16-bit policies a float32 layer needs float32 weights), but some
attributes we match on (``Dense(activation="softmax")``) are only set after ``Layer.__init__``
returns. So, inside the scope, a matching layer gets its policy at the first of:
its first call (functional / Sequential models are called symbolically while being built), or
the end of the scope (layers of subclassed models, built later on their first real call).
"""

from __future__ import annotations

import contextlib
import fnmatch
import weakref
from typing import Iterator

import keras

from tuner.config import PrecisionConfig

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


def layer_groups(layer: keras.layers.Layer) -> set[str]:
    """The float32 class groups a layer belongs to (custom layers by their class name)."""
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


def wants_float32(cfg: PrecisionConfig, layer: keras.layers.Layer) -> bool:
    """True when ``cfg`` places this layer in float32 (by group, name or path pattern)."""
    if cfg.float32.groups and layer_groups(layer) & set(cfg.float32.groups):
        return True
    names = [layer.name] + ([layer.path] if getattr(layer, "path", None) else [])
    return any(fnmatch.fnmatchcase(name, pattern)
               for pattern in cfg.float32.layers for name in names)


@contextlib.contextmanager
def hook_layer_calls(before=None, after=None) -> Iterator[None]:
    """Run ``before(layer)`` ahead of, and ``after(layer, output)`` behind, every Keras layer
    call inside the block (the model's own call included); restored on exit."""
    original_call = keras.layers.Layer.__call__

    def call(layer, *args, **kwargs):
        if before is not None:
            before(layer)
        output = original_call(layer, *args, **kwargs)
        if after is not None:
            after(layer, output)
        return output

    keras.layers.Layer.__call__ = call
    try:
        yield
    finally:
        keras.layers.Layer.__call__ = original_call


@contextlib.contextmanager
def precision_scope(cfg: PrecisionConfig) -> Iterator[None]:
    previous_policy = keras.config.dtype_policy()
    previous_floatx = keras.config.floatx()
    previous_epsilon = keras.config.epsilon()
    constructed: list[weakref.ref] = []
    explicit_dtype: weakref.WeakSet = weakref.WeakSet()
    original_init = keras.layers.Layer.__init__

    def place(layer: keras.layers.Layer) -> None:
        if getattr(layer, "_precision_tuner_placed", False) or layer in explicit_dtype:
            return
        if wants_float32(cfg, layer):
            layer.dtype_policy = keras.DTypePolicy("float32")
        # Mark even when not matched: the decision is made once, on complete attributes.
        object.__setattr__(layer, "_precision_tuner_placed", True)

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if kwargs.get("dtype") is not None:
            explicit_dtype.add(self)  # the user (or a parent layer) chose; respect it
        constructed.append(weakref.ref(self))

    def place_before_build(layer: keras.layers.Layer) -> None:
        if not layer.built:
            place(layer)

    placing = bool(cfg.float32.groups or cfg.float32.layers)
    try:
        # Pure 16-bit policies also need floatx, so that backend ops default to 16 bits.
        floatx = cfg.compute_dtype if cfg.policy in ("float16", "bfloat16") else "float32"
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(cfg.policy)
        if cfg.epsilon.backend is not None:
            keras.config.set_epsilon(cfg.epsilon.backend)
        if placing:
            keras.layers.Layer.__init__ = init
        with hook_layer_calls(before=place_before_build if placing else None):
            yield
        for ref in constructed:
            layer = ref()
            if layer is not None and not layer.built:
                place(layer)
    finally:
        keras.layers.Layer.__init__ = original_init
        keras.config.set_dtype_policy(previous_policy)
        keras.config.set_floatx(previous_floatx)
        keras.config.set_epsilon(previous_epsilon)


@keras.saving.register_keras_serializable(package="precision_tuner")
class FlooredLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """A dynamic ``LossScaleOptimizer`` whose scale never drops below ``floor``.

    Keras's own scale halves on every non-finite step and can decay towards zero, after which
    every gradient underflows. Here it stops at ``floor``; the tuner counts a scale that sits at
    the floor as collapsed.
    """

    def __init__(self, inner_optimizer, initial_scale=2.0**15, dynamic_growth_steps=2000,
                 floor=1.0, name=None, **kwargs):
        super().__init__(inner_optimizer, initial_scale=initial_scale,
                         dynamic_growth_steps=dynamic_growth_steps, name=name, **kwargs)
        self.floor = float(floor)

    def _stateful_handle_non_finite_grads(self):
        self.step_counter.assign(0)
        halved = keras.ops.multiply(self.dynamic_scale, 0.5)
        self.dynamic_scale.assign(keras.ops.maximum(halved, self.floor))

    def get_config(self):
        config = super().get_config()
        config["floor"] = self.floor
        return config


@keras.saving.register_keras_serializable(package="precision_tuner")
class FixedLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """A ``LossScaleOptimizer`` whose scale stays at ``initial_scale``: it neither halves nor
    grows, and a step with non-finite gradients is skipped rather than applied.

    Used for ``loss_scale.kind: fixed`` instead of Keras's ``loss_scale_factor``, which divides
    gradients with ``/`` and so fails on sparse ones (an ``Embedding``'s ``IndexedSlices``:
    "unsupported operand type(s) for /"), and applies non-finite gradients to the weights.
    """

    _NEVER = 2**31 - 1  # growth interval: the step counter never gets there

    def __init__(self, inner_optimizer, initial_scale=1024.0, name=None, **kwargs):
        kwargs.pop("dynamic_growth_steps", None)  # present in get_config(); always _NEVER
        super().__init__(inner_optimizer, initial_scale=initial_scale,
                         dynamic_growth_steps=self._NEVER, name=name, **kwargs)

    def _stateful_handle_non_finite_grads(self):
        self.step_counter.assign(0)  # skip the step; keep the scale


def wrap_optimizer(cfg: PrecisionConfig, optimizer: keras.optimizers.Optimizer):
    """Apply ``cfg``'s optimizer epsilon and loss scaling to ``optimizer``."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise TypeError("wrap_optimizer expects a plain optimizer, not a LossScaleOptimizer. "
                        f"Received: optimizer={optimizer!r}. Pass the inner optimizer instead.")
    if cfg.epsilon.optimizer is not None:
        if not hasattr(optimizer, "epsilon"):
            raise TypeError(f"the config sets an optimizer epsilon but {type(optimizer).__name__} "
                            "has no `epsilon`. Set epsilon.optimizer to null in the config.")
        optimizer.epsilon = cfg.epsilon.optimizer
    scale = cfg.loss_scale
    if cfg.compute_dtype != "float16" or scale.kind == "none":
        return optimizer
    if scale.kind == "fixed":
        return FixedLossScaleOptimizer(optimizer, initial_scale=scale.value)
    return FlooredLossScaleOptimizer(optimizer, initial_scale=scale.initial_scale,
                                     dynamic_growth_steps=scale.growth_steps, floor=scale.floor)


def current_loss_scale(optimizer) -> float | None:
    """The loss scale the optimizer applies right now (``None`` when there is none)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        if not optimizer.built:
            return float(optimizer.initial_scale)
        return float(keras.ops.convert_to_numpy(optimizer.dynamic_scale))
    factor = getattr(optimizer, "loss_scale_factor", None)
    return float(factor) if factor is not None else None
