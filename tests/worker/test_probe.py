"""The task check reports what the search space is fitted to: the optimizer's epsilon."""

import pytest

pytest.importorskip("keras")

from tuner.worker.probe import probe_task  # noqa: E402

TASK = """
import keras, numpy as np
LOSS = "mse"
def build_model():
    inputs = keras.Input(shape=(2,))
    return keras.Model(inputs, keras.layers.Dense(1)(inputs))
def train_data():
    x = np.ones((64, 2), dtype="float32")
    return x, x[:, :1]
"""


@pytest.mark.parametrize("optimizer, has_epsilon", [("SGD(0.01)", False), ("Adam(1e-3)", True),
                                                    ("Lion(1e-4)", False)])
def test_the_task_check_says_whether_the_optimizer_has_an_epsilon(tmp_path, optimizer,
                                                                   has_epsilon):
    path = tmp_path / f"task_{has_epsilon}_{optimizer[:3]}.py"
    path.write_text(TASK + f"def make_optimizer():\n    return keras.optimizers.{optimizer}\n")
    info = probe_task(str(path), steps=2)
    assert info["optimizer"] == {"class": optimizer.split("(")[0], "epsilon": has_epsilon}
