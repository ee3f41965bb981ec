"""The timed training steps every run takes: ``model.fit`` itself, on the run's fixed batches.

``fit_steps`` trains a number of steps with ``model.fit`` on the batches in order (cycled);
``step_recorder`` is the callback that times each step and records its loss, loss scale and
skipped update, and stops a run where the early stop says so (tuner.judging.early_stop: a
non-finite loss, clearly too slow, a sized run measured enough, a time bound reached). Used by
a trial (tuner.worker.trial.trial) and by a live model's later runs (tuner.worker.trial.live).
"""

from __future__ import annotations

import time

from tuner.errors import TaskError
from tuner.judging.early_stop import should_stop
from tuner.judging.sizing import Sizing
from tuner.trial_types import TrialResult, TrialSpec


def fit_steps(model, batches, steps: int, callbacks=(), start: int = 0) -> None:
    """Train up to ``steps`` steps with ``model.fit`` itself, on ``batches`` in order (cycled),
    from batch ``start``.

    ``fit`` hands ``train_step`` each batch in the structure the task's data has (``(x, y)``
    or ``(x, y, sample_weight)``) and runs its compiled train function per step, in one epoch
    (an epoch per step cost 5-6 ms of ``fit``'s own bookkeeping per step here, half a small
    model's step). A callback may stop it early (``model.stop_training``).
    """
    if steps > 0:
        reset_metrics_in_step(model)
        model.fit(batch_dataset(batches, steps, start), epochs=1, steps_per_epoch=steps,
                  shuffle=False, verbose=0, callbacks=list(callbacks))


# Set on a model whose compiled training step resets its metrics first (``reset_metrics_in_step``).
_RESETS_IN_STEP = "_precision_tuner_resets_metrics"
# Set on a model whose compiled step also reports, for each LossScaleOptimizer it holds, the
# updates applied so far and the scale after the step, in its logs: ids of those optimizers.
_REPORTS_IN_STEP = "_precision_tuner_reports"
_UPDATES, _SCALE = "_precision_tuner_updates_{}", "_precision_tuner_scale_{}"


def reset_metrics_in_step(model) -> bool:
    """Make ``model``'s training step reset its metrics before it runs, inside the compiled
    function, so that each step's logged loss is that step's own (what the step recorder reads)
    without an eager reset between steps: ``model.reset_metrics()`` dispatches one op per
    metric variable from Python, 0.2 ms a step for a loss and a metric here, a third of a small
    model's step (house_prices: 0.75 ms), in every run of every trial. Only before the train
    function is first made (``fit`` makes it from ``model.train_step``): a model whose function
    exists already keeps it, and its steps are reset eagerly. Whether it resets in the step.

    The step also logs, for each LossScaleOptimizer the model holds, its applied updates and
    its scale after the step: read with the loss, not by three reads of variables a step
    (0.4 s outside the timed steps of a float16 trial of house_prices, of 1 s inside)."""
    if getattr(model, _RESETS_IN_STEP, False):
        return True
    if getattr(model, "train_function", None) is not None:
        return False
    import keras

    from tuner.apply.keras_internals import updates_counter
    from tuner.apply.loss_scaling import held_optimizers, scale_tensor

    own_step = model.train_step
    scaled = [o for o in held_optimizers(model).values()
              if isinstance(o, keras.optimizers.LossScaleOptimizer)]

    def train_step(data):
        for metric in model.metrics:
            metric.reset_state()
        logs = own_step(data)
        if not isinstance(logs, dict) or not scaled:
            return logs
        reports = {}
        for index, optimizer in enumerate(scaled):
            reports[_UPDATES.format(index)] = updates_counter(optimizer).value
            reports[_SCALE.format(index)] = scale_tensor(optimizer)
        return {**logs, **reports}

    model.train_step = train_step
    setattr(model, _RESETS_IN_STEP, True)
    setattr(model, _REPORTS_IN_STEP, [id(o) for o in scaled])
    return True


def _reported(model, optimizer) -> int | None:
    """The index under which ``model``'s step reports ``optimizer`` in its logs (None: it
    does not)."""
    reports = getattr(model, _REPORTS_IN_STEP, [])
    return reports.index(id(optimizer)) if id(optimizer) in reports else None


def _reset_unless_in_step(model) -> None:
    """Reset ``model``'s metrics now where its compiled step does not
    (``reset_metrics_in_step``)."""
    if not getattr(model, _RESETS_IN_STEP, False):
        model.reset_metrics()


# The batches stacked into one tensor per leaf, per list of batches (the worker's cached
# ``fixed_batches``): stacking them again for every run cost a live model's re-measurement run
# more than its bookkeeping.
_STACKED: dict[int, tuple[list, object]] = {}


def forget_stacked() -> int:
    """Drop every stacked copy: a warm worker of the service serves one job after another,
    and each entry holds a job's batches and their stacked tensors alive (called with
    ``tuner.worker.task.task_loader.forget_tasks`` between jobs). Returns how many."""
    count = len(_STACKED)
    _STACKED.clear()
    return count


def batch_dataset(batches, steps: int, start: int = 0):
    import tensorflow as tf

    # tf.data reads a Python list as one tensor; a list of model inputs is a tuple to it.
    def tuples(structure):
        if isinstance(structure, (list, tuple)):
            return tuple(tuples(part) for part in structure)
        if isinstance(structure, dict):
            return {key: tuples(value) for key, value in structure.items()}
        return structure

    kept = _STACKED.get(id(batches))
    if kept is None or kept[0] is not batches:
        # Data without labels is kept as (x,) batches and fed as x, as fit feeds an array or
        # a dataset of x (a dataset of 1-tuples too, which fit would hand over as (x,)).
        stacked = tf.nest.map_structure(lambda *parts: tf.stack(parts),
                                        *[tuples(batch[0] if len(batch) == 1 else batch)
                                          for batch in batches])
        kept = _STACKED[id(batches)] = (batches, stacked)
    # Without tf.data's autotuning (nothing here to tune: the batches are in memory): its
    # thread held ``fit`` 0.2-0.55 s past the last step of one run in two, as it shut down.
    options = tf.data.Options()
    options.autotune.enabled = False
    return tf.data.Dataset.from_tensor_slices(kept[1]).repeat().skip(start).take(steps) \
        .with_options(options)


def step_recorder(optimizers, spec: TrialSpec, result: TrialResult, traces: bool = True):
    """A callback that times each of ``fit``'s steps and records what the step did.
    ``optimizers``: the model's, named (tuner.worker.task.task_model); ``traces``: the first step
    traces the training step (a model that trained before has it).

    The clock runs from ``on_train_batch_begin`` to ``on_train_batch_end``: ``fit``'s train
    function and its conversion of the step's logs to Python numbers, which waits for the step
    to finish (so the time is the step's, not the time to queue it). Everything recorded here
    (loss scales, optimizer iterations) is read outside that window: from the step's logs, where
    the step reports them (``reset_metrics_in_step``), else from the optimizers. The metrics are
    reset before each step (in it where ``fit_steps`` could), so the logged loss is that step's,
    not a running mean. A sized run (``spec.sizing``) stops once ``tuner.judging.sizing.enough``
    says so.

    Every loss the ``train_step`` returns is recorded (``step_losses``); with more than one
    optimizer, each one's loss scale and skipped steps too (``result.optimizers``), while
    ``result.loss_scales`` keeps the lowest scale of each step and ``result.skipped`` the steps
    any of them skipped: what the verdict's collapse and skip rules read.
    """
    import keras

    sizing = Sizing.from_dict(spec.sizing) if spec.sizing else None
    watched = list(optimizers)

    class StepRecorder(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            _begin_records(result, spec, watched)
            self.reported, self.iterations = _update_counts(self.model, watched)

        def on_train_batch_begin(self, batch, logs=None):
            _reset_unless_in_step(self.model)
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            elapsed_ms = (time.perf_counter() - self.started) * 1000.0
            step = len(result.losses)
            loss = step_losses(logs or {}, result)
            result.step_times_ms.append(elapsed_ms)
            if step == 0 and traces:  # Keras traces (and may compile) it on its first call
                result.trace_s = elapsed_ms / 1000.0
            else:
                result.train_s += elapsed_ms / 1000.0
            self.iterations = _record_scales(result, watched, self.iterations, self.reported,
                                             logs or {}, step)
            if should_stop(result, spec, sizing, step, loss, elapsed_ms):
                self.model.stop_training = True

    return StepRecorder()


def _begin_records(result: TrialResult, spec: TrialSpec, watched: list) -> None:
    """The initial loss scale (the lowest of the optimizers'), and a record for each optimizer
    where there are several."""
    from tuner.apply.loss_scaling import current_loss_scale

    if result.initial_loss_scale is None:
        result.initial_loss_scale = _lowest(current_loss_scale(o) for _, o in watched)
        result.loss_scale_kind = spec.config.get("loss_scale", {}).get("kind", "none")
    if len(watched) > 1 and not result.optimizers:
        result.optimizers = [{"name": name, "initial_loss_scale": current_loss_scale(optimizer),
                              "loss_scales": [], "skipped": []} for name, optimizer in watched]


def _update_counts(model, watched: list) -> tuple[list, list]:
    """For each optimizer, where the step's logs report its counts (an index, or None), and
    how many updates it has applied (None where it cannot skip one).

    Only a LossScaleOptimizer skips updates. Its step counter is read here once, then after
    each step (the count before a step is the one after the previous), from the step's logs
    where the step reports it: reading a variable costs a sync."""
    import keras

    from tuner.apply.keras_internals import applied_updates

    may_skip = [isinstance(o, keras.optimizers.LossScaleOptimizer) for _, o in watched]
    return ([_reported(model, o) if skips else None for (_, o), skips in zip(watched, may_skip)],
            [applied_updates(o) if skips else None for (_, o), skips in zip(watched, may_skip)])


def _record_scales(result: TrialResult, watched: list, iterations: list, reported: list,
                   logs: dict, step: int) -> list:
    """Each optimizer's loss scale after ``step``, and whether it skipped the step (its
    ``iterations`` did not move from ``iterations``: None where it cannot skip), read from the
    step's logs where it reports them (``reported``: each one's index there, or None); the
    updates each has applied after the step."""
    from tuner.apply.keras_internals import applied_updates
    from tuner.apply.loss_scaling import current_loss_scale

    scales, after = [], []
    for (_, optimizer), before, index in zip(watched, iterations, reported):
        if index is not None:
            scales.append(float(logs[_SCALE.format(index)]))
            after.append(int(logs[_UPDATES.format(index)]))
        else:
            scales.append(current_loss_scale(optimizer))
            after.append(None if before is None else applied_updates(optimizer))
    skipped = [before is not None and now == before for before, now in zip(iterations, after)]
    result.loss_scales.append(_lowest(scales))
    if any(skipped):   # a LossScaleOptimizer skipped its update
        result.skipped_steps += 1
        result.skipped.append(step)
    for record, scale, skip in zip(result.optimizers, scales, skipped):
        record["loss_scales"].append(scale)
        if skip:
            record["skipped"].append(step)
    return after


def _lowest(scales) -> float | None:
    known = [scale for scale in scales if scale is not None]
    return min(known) if known else None


def loss_names(logs: dict) -> list[str]:
    """The losses a ``train_step``'s logs hold: ``loss``, and every entry named ``*loss``
    (``d_loss``, ``g_loss``, ``kl_loss``)."""
    return [name for name in logs if name == "loss" or name.endswith("loss")]


def step_losses(logs: dict, result: TrialResult) -> float:
    """Record a step's losses in ``result``; the step's loss for the rules that read one.

    That loss is ``logs["loss"]`` where the ``train_step`` returns one, else the sum of its
    losses (finite only when each is: a GAN's ``d_loss`` and ``g_loss``). Where it returns more
    than ``loss`` alone, each is kept in ``result.loss_terms`` and judged on its own against
    float32's (tuner.judging.terms)."""
    names = loss_names(logs)
    if not names:
        raise TaskError("the model's train_step must return a dict with a 'loss' entry, or "
                        f"entries named '*loss' (d_loss, g_loss). Received keys: {sorted(logs)}. "
                        "Return {'loss': loss, ...}.")
    values = {name: float(logs[name]) for name in names}
    loss = values["loss"] if "loss" in values else sum(values.values())
    result.losses.append(loss)
    if names != ["loss"]:
        for name, value in values.items():
            result.loss_terms.setdefault(name, []).append(value)
    return loss
