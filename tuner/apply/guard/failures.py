"""The kinds of failure the guard sees, and the events it records that are not failures. Each
``events.GuardEvent``'s ``kind`` is one of these, kept as its plain string value (the MLflow
artifact and ``precision-tuner train``'s record are JSON).

Failures, each found by a detector (tuner.apply.guard.detectors) and answered by one trip of the
repair ladder (tuner.apply.guard.ladder):

- ``non_finite_loss``: a step's loss is NaN or inf.
- ``scale_at_floor``: a dynamic loss scale at its floor while updates are still skipped there.
- ``scale_collapsed``: a dynamic loss scale sat at its floor for ``max_skipped`` steps though
  the kept batch's gradients fit float16 well above it.
- ``skipped_updates``: ``max_skipped`` updates in a row skipped by the loss scale.
- ``loss_spike``: a step's loss far above its recent level (``spike_sigmas``).
- ``silent_layer``: a 16-bit layer's output, finite, disagrees with its float32 computation on
  the kept batch beyond any rounding (on half the batch, or at two checks running).
- ``precision_loss``: the kept batch's loss as the model runs and with the same weights in
  float32 are more than 1.25x apart (either way) at two checks running: 16-bit rounding costs
  the model what it could learn (a head far from zero, a stream carrying an offset).
- ``val_non_finite``: an epoch's validation loss is NaN or inf.
- ``float32_gap``: ``float32_check=``'s data, evaluated as the model runs and in float32, more
  than 1.25x apart two epochs running.
- ``repair_worse``: a repaired run (after any repair but a precision one) does worse than the
  run the repair replaced (its median step loss over the 16 steps after the repair beyond
  1.25x the replaced run's): the repair is taken back, and the next time that failure comes
  the ladder tries what it has not tried.

Notices, recorded without a trip:

- ``precision_unreached``: the config's 16-bit dtype reaches (almost) none of the model.
- ``gave_up``: out of repairs with no last resort left; the guard stops the training.
- ``left_as_is``: every repair tried for a failure made the training worse than the failure
  did: it is no longer repaired.
"""

from __future__ import annotations

import enum

# A failure kind is a ``Failure`` or, for a detector defined outside the guard, any string: the
# ladder's generic rungs answer what they recognise, and a rung of its own the rest.


class _Kind(str, enum.Enum):
    """A kind that is its own text: ``str(kind)`` and f-strings give the value (as Python
    3.11's ``StrEnum`` does; written out, because Python 3.10 is in the supported range)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Failure(_Kind):
    NON_FINITE_LOSS = "non_finite_loss"
    SCALE_AT_FLOOR = "scale_at_floor"
    SCALE_COLLAPSED = "scale_collapsed"
    SKIPPED_UPDATES = "skipped_updates"
    LOSS_SPIKE = "loss_spike"
    SILENT_LAYER = "silent_layer"
    PRECISION_LOSS = "precision_loss"
    VAL_NON_FINITE = "val_non_finite"
    FLOAT32_GAP = "float32_gap"
    REPAIR_WORSE = "repair_worse"

    @property
    def of_the_scale(self) -> bool:
        """A failure of the loss scale: the ladder's scale rung answers it."""
        return self in (Failure.SCALE_AT_FLOOR, Failure.SCALE_COLLAPSED,
                        Failure.SKIPPED_UPDATES)

    @property
    def of_precision(self) -> bool:
        """A finite output that 16-bit rounding made wrong: the ladder searches for the
        layers whose float32 brings the output back."""
        return self in (Failure.SILENT_LAYER, Failure.PRECISION_LOSS, Failure.FLOAT32_GAP)


class Notice(_Kind):
    PRECISION_UNREACHED = "precision_unreached"
    GAVE_UP = "gave_up"
    LEFT_AS_IS = "left_as_is"


def of_the_scale(kind: str) -> bool:
    """``Failure.of_the_scale`` for any kind (False for one the guard does not define)."""
    return kind in Failure.__members__.values() and Failure(kind).of_the_scale


def of_precision(kind: str) -> bool:
    return kind in Failure.__members__.values() and Failure(kind).of_precision
