"""The guard on a transformer whose attention scores overflow float16 on rare burst windows,
beside the same training unguarded (the failure must show there) and in float32:

a one-block transformer (``keras.layers.MultiHeadAttention``) regresses a window of readings;
about 3% of the windows carry a burst of a few readings a thousand times the rest (a sensor
glitch). On those windows alone the attention scores (q . k, computed in the attention layer's
own ``call``) pass float16's 65504: inf, and NaN out of the softmax. Everything else fits
float16, and float32 trains on the same windows without trouble. Under the guard the training
keeps ``mixed_float16``: few events, each naming the attention layer, and float32's validation
loss reached.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

from tuner import PrecisionConfig
from tuner.apply.config import LossScale

pytestmark = pytest.mark.slow

WINDOW, READINGS = 16, 4
ATTENTION = "attention"
BURST_SHARE = 0.03   # rare: about one window in 33
BURST = 1000.0       # a burst reading's size over a normal one's
KEY_DIM = 8
FLOAT16_MAX = 65504.0


def build_model() -> keras.Model:
    inputs = keras.Input((WINDOW, READINGS))
    h = keras.layers.Dense(16, name="embed")(inputs)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=KEY_DIM, name=ATTENTION)(h, h)
    h = keras.layers.Add(name="residual")([h, attended])
    h = keras.layers.LayerNormalization(name="norm")(h)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(h))


def windows(count: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``count`` windows, their targets, and which windows carry a burst. The target is read
    from the clean readings: a burst is a glitch, not signal."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, WINDOW, READINGS)).astype("float32")
    y = (np.tanh(x[..., 0]).mean(axis=1) + 0.5 * (x[..., 1] * x[..., 2]).mean(axis=1))
    bursts = rng.random(count) < BURST_SHARE
    for index in np.flatnonzero(bursts):
        start = rng.integers(0, WINDOW - 3)
        x[index, start:start + 3] *= BURST
    return x, y.astype("float32")[:, None], bursts


FLOAT16 = PrecisionConfig(policy="mixed_float16", loss_scale=LossScale("dynamic"))
EPOCHS = 6


def _fit(config: PrecisionConfig, *, guard: bool):
    keras.utils.set_random_seed(0)
    keras.backend.clear_session()
    with config.scope():
        model = build_model()
    model.compile(optimizer=config.wrap_optimizer(keras.optimizers.Adam(3e-3)), loss="mse",
                  **config.compile_kwargs())
    # Checks spaced by steps alone: the events asserted do not depend on the machine's load.
    watcher = config.guard(check_budget=None, verbose=0) if guard else None
    x, y, _ = windows(1024, seed=0)
    x_val, y_val, _ = windows(256, seed=1)
    history = model.fit(x, y, batch_size=32, epochs=EPOCHS, shuffle=False, verbose=0,
                        validation_data=(x_val, y_val), callbacks=[watcher] if watcher else [])
    return model, history.history, watcher


@pytest.fixture(scope="module")
def runs():
    return {"float32": _fit(PrecisionConfig(), guard=False),
            "unguarded": _fit(FLOAT16, guard=False),
            "guarded": _fit(FLOAT16, guard=True)}


def test_the_scores_overflow_float16_on_the_burst_windows_only():
    """The failure's premise, checked on the model itself: q . k past 65504 where a window
    carries a burst, finite everywhere else."""
    keras.utils.set_random_seed(0)
    keras.backend.clear_session()
    with FLOAT16.scope():
        model = build_model()
    x, _, bursts = windows(1024, seed=0)
    assert 0.02 <= bursts.mean() <= 0.05
    output = np.asarray(model(x), "float32")[:, 0]
    assert not np.isfinite(output[bursts]).any()
    assert np.isfinite(output[~bursts]).all()
    # Where: the projections fit float16, their product q . k (scaled as the layer scales it,
    # by 1/sqrt(key_dim)) does not, and only on the burst windows.
    attention = model.get_layer(ATTENTION)
    embedded = keras.Model(model.input, model.get_layer("embed").output)(x)
    query, key = (np.asarray(dense(embedded), "float32")
                  for dense in (attention.query_dense, attention.key_dense))
    assert np.isfinite(query).all() and np.isfinite(key).all()
    scores = np.einsum("bqhd,bkhd->bhqk", query / np.sqrt(KEY_DIM), key)
    largest = np.abs(scores).max(axis=(1, 2, 3))
    assert (largest[bursts] > FLOAT16_MAX).all()
    assert (largest[~bursts] < FLOAT16_MAX).all()


def test_float32_trains_and_unguarded_mixed_float16_fails(runs):
    float32 = runs["float32"][1]
    unguarded = runs["unguarded"][1]["val_loss"]
    _, y_val, _ = windows(256, seed=1)
    assert all(math.isfinite(value) for value in float32["val_loss"])
    assert float32["loss"][-1] < 0.5 * float32["loss"][0]
    assert float32["val_loss"][-1] < 0.75 * float(np.var(y_val))   # well past the mean's loss
    assert not (unguarded[-1] <= 1.5 * float32["val_loss"][-1])   # NaN, or clearly worse


def test_the_guard_keeps_mixed_float16_and_names_the_attention_layer(runs):
    float32 = runs["float32"][1]["val_loss"][-1]
    model, history, watcher = runs["guarded"]
    events = watcher.events
    assert 1 <= len(events) <= 2, [event.line() for event in events]
    for event in events:
        assert event.layers, event.line()
        assert all(ATTENTION in path for path in event.layers), event.line()
    assert watcher.config.policy == "mixed_float16"   # not the last resort's float32
    assert watcher.config.float32.layers
    assert all(ATTENTION in path for path in watcher.config.float32.layers)
    assert model.get_layer("embed").compute_dtype == "float16"   # the rest stays 16-bit
    assert all(math.isfinite(value) for value in history["val_loss"])
    assert history["val_loss"][-1] <= 1.5 * float32
