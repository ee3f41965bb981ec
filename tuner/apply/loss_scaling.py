"""Loss scaling and optimizer epsilon from a ``PrecisionConfig``: the optimizer side of applying
it (the layer side is :mod:`tuner.apply.scope`). TensorFlow/Keras only here and there.

Keras 3's ``LossScaleOptimizer`` has no floor (its scale can decay towards zero) and no fixed
mode; its ``loss_scale_factor`` fails on sparse gradients. The two subclasses below fill those
gaps through the optimizer's own extension point, the handling of non-finite gradients (under
its public name in tuner.apply.keras_internals, which also decides a step over every replica).
"""

from __future__ import annotations

import functools
from typing import Any

import keras

from tuner.apply.config_data import ConfigData
from tuner.apply.keras_internals import LossScaleOptimizerHooks
from tuner.apply.vocabulary import LossScaleKind
from tuner.apply.weight_update import wrap


class ScaleTransitions:
    """The changes the precision guard makes to a loss scale (tuner.apply.guard), kept inside the
    optimizer as Keras keeps its own halving and growth: ``restart`` a dynamic scale at a
    value, ``lower_floor``, ``set_fixed`` a fixed scale, ``try_scale`` (a probe, whose state the
    caller puts back), and the settings a repair may change, read and put back
    (``settings``, ``put_back``). Methods of the project's loss-scale optimizers; for Keras's
    own ``LossScaleOptimizer`` (a model compiled under ``mixed_float16`` with Keras's scale),
    ``transitions(optimizer)`` gives the same calls on its variables."""

    dynamic_scale: Any
    step_counter: Any
    initial_scale: float

    def restart(self, scale: float) -> None:
        """The scale set to ``scale``, counting towards its next growth from zero."""
        self.dynamic_scale.assign(scale)
        self.step_counter.assign(0)

    def lower_floor(self, floor: float, start: float) -> None:
        """A dynamic scale's floor lowered to ``floor`` (Keras's own has none), the scale
        restarted at ``start``."""
        if hasattr(self, "floor"):
            self.floor = floor
        ScaleTransitions.restart(self, start)   # self: Keras's own optimizer too

    def set_fixed(self, scale: float) -> None:
        """A fixed scale set to ``scale`` (what it keeps from here)."""
        self.initial_scale = scale
        ScaleTransitions.restart(self, scale)

    def try_scale(self, scale: float) -> None:
        """The scale set for one probing step; the caller puts the state back after it."""
        self.dynamic_scale.assign(scale)

    def settings(self) -> tuple[float | None, float]:
        """What a repair may change beside the variables: the floor and the initial scale."""
        return getattr(self, "floor", None), float(self.initial_scale)

    def put_back(self, settings: tuple[float | None, float]) -> None:
        floor, self.initial_scale = settings
        if floor is not None:
            self.floor = floor


class _KerasOwn:
    """``ScaleTransitions`` on Keras's own ``LossScaleOptimizer``, which is not the project's:
    the same methods, on its variables."""

    def __init__(self, optimizer) -> None:
        self._optimizer = optimizer

    def __getattr__(self, name: str):
        method = getattr(ScaleTransitions, name, None)
        if not callable(method):
            raise AttributeError(name)
        return functools.partial(method, self._optimizer)


def transitions(optimizer) -> Any:
    """``optimizer``'s ``ScaleTransitions``: its own methods, or Keras's optimizer's."""
    return optimizer if isinstance(optimizer, ScaleTransitions) else _KerasOwn(optimizer)


@keras.saving.register_keras_serializable(package="precision_tuner")
class FlooredLossScaleOptimizer(ScaleTransitions, LossScaleOptimizerHooks):
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

    @classmethod
    def applying(cls, scale, optimizer) -> "FlooredLossScaleOptimizer":
        """``optimizer`` wrapped to apply ``scale`` (a config's dynamic ``LossScale``)."""
        return cls(optimizer, initial_scale=scale.initial_scale,
                   dynamic_growth_steps=scale.growth_steps, floor=scale.floor)

    def on_non_finite_step(self):
        self.step_counter.assign(0)
        halved = keras.ops.multiply(self.dynamic_scale, 0.5)
        self.dynamic_scale.assign(keras.ops.maximum(halved, self.floor))

    def get_config(self):
        config = super().get_config()
        config["floor"] = self.floor
        return config


@keras.saving.register_keras_serializable(package="precision_tuner")
class FixedLossScaleOptimizer(ScaleTransitions, LossScaleOptimizerHooks):
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

    @classmethod
    def applying(cls, scale, optimizer) -> "FixedLossScaleOptimizer":
        """``optimizer`` wrapped to apply ``scale`` (a config's fixed ``LossScale``)."""
        return cls(optimizer, initial_scale=scale.value)

    def on_non_finite_step(self):
        self.step_counter.assign(0)  # skip the step; keep the scale


def wrap_optimizer(cfg: ConfigData, optimizer: keras.optimizers.Optimizer):
    """Apply ``cfg``'s optimizer epsilon and loss scaling to ``optimizer``."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise TypeError("wrap_optimizer expects a plain optimizer, not a LossScaleOptimizer. "
                        f"Received: optimizer={optimizer!r}. Pass the inner optimizer instead.")
    if cfg.epsilon.optimizer is not None:
        if not hasattr(optimizer, "epsilon"):
            raise TypeError(f"the config sets an optimizer epsilon but {type(optimizer).__name__} "
                            "has no `epsilon`. Set epsilon.optimizer to null in the config.")
        optimizer.epsilon = cfg.epsilon.optimizer
    wrap(optimizer, cfg.weight_update)  # stochastic or compensated updates of 16-bit weights
    scale = cfg.loss_scale
    if cfg.compute_dtype == "float16" and scale.kind.scales:
        optimizer = OPTIMIZER_CLASSES[scale.kind].applying(scale, optimizer)
    object.__setattr__(optimizer, _WRAPPED, True)  # bypass Keras's attribute tracking
    return optimizer


# Set on what ``wrap_optimizer`` returns, so that compiling it in ``cfg.scope()`` or by
# ``cfg.compile`` (tuner.apply.compiling) does not wrap it twice.
_WRAPPED = "_precision_tuner_wrapped"


def is_wrapped(optimizer) -> bool:
    """Whether ``optimizer`` is what ``wrap_optimizer`` returned (it carries a config)."""
    return bool(getattr(optimizer, _WRAPPED, False))


# The one statement of which optimizer class applies each scaling kind; loss_scale_kind reads
# it back.
OPTIMIZER_CLASSES: dict[LossScaleKind,
                        type[FlooredLossScaleOptimizer] | type[FixedLossScaleOptimizer]] = {
    LossScaleKind.DYNAMIC: FlooredLossScaleOptimizer,
    LossScaleKind.FIXED: FixedLossScaleOptimizer}


def loss_scale_kind(optimizer) -> LossScaleKind:
    """The kind of loss scaling ``optimizer`` applies: fixed for a FixedLossScaleOptimizer,
    dynamic for any other LossScaleOptimizer (Keras's own included), none otherwise."""
    if isinstance(optimizer, OPTIMIZER_CLASSES[LossScaleKind.FIXED]):
        return LossScaleKind.FIXED
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return LossScaleKind.DYNAMIC
    return LossScaleKind.NONE


def held_optimizers(model) -> dict[str, keras.optimizers.Optimizer]:
    """The optimizers a model holds in its public attributes, by attribute name: ``optimizer``
    (compile's), and those a custom ``compile`` keeps (a GAN's ``d_optimizer``)."""
    return {name: value for name, value in vars(model).items()
            if isinstance(value, keras.optimizers.Optimizer) and not name.startswith("_")}


def optimizer_variables(optimizer) -> list:
    """The optimizer's variables, a LossScaleOptimizer's and its inner optimizer's both."""
    return [variable for owner in (optimizer, getattr(optimizer, "inner_optimizer", None))
            if owner is not None for variable in getattr(owner, "variables", [])]


def scale_tensor(optimizer) -> Any:
    """The loss scale the optimizer applies after a step, as a tensor for a compiled step to
    read (NaN: none)."""
    import tensorflow as tf

    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        if not optimizer.built:   # never applied by this step (compile's, beside a GAN's own)
            return tf.constant(float(optimizer.initial_scale), tf.float32)
        return optimizer.dynamic_scale.value
    factor = getattr(optimizer, "loss_scale_factor", None)
    return tf.constant(float("nan") if factor is None else float(factor), tf.float32)


def current_loss_scale(optimizer) -> float | None:
    """The loss scale the optimizer applies right now (``None`` when there is none)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        if not optimizer.built:
            return float(optimizer.initial_scale)
        return float(keras.ops.convert_to_numpy(optimizer.dynamic_scale))
    factor = getattr(optimizer, "loss_scale_factor", None)
    return float(factor) if factor is not None else None
