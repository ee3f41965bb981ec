"""The loss scales a training applies: one ``ScaleWatch`` per optimizer the model holds
(``model.optimizer``, or a GAN's ``d_optimizer`` and ``g_optimizer``, each with a scale of its
own), counting its applied and skipped updates and reading its scale and floor; its scale
changed through the optimizer's own transitions (tuner.apply.loss_scaling).

Where the guard cannot compute the model's loss itself (a ``train_step`` with losses of its
own, as a GAN's), ``largest_applying_scale`` finds where an optimizer's gradients fit by
running the model's own training step on the kept batch at each scale tried, from the same
state, put back after each: the step applies the optimizer's update only where its gradients
are finite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import keras

from tuner.apply.guard import cause, readings
from tuner.apply.guard.state import Snapshot
from tuner.apply.keras_internals import applied_updates
from tuner.apply.loss_scaling import (
    current_loss_scale,
    held_optimizers,
    loss_scale_kind,
    transitions,
)

KERAS_FLOOR = 2.0**-24   # Keras's own LossScaleOptimizer has no floor: its scale backs off


class ScaleWatch:
    """One optimizer of the training and what its loss scale did. ``name``: the model attribute
    that holds it (``optimizer``, ``d_optimizer``). It owns its counts: the callback tells it
    of steps, epochs and trips (``stepped``, ``epoch_began``, ``resync``), the detectors and the
    ladder only read them, and its floor and scale change through ``lower_floor`` and
    ``restart`` (the optimizer's own transitions)."""

    def __init__(self, name: str, optimizer: keras.optimizers.Optimizer,
                 config_floor: float) -> None:
        self.name, self.optimizer = name, optimizer
        self.floor = float(getattr(optimizer, "floor",
                                   KERAS_FLOOR if self.scaled else config_floor))
        self.iterations = self.read_iterations()
        self.skipped_run = self.skipped_epoch = self.floor_steps = 0
        self.fitted_at = -1   # the step the fitting scale was found at
        self.last_scale: float | None = None   # after the last step read, as its row read it
        self.fitted: float | None = None

    @property
    def scaled(self) -> bool:
        return loss_scale_kind(self.optimizer).scales

    @property
    def dynamic(self) -> bool:
        return loss_scale_kind(self.optimizer).moves

    def scale(self) -> float | None:
        return current_loss_scale(self.optimizer)

    def known_scale(self) -> float:
        """``scale()`` where the optimizer scales (``scaled``): then it always has one."""
        scale = self.scale()
        assert scale is not None, f"{self.name} applies no loss scale"
        return scale

    def read_iterations(self) -> int:
        """Updates applied so far (a skipped step does not count)."""
        return applied_updates(self.optimizer)

    @property
    def applied(self) -> bool:
        """Has the training applied it (built it) yet? Compile's default optimizer, where a
        GAN's train_step applies its own, never is: it is not watched."""
        return self.optimizer.built

    def stepped(self, steps: int, iterations: int | None = None,
                scale: float | None = None) -> None:
        """After ``steps`` training steps: count the updates the loss scale skipped, from what
        the steps' own rows read (the ``iterations`` applied so far, the ``scale`` after them:
        tuner.apply.guard.ledger) or, where they read nothing, from the optimizer (a host
        read). Without a loss scale no update is skipped: nothing is read (a host read a step,
        a third of a millisecond here, on every bfloat16 and float32 training)."""
        if not self.applied or not self.scaled:
            return
        self.last_scale = scale
        if iterations is None:
            iterations = self.read_iterations()
        applied, self.iterations = iterations - self.iterations, iterations
        skipped = max(0, steps - applied)
        self.skipped_epoch += skipped
        self.skipped_run = self.skipped_run + skipped if skipped else 0
        self.floor_steps = self.floor_steps + 1 if self.at_floor() else 0

    def epoch_began(self) -> None:
        self.skipped_epoch = 0

    def resync(self) -> None:
        """After a trip: count from the optimizer's state as the repair left it."""
        self.iterations, self.skipped_run, self.floor_steps = self.read_iterations(), 0, 0
        self.last_scale = None

    def lower_floor(self, floor: float, start: float) -> None:
        """The floor lowered (the optimizer's, where it has one: Keras's own has none, the
        watch keeps it) and the scale restarted at ``start``."""
        self.floor = floor
        transitions(self.optimizer).lower_floor(floor, start)

    def restart(self, scale: float) -> None:
        transitions(self.optimizer).restart(scale)

    def fitting_scale(self, model: keras.Model, batch: Any, step: int,
                      initial_scale: float) -> float | None:
        """The largest scale the batch's gradients fit (``fitting_scale``), once a step."""
        if self.fitted_at != step:
            self.fitted = None if batch is None else fitting_scale(model, batch, self,
                                                                   initial_scale)
            self.fitted_at = step
        return self.fitted

    def at_floor(self) -> bool:
        """Is a dynamic scale at its floor (after the last step read: its row's scale where
        it has one)?"""
        if not self.applied:
            return False
        scale = self.last_scale if self.last_scale is not None else self.scale()
        return scale is not None and self.dynamic and scale <= self.floor

    def owner(self) -> str:
        """How an event names it: nothing for the one ``optimizer``, else its attribute."""
        return "" if self.name == "optimizer" else f"{self.name}: "


@dataclass(frozen=True)
class Rescale:
    """A change to one optimizer's loss scale, decided on the failing state and made after any
    restore (which puts the snapshot's scale back): ``lower`` a dynamic scale's floor, or a
    fixed scale, to ``scale``; or ``restart`` a dynamic scale at ``scale``."""

    watch: ScaleWatch
    how: str        # "lower" or "restart"
    scale: float



def epoch_figures(watches: list[ScaleWatch]) -> dict[str, Any]:
    """Each optimizer's loss scale and skipped steps this epoch (``loss_scale``,
    ``skipped_steps`` for ``model.optimizer``; suffixed by its name for any other)."""
    figures: dict[str, Any] = {"loss_scale": None, "skipped_steps": 0}
    for watch in (watch for watch in watches if watch.applied):
        suffix = "" if watch.name == "optimizer" else f"_{watch.name}"
        figures[f"loss_scale{suffix}"] = watch.scale()
        figures[f"skipped_steps{suffix}"] = watch.skipped_epoch
    return figures


def watches(model: keras.Model, config_floor: float) -> list[ScaleWatch]:
    """A watch for every optimizer the model holds, ``model.optimizer`` first."""
    held = held_optimizers(model)
    names = sorted(held, key=lambda name: (name != "optimizer", name))
    return [ScaleWatch(name, held[name], config_floor) for name in names]


def largest_applying_scale(model: keras.Model, batch: Any, watch: ScaleWatch, low: int,
                           high: int) -> float | None:
    """The largest ``2^e`` for ``low <= e <= high`` at which one step of the model's own
    ``train_step`` on ``batch`` applies ``watch``'s update (``cause.largest_passing``), None
    if none does. Every try starts from the state as it
    was, and that state is put back after."""
    state = Snapshot(model, -1)

    def applies(exponent: int) -> bool:
        transitions(watch.optimizer).try_scale(2.0**exponent)
        before = watch.read_iterations()
        try:
            model.train_step(batch)
            return watch.read_iterations() > before
        finally:
            state.restore(model)

    return cause.largest_passing(applies, low, high)


def exponent(scale: float) -> int:
    return math.floor(math.log2(scale))


def largest_fitting(model: keras.Model, batch: Any, watch: ScaleWatch, low: int,
                    high: int) -> float | None:
    """The largest ``2^e`` (``low <= e <= high``) the batch's gradients fit: by the backward
    pass of the model's compiled loss (``cause``), or where the guard cannot compute the loss
    (a GAN's ``train_step``), by whether a step applies ``watch``'s update."""
    if readings.loss_traceable(model):
        return cause.largest_fitting_scale(model, batch, low, high)
    return largest_applying_scale(model, batch, watch, low, high)


def overflows(model: keras.Model, batch: Any, watch: ScaleWatch, scale: float) -> bool:
    """Do the batch's gradients overflow float16 at ``scale``, with every output finite?"""
    if readings.loss_traceable(model):
        found = cause.probe(model, batch, scale)
        return found.backward is not None and not found.failing_forward
    return largest_applying_scale(model, batch, watch, exponent(scale), exponent(scale)) is None


def fitting_scale(model: keras.Model, batch: Any, watch: ScaleWatch,
                  initial_scale: float) -> float:
    """The largest power-of-two scale from ``watch``'s floor up to ``initial_scale`` at which
    the batch's gradients fit (the floor where none does), on a copy of the state: the probes'
    training-mode passes move statistics."""
    state = Snapshot(model, -1)
    try:
        fitting = largest_fitting(model, batch, watch, exponent(watch.floor),
                                  exponent(initial_scale))
    finally:
        state.restore(model)
    return fitting or watch.floor
