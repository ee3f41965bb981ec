"""Every weight-update kind of the default space under XLA (``jit_compile=True``, what Keras
compiles with by default on a GPU), exercised on the CPU: each trains, stays finite, learns,
and takes effect (its losses differ from plain rounding's)."""

import math

import pytest

from tuner.apply.config import LossScale, PrecisionConfig
from tuner.trial_types import TrialOutcome, TrialSpec
from tuner.worker.trial.trial import run_trial

pytestmark = pytest.mark.slow

TASK = """
import keras
import numpy as np

BATCH_SIZE = 32


def build_model():
    inputs = keras.Input(shape=(12,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))


def compile_model(model, wrap_optimizer):
    model.compile(optimizer=wrap_optimizer(keras.optimizers.Adam(1e-3)),
                  loss="sparse_categorical_crossentropy", jit_compile=True)


def train_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 12)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5).astype("int64")
"""


@pytest.mark.parametrize("policy", ["bfloat16", "float16"])
def test_every_weight_update_kind_trains_under_xla(tmp_path, policy):
    path = tmp_path / "xla_task.py"
    path.write_text(TASK)
    scale = LossScale(kind="dynamic") if policy == "float16" else LossScale()
    losses = {}
    for kind in ("nearest", "stochastic", "compensated"):
        config = PrecisionConfig(policy=policy, loss_scale=scale, weight_update=kind)
        spec = TrialSpec(0, str(path), config.to_dict(), 40, 3)
        result = run_trial(spec.to_dict())
        assert result["outcome"] == TrialOutcome.COMPLETED.value, (kind, result.get(
            "failure_message"))
        losses[kind] = result["losses"]
        assert all(math.isfinite(loss) for loss in losses[kind]), kind
        first, last = sum(losses[kind][:5]) / 5, sum(losses[kind][-5:]) / 5
        assert last < first, (kind, first, last)   # it learns
    # The rewritten updates take effect: not plain rounding's losses step for step.
    assert losses["stochastic"] != losses["nearest"]
    assert losses["compensated"] != losses["nearest"]
