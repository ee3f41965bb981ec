"""``PrecisionConfig``: the artifact precision-tuner exports and users apply.

Its data, checks and file format are ``tuner.apply.config_data``'s (re-exported here); this
class adds the calls that apply it to a user's training: ``scope()``
(tuner.apply.scope), ``apply(model)`` for a model already in memory
(tuner.apply.existing_model), ``compile(model, ...)`` (tuner.apply.compiling),
``wrap_optimizer()`` (tuner.apply.loss_scaling) and ``guard()``
(tuner.apply.guard). Those modules take the config as ``ConfigData`` and never import this
one; each is imported when its call is made, so ``from tuner import PrecisionConfig`` imports no
TensorFlow. Its file on disk (JSON or YAML): ``tuner.apply.config_data``.
"""

from __future__ import annotations

from tuner.apply.config_data import (
    FLOAT32_GROUPS,
    POLICIES,
    PURE_POLICIES,
    SCHEMA_VERSION,
    ConfigData,
    Epsilon,
    Float32Placement,
    LossScale,
    compute_dtype_of,
    power_of_two,
)
from tuner.apply.existing_model import apply_to_model

__all__ = ["PrecisionConfig", "LossScale", "Epsilon", "Float32Placement", "ConfigData",
           "POLICIES", "PURE_POLICIES", "FLOAT32_GROUPS", "SCHEMA_VERSION", "compute_dtype_of",
           "power_of_two"]


class PrecisionConfig(ConfigData):
    """A complete precision setting for one model: policy, loss scale, epsilons, float32
    placements and the weight update; ``PrecisionConfig.load(path)`` reads an exported one."""

    def scope(self):
        """Context manager: global policy/floatx/epsilon set, selected layers in float32.

        ``with cfg.scope() as placement:`` -- ``placement.report()`` then gives, as plain data,
        the layers each float32 group and pattern selected; a pattern that selects no layer
        warns once the model is built.
        """
        from tuner.apply.scope import precision_scope

        return precision_scope(self)

    def apply(self, model):
        """This config applied to a model that already exists (loaded or built before the
        scope): every layer in the model's own dtype takes the config's policy, a layer kept in
        another dtype keeps it, and the float32 placements apply. With float32 or a mixed
        policy the model is changed in place and returned (a compiled one retraces on its
        next fit); with a pure 16-bit policy it is rebuilt with 16-bit weights, the weights
        copied over, and the new, uncompiled model is returned. Build or load inside
        ``scope()`` where you can: that needs no copy."""
        return apply_to_model(self, model)

    def wrap_optimizer(self, optimizer):
        """Apply loss scaling and the optimizer epsilon to a Keras optimizer."""
        from tuner.apply.loss_scaling import wrap_optimizer

        return wrap_optimizer(self, optimizer)

    def compile(self, model, optimizer="adam", **kwargs):
        """``model.compile(optimizer=..., **kwargs)`` as this config was tuned: the optimizer
        (an instance or a name) gets the config's loss scale, epsilon and weight update, and
        Keras adds no loss scale of its own. Returns the model. ``model.compile`` inside
        ``scope()`` does the same."""
        from tuner.apply.compiling import compile_model

        return compile_model(self, model, optimizer, **kwargs)

    def guard(self, **options):
        """A ``keras.callbacks.Callback`` that watches the training under this config and
        repairs it when 16-bit training fails: ``model.fit(..., callbacks=[cfg.guard()])``.
        ``guard.events`` says what it did, ``guard.config`` is this config with the repairs.
        Options: see :class:`tuner.apply.guard.callback.PrecisionGuard`."""
        from tuner.apply.guard.callback import PrecisionGuard

        return PrecisionGuard(self, **options)

    def loop_guard(self, model, optimizer, train_step, **options):
        """The guard for a training loop of your own: ``guard.step(batch)`` trains one step
        with ``train_step(model, optimizer, batch)`` and repairs what fails, as ``guard()``
        does in ``fit``. See :class:`tuner.apply.guard.loop.LoopGuard`."""
        from tuner.apply.guard.loop import LoopGuard

        return LoopGuard(self, model, optimizer, train_step, **options)
