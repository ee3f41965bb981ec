"""One trip of the guard moves every failing layer, and nothing else: the residual regressor
(tests/fixtures/tasks/silent_norm.py) under mixed_float16 at the tuner's loss-scale floor (1)
has two kinds of failing layer at once, the norms that output exact zeros and the layers whose
backward pass overflows at the floor. Which layers fail is computed here, independently of the
guard, on the model before training (every update is skipped at the floor, so the weights the
guard trips on are these).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from tuner import PrecisionConfig
from tuner.apply.config import LossScale

ROOT = Path(__file__).resolve().parents[3]
SILENT_NORM = ROOT / "tests" / "fixtures" / "tasks" / "silent_norm.py"
NORMS = {f"norm_{index}" for index in range(4)}
BATCHES = 20   # the guard trips on the 15th skipped update at the floor: enough to see it


def load_task(path: Path = SILENT_NORM):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def at_floor(floor: float = 1.0) -> PrecisionConfig:
    return PrecisionConfig(policy="mixed_float16", loss_scale=LossScale("dynamic", floor=floor))


def _fresh_model(task, config: PrecisionConfig):
    keras.utils.set_random_seed(0)
    keras.backend.clear_session()
    with config.scope():
        return task.build_model()


def _silent(model, layer, x) -> bool:
    """The layer's 16-bit output is exact zeros where its float32 computation on the same
    input is not."""
    single = not isinstance(layer.input, list)
    if not single or not layer.weights:
        return False
    inputs, output = keras.Model(model.input, [layer.input, layer.output])(x)
    if np.any(np.asarray(output, "float32")):
        return False
    policy = layer.dtype_policy
    layer.dtype_policy = keras.DTypePolicy("float32")
    try:
        return bool(np.any(np.asarray(layer(tf.cast(inputs, "float32")))))
    finally:
        layer.dtype_policy = policy


def failing_layers(task, config: PrecisionConfig) -> set[str]:
    """The layers that fail on the task's first batch at the config's floor: those whose
    output is silently zero, and those with a gradient that is not finite with the loss scaled
    by the floor (the scale the guard finds them at)."""
    model = _fresh_model(task, config)
    x, y = task.train_data()
    x, y = x[:task.BATCH_SIZE], y[:task.BATCH_SIZE]
    with tf.GradientTape() as tape:
        prediction = tf.cast(model(x, training=True), "float32")
        loss = tf.reduce_mean(keras.losses.get(task.LOSS)(y[:, None], prediction))
        scaled = loss * config.loss_scale.floor
    gradients = tape.gradient(scaled, model.trainable_variables)
    owner = {id(variable): layer.name for layer in model.layers
             for variable in layer.trainable_variables}
    overflowing = {owner[id(variable)] for variable, gradient in
                   zip(model.trainable_variables, gradients)
                   if not np.isfinite(np.asarray(gradient)).all()}
    silent = {layer.name for layer in model.layers if _silent(model, layer, x)}
    return overflowing | silent


def test_the_failing_layers_are_the_norms_and_the_ones_overflowing_at_the_floor():
    """What the trip must move, as computed here: both kinds, so the next test asks for both."""
    failing = failing_layers(load_task(), at_floor())
    assert NORMS < failing, failing               # the silent norms, and more
    assert failing - NORMS == {"stem", "power_kw"}  # the two whose kernels meet raw units


def test_one_trip_moves_every_failing_layer_and_nothing_else():
    """Mutation caught: the guard's trip stops after the first layer whose backward pass
    overflows (tuner/apply/guard/ladder.py MoveFailingLayers), so the scale is changed instead
    and only the norms move."""
    task, config = load_task(), at_floor()
    failing = failing_layers(task, config)
    model = _fresh_model(task, config)
    model.compile(optimizer=config.wrap_optimizer(task.make_optimizer()), loss=task.LOSS,
                  **config.compile_kwargs())
    watcher = config.guard(verbose=0)
    x, y = task.train_data()
    rows = BATCHES * task.BATCH_SIZE
    model.fit(x[:rows], y[:rows], batch_size=task.BATCH_SIZE, epochs=1, shuffle=False,
              verbose=0, callbacks=[watcher])
    moving = [event for event in watcher.events if event.layers]
    assert len(moving) == 1, [event.line() for event in watcher.events]   # one trip
    assert set(moving[0].layers) == failing     # every failing layer, and nothing else
    assert set(watcher.config.float32.layers) == failing
    assert watcher.config.policy == "mixed_float16"
    assert watcher.config.loss_scale.floor == 1.0   # the layers moved, not the floor lowered
    computing = {layer.name: layer.dtype_policy.name for layer in model.layers
                 if layer.weights}
    assert {name for name, policy in computing.items() if policy == "float32"} == failing
    assert {policy for name, policy in computing.items() if name not in failing} \
        == {"mixed_float16"}
