"""What the guard holds of the training it watches (``Training``), shared by its detectors and
its repair ladder: the model, the config as repaired so far, the last snapshot and the start
(kept through the training's early share), the kept batch, one ``ScaleWatch`` per optimizer,
and where the training is; and what is done to it from either side: snapshots taken and
restored, a retrace after a dtype change, the config amended, the loss scale set, the last
resort; and what a repair replaced (``Replaced``), kept so that a repair that leaves the
training worse can be taken back.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import keras

from tuner.apply.config_data import ConfigData
from tuner.apply.guard import cause, readings, scales
from tuner.apply.guard.ledger import StepRow
from tuner.apply.guard.scales import Rescale, ScaleWatch
from tuner.apply.guard.state import BatchKeeper, Snapshot, StateReader
from tuner.apply.guard.watch import Spacing
from tuner.apply.layers import layer_paths
from tuner.apply.loss_scaling import transitions
from tuner.apply.vocabulary import WeightUpdate

# Steps between snapshots where ``snapshot_every`` is left to the guard, and the share of the
# training's time they may take then (spaced further where one costs more).
SNAPSHOT_EVERY = 50
SNAPSHOT_BUDGET = 0.005


class Training:
    """The watched training. ``config``: the config as applied, amended by every repair (what
    ``guard.config`` returns); ``data``: a batch to diagnose on where none was kept yet;
    ``snapshot_every``: steps between snapshots (None: ``SNAPSHOT_EVERY``, or further apart
    where one would take more than ``SNAPSHOT_BUDGET`` of the training's time)."""

    def __init__(self, config: ConfigData, data: Any = None,
                 snapshot_every: int | None = None) -> None:
        self.config = config
        self.data = data
        self.snapshot_every = snapshot_every or SNAPSHOT_EVERY
        self._snapshots = Spacing(self.snapshot_every,
                                  SNAPSHOT_BUDGET if snapshot_every is None else None)
        self.reader: StateReader | None = None   # where the state is read in one call
        self.model: keras.Model | None = None
        self.keeper = BatchKeeper()
        self.snapshot: Snapshot | None = None
        self.start: Snapshot | None = None     # the training's first state, while it is early
        self.snapshot_bytes = 0
        self.scales: list[ScaleWatch] = []     # one per optimizer the model holds
        self.traceable = True                  # False: no call to run the model's layers by
        self.step = 0                          # steps trained in this fit
        self.position = 0                      # steps the weights hold (a restore goes back)
        self.epoch = 0
        self.settled = False   # after the last resort: a float32 training, not watched

    def begin(self, model: keras.Model) -> None:
        self.model = model
        readings.build_optimizer(model)   # so that the first snapshot holds its state
        self.scales = scales.watches(model, self.config.loss_scale.floor)
        self.traceable = readings.traceable(model)
        self.take_snapshot()
        self.start = self.snapshot

    def batch(self) -> Any | None:
        batch = self.keeper.batch()
        return batch if batch is not None else self.data

    @property
    def sixteen_bit(self) -> bool:
        """Is there anything of 16 bits to run layer by layer?"""
        return self.config.compute_dtype != "float32" and self.traceable

    # -- snapshots ---------------------------------------------------------------------------
    def stepped(self, row: StepRow) -> None:
        """The row's steps, as it read them: where the training and its weights are, and what
        each optimizer's loss scale did (read by each watch itself where the row has not)."""
        self.step, self.position = self.step + row.steps, self.position + row.steps
        for index, watch in enumerate(self.scales):
            if index < len(row.iterations):
                watch.stepped(row.steps, row.iterations[index], row.scales[index])
            else:
                watch.stepped(row.steps)

    def take_snapshot(self) -> None:
        started = time.perf_counter()
        snapshot = Snapshot(self.model, self.step, self.reader)
        snapshot.position = self.position
        if snapshot.finite and not any(watch.skipped_run for watch in self.scales):
            self.snapshot = snapshot
            self.snapshot_bytes = snapshot.nbytes
            self._snapshots.ran(self.step, started, time.perf_counter())

    def steps_to_snapshot(self) -> int:
        """Steps from here to the next snapshot by steps (0 where one is due now;
        ``snapshot_every`` where it is due by steps but its cost puts it off)."""
        if self.snapshot is None or not self.snapshot.complete:
            return 0
        left = self.snapshot.step + self.snapshot_every - self.step
        if left > 0:
            return left
        return 0 if self.snapshot_due() else self.snapshot_every

    def snapshot_due(self) -> bool:
        return self.snapshot is None or not self.snapshot.complete \
            or self._snapshots.due(self.step, False, time.perf_counter())

    def restore(self) -> None:
        if self.snapshot is not None:
            self.snapshot.restore(self.model)
            self.position = self.snapshot.position

    def restart_from_start(self) -> None:
        """A precision failure early on: the training so far is thrown away (its weights learned
        to live with the rounding; float32 layers would start from weights fitted to it)."""
        if self.start is not None:
            self.snapshot, self.start = self.start, None

    def retrace(self) -> None:
        """Dtype policies and a loss scale's floor are read when a step is traced."""
        cause.retrace(self.model)
        self.keeper.rewrap()

    # -- the config --------------------------------------------------------------------------
    def amend(self, layers: tuple[str, ...]) -> None:
        placement = self.config.float32
        provenance = dict(self.config.provenance)
        provenance["guard_repairs"] = [*provenance.get("guard_repairs", []), *layers]
        self.config = dataclasses.replace(
            self.config, provenance=provenance,
            float32=dataclasses.replace(placement,
                                        layers=tuple(dict.fromkeys(placement.layers + layers))))

    def set_scale(self, watch: ScaleWatch, scale: float, fixed: bool) -> str:
        """A fixed scale to ``scale``; a dynamic one's floor to ``scale`` and the scale itself
        to where the batch fits (the headroom above the floor). The config keeps the lowest
        each optimizer needed."""
        loss_scale = self.config.loss_scale
        if fixed:
            transitions(watch.optimizer).set_fixed(scale)
            self.config = dataclasses.replace(self.config, loss_scale=dataclasses.replace(
                loss_scale, value=min(scale, loss_scale.value or scale)))
            return (f"{watch.owner()}fixed loss scale lowered to {scale:g} (gradients overflow "
                    "float16 at it)")
        watch.lower_floor(scale, start=scale * 2.0**cause.FLOOR_HEADROOM)
        self.retrace()  # the floor is a constant in the traced step
        self.config = dataclasses.replace(self.config, loss_scale=dataclasses.replace(
            loss_scale, floor=min(scale, loss_scale.floor)))
        return (f"{watch.owner()}loss scale floor lowered to {scale:g} (gradients overflow "
                "float16 at the old floor)")

    def rescale(self, change: Rescale) -> str:
        """Make a loss-scale change a trip decided; what was done, for the event."""
        watch = change.watch
        if change.how == "lower":
            return self.set_scale(watch, change.scale, fixed=not watch.dynamic)
        watch.restart(change.scale)
        return f"{watch.owner()}loss scale reset to {change.scale:g}"

    def fitting_scale(self, watch: ScaleWatch) -> float | None:
        """The largest scale at which the kept batch's gradients fit (once a step)."""
        return watch.fitting_scale(self.model, self.batch(), self.step,
                                   self.config.loss_scale.initial_scale)

    def collapsed(self, watch: ScaleWatch) -> bool:
        """Does the scale sit at its floor needlessly? It does if the batch's gradients fit
        float16 at a scale 2^4 above the floor or more."""
        fitting = self.fitting_scale(watch)
        return fitting is None or fitting >= watch.floor * 2.0**cause.FLOOR_HEADROOM

    # -- the last resort ---------------------------------------------------------------------
    def last_resort_left(self) -> bool:
        return not self.config.weights_16bit and self.config.policy != "float32"

    def last_resort(self, why: str) -> str:
        self.restore()
        cause.whole_model_float32(self.model)
        self.retrace()
        self.settled = True   # float32 from here: nothing of 16 bits is left to watch
        self.config = dataclasses.replace(self.config, policy="float32",
                                          loss_scale=type(self.config.loss_scale)(),
                                          weight_update=WeightUpdate.NEAREST)
        return f"every layer to float32 (last resort: {why})"


class Replaced:
    """What a repair replaced, taken before it: the state (weights, optimizer state, loss
    scales), the config, every layer's dtype policy and each optimizer's floor and fixed scale.
    ``put_back`` returns the training to it: the repair is taken back, the replaced run goes on.
    """

    def __init__(self, training: Training) -> None:
        model = training.model
        assert model is not None   # a repair happens in a training the guard began watching
        self.position = training.position
        self.state = Snapshot(model, training.step, training.reader)
        self.config = training.config
        self.policies = [(member, member.dtype_policy)
                         for member in [model] + [layer for layer, _ in layer_paths(model)]]
        self.floors = [(watch, watch.floor, transitions(watch.optimizer).settings())
                       for watch in training.scales if watch.scaled]

    @property
    def going(self) -> bool:
        """Could the replaced run go on (its state finite)? A broken one is never put back."""
        return self.state.finite

    def put_back(self, training: Training) -> None:
        cause.undo(self.policies)
        for watch, floor, settings in self.floors:
            watch.floor = floor
            transitions(watch.optimizer).put_back(settings)
        self.state.restore(training.model)
        training.config, training.position = self.config, self.position
        training.retrace()
