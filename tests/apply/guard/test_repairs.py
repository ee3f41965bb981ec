"""The guard on the failures it was not built around, each beside the same training without it
(the failure must show there, so each test fails with the guard disabled), each asserting the
outcome (the loss reached, the layers named, the config kept 16-bit), not only an event:

- XLA (``jit_compile=True``, what every GPU gets by default): the overflowing head is named on
  the batch the guard kept outside the compiled step, and the config keeps mixed_float16;
- a silent failure (tests/fixtures/tasks/silent_norm.py: hand-written RMS norms that output exact
  zeros in float16, loss finite, nothing skipped) is found by the per-layer float32 comparison;
  the float32 check's figure is judged, not only logged;
- several layers at once under the tuner's floor (1): one trip moves the four norms and the
  layers whose backward pass overflows there; where that would take most of the model, the
  floor is lowered instead;
- ``float32_check=`` through a real training (a failure no repair can fix, the last resort:
  tests/apply/guard/test_last_resort.py, in the quick tier);
- a healthy mixed_float16 training with a dynamic scale, with and without XLA, is the same bit
  for bit with the guard.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import keras
import numpy as np
import pytest

from tests.apply.guard.test_guard import _digits_model as _healthy_model
from tests.apply.guard.test_one_trip import failing_layers
from tuner import PrecisionConfig
from tuner.apply.config import LossScale
from tuner.apply.guard.precision_loss import Float32CheckWatch

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
NORMS = {f"norm_{index}" for index in range(4)}


def _task(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fit(task, config: PrecisionConfig, *, epochs: int, guard: bool, jit_compile=False,
         **guard_options):
    keras.utils.set_random_seed(0)
    keras.backend.clear_session()
    with config.scope():
        model = task.build_model()
    model.compile(optimizer=config.wrap_optimizer(task.make_optimizer()), loss=task.LOSS,
                  jit_compile=jit_compile, **config.compile_kwargs())
    # Checks spaced by steps alone: the exact events asserted do not depend on the machine's load.
    guard_options.setdefault("check_budget", None)
    watcher = config.guard(**guard_options) if guard else None
    history = model.fit(*task.train_data(), batch_size=task.BATCH_SIZE, epochs=epochs,
                        shuffle=False, verbose=0, validation_data=task.val_data(),
                        callbacks=[watcher] if watcher else [])
    return model, history.history["val_loss"], watcher


def _float16(floor: float) -> PrecisionConfig:
    return PrecisionConfig(policy="mixed_float16", loss_scale=LossScale("dynamic", floor=floor))


# -- XLA ----------------------------------------------------------------------------------------
def test_under_xla_the_head_is_named_and_the_config_keeps_mixed_float16():
    task = _task(ROOT / "examples" / "house_prices.py")
    _, float32, _ = _fit(task, PrecisionConfig(), epochs=30, guard=False, jit_compile=True)
    config = _float16(1e-6)
    _, unguarded, _ = _fit(task, config, epochs=30, guard=False, jit_compile=True)
    model, guarded, watcher = _fit(task, config, epochs=30, guard=True, jit_compile=True)
    assert model.jit_compile is True   # Keras drops XLA silently (op determinism, a layer)
    assert not math.isfinite(unguarded[-1])
    assert guarded[-1] <= 1.5 * float32[-1]
    assert watcher.events[0].layers == ("price",)
    assert "moved price to float32" in watcher.events[0].action
    assert watcher.config.policy == "mixed_float16" and watcher.config.float32.layers == ("price",)
    assert model.get_layer("dense").dtype_policy.name == "mixed_float16"  # the rest stays 16-bit
    assert not getattr(model.train_function, "_precision_guard", False)  # taken off at the end


# -- a silent failure ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def silent():
    task = _task(ROOT / "tests" / "fixtures" / "tasks" / "silent_norm.py")
    runs = {"float32": _fit(task, PrecisionConfig(), epochs=30, guard=False),
            "unguarded": _fit(task, _float16(1e-6), epochs=30, guard=False),
            "guarded": _fit(task, _float16(1e-6), epochs=30, guard=True)}
    return task, runs


def test_a_layer_that_silently_outputs_zeros_is_found_and_moved(silent):
    _, runs = silent
    float32 = runs["float32"][1][-1]
    unguarded_model, unguarded, _ = runs["unguarded"]
    _, guarded, watcher = runs["guarded"]
    assert all(math.isfinite(value) for value in unguarded)  # nothing ever non-finite ...
    assert unguarded[-1] > guarded[-1]                        # ... and it trains worse
    norm = unguarded_model.get_layer("norm_0")
    assert float(np.max(np.abs(norm(unguarded_model.get_layer("stem")(
        silent[0].val_data()[0][:8]))))) == 0.0               # the norm outputs exact zeros
    assert guarded[-1] <= 1.5 * float32
    silent_events = [event for event in watcher.events if event.kind == "silent_layer"]
    assert len(silent_events) == 1 and len(watcher.events) == 1
    assert set(silent_events[0].layers) == NORMS
    assert set(watcher.config.float32.layers) == NORMS
    assert watcher.config.policy == "mixed_float16"


def test_the_float32_check_is_judged_two_epochs_running_beyond_the_allowance():
    """The figure the guard logged and never judged: a gap either way round beyond 1.25x two
    epochs in a row is a trip; one epoch, or a gap inside the allowance, is not."""
    watch = Float32CheckWatch()
    judge = watch.judge
    assert judge(100.0, 110.0) is None and judge(100.0, 120.0) is None  # inside 1.25x
    assert judge(2.9e4, 9.2e5) is None           # the first epoch beyond it: not yet
    assert judge(100.0, 101.0) is None           # back inside: the count starts again
    assert judge(2.9e4, 9.2e5) is None
    assert "two epochs running" in judge(9.2e5, 2.9e4)  # the second running, either way round
    assert judge(float("inf"), 5.0) is None      # counted from zero after a trip
    assert judge(float("inf"), 5.0) is not None


def test_the_float32_check_trips_the_guard_through_a_real_training():
    """``float32_check=`` passed to a training: the kelvin head under mixed_bfloat16 with the
    per-batch checks off (``check_every=None``) is found by the check's data alone."""
    task = _task(ROOT / "tests" / "fixtures" / "tasks" / "kelvin_head.py")
    _, _, watcher = _fit(task, PrecisionConfig("mixed_bfloat16"), epochs=8, guard=True,
                         check_every=None, float32_check=task.val_data())
    kinds = [event.kind for event in watcher.events]
    assert kinds and kinds[0] == "float32_gap", kinds
    assert "kelvin" in watcher.config.float32.layers
    assert all("check_loss_float32" in figures for figures in watcher.history)


# -- several layers at once under the tuner's floor ---------------------------------------------
def test_one_trip_moves_every_failing_layer(silent):
    """Over a whole training, beside float32. Mutation caught (first by the fast
    tests/apply/guard/test_one_trip.py): the trip stops after the first layer whose backward
    pass overflows, so only the norms move."""
    task, runs = silent
    float32 = runs["float32"][1][-1]
    _, unguarded, _ = _fit(task, _float16(1.0), epochs=5, guard=False)
    _, guarded, watcher = _fit(task, _float16(1.0), epochs=30, guard=True)
    assert unguarded[-1] > 10 * float32  # updates skipped at the floor: nothing learned
    assert guarded[-1] <= 1.5 * float32
    # Every failing layer (the silent norms and those whose backward pass overflows at the
    # floor, found independently of the guard) moved in the first trip, and nothing else.
    failing = failing_layers(task, _float16(1.0))
    assert NORMS < failing
    assert set(watcher.events[0].layers) == failing
    assert all(not other.layers for other in watcher.events[1:])  # all moved at once
    assert set(watcher.config.float32.layers) == failing
    assert watcher.config.policy == "mixed_float16"


def test_gradients_that_overflow_at_the_floor_lower_it():
    """House prices in dollars under the tuner's floor (1): every update is skipped there; the
    gradients fit only far below it, and more layers than half the model would have to move."""
    task = _task(ROOT / "examples" / "house_prices.py")
    runs = {guard: _fit(task, _float16(1.0), epochs=2, guard=guard) for guard in (False, True)}
    assert int(runs[False][0].optimizer.iterations.numpy()) == 0
    model, _, watcher = runs[True]
    assert "loss scale floor lowered" in watcher.events[0].action
    assert watcher.config.loss_scale.floor < 1.0 and watcher.config.policy == "mixed_float16"
    assert int(model.optimizer.iterations.numpy()) > 0


# -- a healthy training is untouched, with and without XLA --------------------------------------
@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_healthy_mixed_float16_training_is_the_same_bit_for_bit(jit_compile):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 16)).astype("float32")
    y = (x @ rng.normal(size=16)).astype("float32")
    config = _float16(1.0)
    runs = []
    for guard in (False, True):
        keras.utils.set_random_seed(0)
        keras.backend.clear_session()
        with config.scope():
            model = _healthy_model()
        model.compile(optimizer=config.wrap_optimizer(keras.optimizers.Adam(1e-3)), loss="mse",
                      jit_compile=jit_compile, **config.compile_kwargs())
        assert model.jit_compile is jit_compile   # XLA on where asked: Keras can drop it
        watcher = config.guard(snapshot_every=7, check_every=20, check_budget=None) \
            if guard else None
        history = model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0,
                            validation_data=(x[:256], y[:256]),
                            callbacks=[watcher] if watcher else [])
        runs.append((history.history, model.get_weights(), watcher))
    (plain, plain_weights, _), (guarded, guarded_weights, watcher) = runs
    assert guarded == plain
    assert all(np.array_equal(a, b) for a, b in zip(plain_weights, guarded_weights))
    assert watcher.events == [] and watcher.repairs == 0
