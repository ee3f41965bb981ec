"""The README's apply path on a model a user already has, at whichever Keras is installed (``make
test-lowest`` runs it at the declared floors, ``make test`` at the newest): a float32 model saved
to a ``.keras`` file, loaded with ``keras.models.load_model`` inside ``cfg.scope()`` (so it
computes in bfloat16), compiled, and trained for one epoch under ``cfg.guard()``.

The guard's kept batch calls Keras's train function with a list of batches, which it takes
from Keras 3.7 (below the floor, 3.10, it crashed on the first step: "'list' object is not an
iterator"): tuner.apply.keras_internals lists it among the behaviour the project relies on.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

from tuner import PrecisionConfig

BFLOAT16 = PrecisionConfig(policy="mixed_bfloat16")


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    path = tmp_path_factory.mktemp("saved") / "float32.keras"
    model.save(path)
    return path


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 16)).astype("float32")
    return x, (x[:, :4].sum(axis=1) > 0).astype("int64")


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_a_loaded_model_trains_an_epoch_in_bfloat16_under_the_guard(saved_model,
                                                                    steps_per_execution):
    keras.backend.clear_session()
    with BFLOAT16.scope():
        model = keras.models.load_model(saved_model)
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy",
                      steps_per_execution=steps_per_execution)
    assert {layer.compute_dtype for layer in model.layers} == {"bfloat16"}
    guard = BFLOAT16.guard()
    x, y = _data()
    history = model.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False,
                        callbacks=[guard])
    losses = history.history["loss"]
    assert len(losses) == 1 and math.isfinite(float(losses[0]))
    # The guard kept the last batch the step trained on: its wrapper ran Keras's step.
    kept = guard._training.keeper.batch()
    assert kept is not None and tuple(kept[0].shape) == (64, 16)
    assert not guard.events
