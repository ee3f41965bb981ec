"""Where a diverged trial went non-finite: the first layer whose output was not finite at the
step whose loss was.

The diverged model's weights are already damaged by that step's update, so the trial is
replayed up to just before that step and the forward pass of that step is run with every
layer's output checked. The replay runs on the trial's own model, its training step traced
already, from the state it had before its second step (``StartingState``: host copies taken as
the trial trained), and counts only where it trains to the losses the trial recorded. Otherwise
(a model too large to copy, a replay that drifted: an unseeded TensorFlow op draws on from where
the trial left it) a model is built again from the seed and trained on the same batches, which
traces and compiles the training step a second time: in a quick tune of house_prices, that
second trace was most of the time its diverged trials spent outside training.
"""

from __future__ import annotations

import math
from typing import Any

from tuner.apply.config import PrecisionConfig
from tuner.worker.task.keras_state import reset_keras_state
from tuner.worker.task.task_model import compile_for_trial, one_pass, state_variables
from tuner.worker.trial.memory import tensor_bytes
from tuner.worker.trial.steps import fit_steps

MAX_REPLAY_STEPS = 50       # a later divergence names no layer (a replay longer than the trial)
KEEP_BYTES = 16 * 2**20     # the largest starting state kept on the host for a replay
# How far a replayed loss may be from the one the trial recorded (relative): the same model, step
# and batches in the same process give the same numbers, where nothing but rounding differs.
SAME_LOSS = 1e-5


class StartingState:
    """The trial model's state where a replay starts, copied to the host: its variables before
    the first step (``first``), and its variables and its optimizers' before the second
    (``second``): Keras builds an optimizer inside the first step's trace, its slots initialised
    only as that step runs, so the second step is the earliest with every variable readable.
    Nothing is kept for a model whose state passes ``KEEP_BYTES``. ``callback()`` takes both."""

    def __init__(self) -> None:
        self.first: tuple[list, Any] | None = None
        self.second: tuple[list, Any] | None = None

    def callback(self):
        import keras

        state = self

        class TakeStartingState(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                state.first = _copied(list(self.model.variables))

            def on_train_batch_begin(self, batch, logs=None):
                if batch == 1:
                    state.second = _copied(state_variables(self.model))

        return TakeStartingState()

    def put_back(self, model, step: int) -> bool:
        """Assign the state a replay to ``step`` starts from (before the first step for step 0,
        else before the second); False (nothing assigned) where it was not kept, or the model's
        state has variables made since."""
        kept = self.first if step == 0 else self.second
        variables = list(model.variables) if step == 0 else state_variables(model)
        if kept is None or [id(v) for v in variables] != [id(v) for v in kept[0]]:
            return False
        kept[1].put_back(kept[0])
        return True


def _copied(variables: list) -> tuple[list, Any] | None:
    from tuner.apply.instruments import HostCopy

    if tensor_bytes(variables) > KEEP_BYTES:
        return None
    return variables, HostCopy(variables)


def locate_divergence(task, config: PrecisionConfig, batches, seed: int, step: int, *,
                      model=None, starting: StartingState | None = None,
                      losses: list[float] | None = None) -> str | None:
    """The first layer whose output was non-finite at ``step`` (None past MAX_REPLAY_STEPS, or
    where none was). ``model``, ``starting`` and ``losses`` (the trial's own model, its starting
    state and recorded losses) let the replay reuse the traced step; a model that is given must
    be nobody else's, since it is left trained to ``step``."""
    if step > MAX_REPLAY_STEPS:
        return None
    if model is not None and starting is not None and starting.put_back(model, step):
        with config.scope():
            if _replays(model, batches, step, losses or []):
                return first_non_finite_layer(model, batches[step % len(batches)])
    reset_keras_state(seed)
    with config.scope():
        model = task.build_model()
        compile_for_trial(model, task, config)
        fit_steps(model, batches, step)
        return first_non_finite_layer(model, batches[step % len(batches)])


def _replays(model, batches, step: int, losses: list[float]) -> bool:
    """Train ``model``, put back to before the second step, on to ``step`` again: whether each
    loss is the one the trial recorded for that step (nothing to train for step 0)."""
    import keras

    replayed: list[float] = []

    class Losses(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            replayed.append(float((logs or {}).get("loss", math.nan)))

    if step == 0:
        return True
    fit_steps(model, batches, step - 1, [Losses()], start=1)
    return len(replayed) == step - 1 and len(losses) >= step and all(
        math.isclose(mine, theirs, rel_tol=SAME_LOSS, abs_tol=1e-12)
        for mine, theirs in zip(replayed, losses[1:step]))


def first_non_finite_layer(model, batch) -> str | None:
    """Run the forward pass on ``batch`` eagerly (a training step, for a model without one:
    tuner.worker.task.task_model.one_pass) and name the first layer whose output is not finite."""
    from tuner.apply.instruments import first_non_finite, layer_outputs
    from tuner.apply.layers import hook_layer_calls

    captured: list = []

    def capture(layer, output) -> None:
        captured.extend(layer_outputs(layer, output))

    with hook_layer_calls(after=capture):
        try:
            one_pass(model, batch, training=True)
        except Exception:  # noqa: BLE001 - naming the layer is a courtesy; never fail on it
            pass
    return first_non_finite(captured)
