"""``LoopGuard``: the precision guard for a training loop of your own, not ``fit``.

The loop hands the guard its step once, ``train_step(model, optimizer, batch)`` returning the
loss (tuner.apply.own_step), and then calls ``guard.step(batch)`` for every batch and
``guard.end_epoch(val_loss=...)`` after every epoch::

    guard = cfg.loop_guard(model, optimizer, train_step)
    with guard:
        for epoch in range(epochs):
            for batch in data:
                loss = guard.step(batch)
            guard.end_epoch(val_loss=validate(model))

The guard compiles and runs the step itself because its repairs change what a compiled step
is: a layer moved to float32, a loss scale's floor, the last resort are read when a step is
traced, so the step is traced again after each (a ``tf.function`` the loop made would keep
running the old one); and a repair that needs the step at another loss scale (the largest
scale at which the failing batch's gradients fit) runs it on the kept batch. Everything else is
``PrecisionGuard``'s, driven through the same hooks ``fit`` calls: the same detectors, the same
repair ladder, the same events, history, MLflow record and ``config`` with the repairs. A
healthy loop's losses are the step's own: the guard reads them and keeps a reference to the
batch; it changes nothing.
"""

from __future__ import annotations

from typing import Any

import keras

from tuner.apply import own_step
from tuner.apply.config_data import ConfigData
from tuner.apply.guard.callback import PrecisionGuard
from tuner.apply.guard.events import GuardEvent
from tuner.errors import ConfigError

__all__ = ["LoopGuard"]


class LoopGuard:
    """Watch and repair a custom training loop under ``config``.

    ``model``: the model the step trains (built or loaded under ``config.scope()``);
    ``optimizer``: what the step receives, one optimizer or a dict of them by name, each
    wrapped by ``config.wrap_optimizer``; ``train_step(model, optimizer, batch)``: one
    training step, returning its loss or a dict of losses (``"loss"``, ``"*loss"``), plain
    Python (the guard compiles it: ``jit_compile`` as ``model.compile`` takes it, ``"auto"``
    being XLA where Keras would use it); ``epochs``, ``steps_per_epoch``: where known, the
    training's length (a precision failure in its first quarter restarts it from its start;
    without them, in its first epoch). Every other keyword is ``PrecisionGuard``'s
    (``snapshot_every``, ``max_repairs``, ``check_every``, ``verbose``, ...).
    """

    def __init__(self, config: ConfigData, model: keras.Model, optimizer: Any, train_step,
                 *, epochs: int | None = None, steps_per_epoch: int | None = None,
                 jit_compile: bool | str = "auto", **options: Any) -> None:
        if not isinstance(model, keras.Model):
            raise ConfigError(f"LoopGuard watches a keras.Model. Received: model="
                              f"{type(model).__name__}. Pass the model the step trains")
        self.model = model
        self._guard = PrecisionGuard(config, **options)
        own_step.named_optimizers(optimizer)   # refused here, before anything changes
        if not getattr(model, "compiled", False):
            # The step is the loop's; compile only gives the model what a Keras step has
            # around it (its jit_compile, its metrics) and the guard reads.
            own_step.compile_for_step(model, optimizer, jit_compile=jit_compile)
        own_step.install(model, train_step, optimizer)
        self._params = {"epochs": epochs, "steps": steps_per_epoch}
        self._function: Any = None
        self._made_for: Any = None   # the model's train function the compiled step matches
        self._epoch = 0
        self._losses: list[float | None] = []   # this epoch's step losses
        self._begun = self._epoch_open = self._closed = False

    # -- what the guard reports (PrecisionGuard's) --------------------------------------------
    @property
    def config(self) -> ConfigData:
        """The config as applied, with every repair so far (what to train with next time)."""
        return self._guard.config

    @property
    def events(self) -> list[GuardEvent]:
        return self._guard.events

    @property
    def history(self) -> list[dict[str, Any]]:
        return self._guard.history

    @property
    def repairs(self) -> int:
        return self._guard.repairs

    # -- what the loop calls ------------------------------------------------------------------
    def step(self, batch: Any) -> Any:
        """Train one step on ``batch`` (in the structure the step takes), then check it; the
        step's loss as a number (a dict of them where the step returns one). A failure is
        repaired before this returns; out of repairs, ``GuardError``."""
        if self._closed:
            raise ConfigError("this LoopGuard was closed. Make a new one for a new training")
        guard = self._guard
        if not self._begun:
            guard.set_model(self.model)
            guard.set_params(dict(self._params))
            guard.begin_loop()
            self._begun = True
        if not self._epoch_open:
            guard.on_epoch_begin(self._epoch)
            self._epoch_open, self._losses = True, []
        guard.keep(batch)
        logs = {name: _number(value) for name, value in self._compiled()(batch).items()}
        self._losses.append(logs.get("loss"))
        guard.after_step(logs)
        return logs["loss"] if set(logs) == {"loss"} else logs

    def end_epoch(self, val_loss: float | None = None, **figures: float) -> None:
        """After an epoch: its validation loss (checked: non-finite is a failure), and any
        figure of your own to keep in ``history``."""
        if not self._epoch_open:
            return
        losses = [loss for loss in self._losses if loss is not None]
        logs = {"loss": sum(losses) / len(losses) if losses else None,
                "val_loss": None if val_loss is None else _number(val_loss), **figures}
        self._epoch_open = False
        self._guard.on_epoch_end(self._epoch, logs)
        self._epoch += 1

    def close(self) -> None:
        """End the watch: its record to MLflow (where a run is active), and the model's own
        training step back."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._begun and not self.model.stop_training:
                self._guard.on_train_end()   # a guard that gave up closed itself
        finally:
            own_step.uninstall(self.model)

    def __enter__(self) -> LoopGuard:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- the compiled step --------------------------------------------------------------------
    def _compiled(self):
        """The step as Keras would compile it (its ``tf.function``, the model's jit_compile),
        made again whenever the guard made the model's train function again (a retrace after a
        repair: tuner.apply.guard.training.Training.retrace)."""
        import tensorflow as tf

        model = self.model
        if self._function is None or model.train_function is not self._made_for:
            self._made_for = model.train_function
            step = model.train_step
            self._function = step if model.run_eagerly else tf.function(
                step, reduce_retracing=True, jit_compile=model.jit_compile)
        return self._function


def _number(value: Any) -> float:
    return float(keras.ops.convert_to_numpy(value))
