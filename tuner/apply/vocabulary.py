"""The config's vocabularies as types: the loss-scale kind and the weight update.

Each is a ``str`` enum whose value is what the config file, Optuna, MLflow and the run's
records spell (``"dynamic"``, ``"compensated"``), so a member equals its string and ``str()``
gives it back. Every module asks a member a question below instead of comparing names. Which
optimizer class applies a kind, and how a kind is read back off an optimizer, is stated in
:mod:`tuner.apply.loss_scaling` (TensorFlow side); this module is plain Python.
"""

from __future__ import annotations

import enum


class Vocabulary(str, enum.Enum):
    """A closed set of names as a ``str`` enum (also ``tuner.judging.objective.Objective``)."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every value, in order: what a file or a flag may spell."""
        return tuple(member.value for member in cls)

    @classmethod
    def named(cls, name: object):
        """The member called ``name``; ValueError naming the choices for any other."""
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"invalid choice: {str(name)!r} (choose from "
                             f"{', '.join(repr(n) for n in cls.names())})") from None

    @classmethod
    def coerced(cls, value: object) -> object:
        """The member ``value`` names, or ``value`` as it is when it names none (for the
        config's validation to refuse with its own message)."""
        try:
            return cls(value)
        except (ValueError, TypeError):
            return value

    @property
    def complexity(self) -> int:
        """Its rank among the choices, simplest first (the members' order)."""
        return list(type(self)).index(self)


class LossScaleKind(Vocabulary):
    """How the loss is scaled where compute is float16 (``LossScale.kind``)."""

    NONE = "none"
    DYNAMIC = "dynamic"
    FIXED = "fixed"

    @property
    def complexity(self) -> int:
        """Its rank by simplicity: a dynamic scale is the simple choice, none must earn its
        place with evidence (``tuner.judging.decision.no_loss_scale_evidence``), a fixed one
        is hand-tuned."""
        return (LossScaleKind.DYNAMIC, LossScaleKind.NONE, LossScaleKind.FIXED).index(self)

    @property
    def scales(self) -> bool:
        """Whether the loss is scaled at all (a LossScaleOptimizer wraps the optimizer)."""
        return self is not LossScaleKind.NONE

    @property
    def moves(self) -> bool:
        """Whether the scale backs off and grows (a start, growth steps and a floor): the one
        kind whose scale can collapse."""
        return self is LossScaleKind.DYNAMIC

    @property
    def fixed(self) -> bool:
        """Whether the scale is one set ``value``, always: it neither backs off nor grows."""
        return self is LossScaleKind.FIXED


class WeightUpdate(Vocabulary):
    """How 16-bit weights take their updates (``PrecisionConfig.weight_update``,
    :mod:`tuner.apply.weight_update`); simplest first."""

    NEAREST = "nearest"
    STOCHASTIC = "stochastic"
    COMPENSATED = "compensated"

    @property
    def wraps(self) -> bool:
        """Whether the optimizer's updates are rewritten (anything but Keras's own rounding to
        nearest); only where the weights are 16-bit."""
        return self is not WeightUpdate.NEAREST

    @property
    def rounds_at_random(self) -> bool:
        """Whether a new weight is rounded to a 16-bit neighbour at random (stochastic)."""
        return self is WeightUpdate.STOCHASTIC

    @property
    def keeps_buffers(self) -> bool:
        """Whether each weight keeps a 16-bit buffer of what rounding lost (compensated): more
        training memory."""
        return self is WeightUpdate.COMPENSATED


LOSS_SCALE_KINDS = LossScaleKind.names()
WEIGHT_UPDATES = WeightUpdate.names()
