"""A config applied under ``tf.distribute.MirroredStrategy`` over two logical CPU devices (set
up in a fresh interpreter, before TensorFlow starts), and a model saved under a config loaded in
a fresh interpreter: what docs/how-to/apply.md says of both.

Under the strategy: the layers take the config's dtype policies, ``wrap_optimizer`` gives a
loss-scale optimizer whose variables are mirrored, a short ``fit`` trains, and a step is
skipped where any replica's gradients overflow (Keras's own scale applies it when only the
first replica's are finite); the guard leaves a healthy training alone, sees a NaN in the data
(the batch kept from the replicas' shares), names the layer whose output overflows and keeps
the policy, and falls back to every layer in float32 when the loss scale keeps collapsing.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

DISTRIBUTED = r'''
import json, math
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras
from tuner import PrecisionConfig, UsageError

cfg = PrecisionConfig.from_dict({"policy": "mixed_float16", "loss_scale": {"kind": "dynamic"},
                                 "float32": {"groups": ["softmax"]}})
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x = rng.normal(size=(1024, 16)).astype("float32")
y = (x[:, :4].sum(axis=1) > 0).astype("int64")
found = {"replicas": strategy.num_replicas_in_sync}


def build(head=None, lr=1e-3, loss="sparse_categorical_crossentropy", config=cfg,
          activation="relu"):
    keras.utils.set_random_seed(0)
    with config.scope(), strategy.scope():
        inputs = keras.Input((16,))
        h = keras.layers.Dense(32, activation=activation)(inputs)
        out = head(h) if head else keras.layers.Softmax()(keras.layers.Dense(2)(h))
        model = keras.Model(inputs, out)
        model.compile(optimizer=config.wrap_optimizer(keras.optimizers.Adam(lr)), loss=loss,
                      **config.compile_kwargs())
    return model


model = build()
found["policies"] = {layer.name: layer.dtype_policy.name for layer in model.layers[1:]}
found["optimizer"] = type(model.optimizer).__name__
found["mirrored"] = type(model.layers[1].kernel.value).__name__
guard = cfg.guard()
history = model.fit(x, y, batch_size=128, epochs=2, verbose=0, callbacks=[guard])
found["healthy"] = {"loss": history.history["loss"], "events": len(guard.events)}

bad = x.copy()
bad[128 * 3] = np.nan     # one row of the fourth batch; no loss scale to skip its update
bfloat16 = PrecisionConfig(policy="mixed_bfloat16")
for guarded in (False, True):
    # No relu, softmax in the Dense layer: the loss then shows the NaN (a relu or a Softmax
    # layer lets a finite loss through while the weights go NaN, unseen by the guard).
    model = build(config=bfloat16, activation=None,
                  head=lambda h: keras.layers.Dense(2, activation="softmax")(h))
    guard = bfloat16.guard(snapshot_every=2, verbose=0)
    model.fit(bad, y, batch_size=128, epochs=1, shuffle=False, verbose=0,
              callbacks=[guard] if guarded else [])
    finite = all(np.isfinite(w).all() for w in model.get_weights())
    found["nan", guarded] = {"finite": bool(finite),
                            "events": [event.to_dict() for event in guard.events]}

targets = (x @ rng.normal(size=16) * 3e4).astype("float32")   # past float16's range
model = build(head=lambda h: keras.layers.Dense(1, name="price")(h), lr=0.1, loss="mse")
guard = cfg.guard(max_repairs=1, verbose=0)
history = model.fit(x, targets, batch_size=128, epochs=12, verbose=0, callbacks=[guard])
found["overflow"] = {"events": [event.to_dict() for event in guard.events],
                     "policy": guard.config.policy,
                     "layers": [layer.dtype_policy.name for layer in model.layers[1:]],
                     "last_loss": history.history["loss"][-1]}

# Keras's LossScaleOptimizer decides from the first replica's gradients alone: a step where
# only the second replica's share overflows is applied, and the weights are NaN.
pair_x = np.array([[0.1] * 4, [3e3] * 4], "float32")
pair_y = np.array([0.0, 3e4], "float32")
for name, wrap in (("keras", keras.optimizers.LossScaleOptimizer), ("ours", cfg.wrap_optimizer)):
    for rows in ((0, 1), (1, 0)):
        keras.utils.set_random_seed(0)
        with cfg.scope(), strategy.scope():
            pair = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            pair.compile(optimizer=wrap(keras.optimizers.SGD(1e-3)), loss="mse")
        pair.fit(pair_x[list(rows)], pair_y[list(rows)], batch_size=2, shuffle=False, verbose=0)
        found["replicas", name, rows[1]] = {
            "finite": bool(all(np.isfinite(w).all() for w in pair.get_weights())),
            "applied": int(pair.optimizer.iterations.numpy())}

# House prices in dollars (examples/house_prices.py): the head's output passes float16's
# range; the guard keeps the whole batch from the replicas' shares and names the layer.
# 20 epochs: trained to where float32's loss flattens. The repair restores the last snapshot,
# which the guard spaces by its cost (steps 354 idle, 307 under load): at 12 epochs, still
# halving each epoch, the steps lost alone put the guarded run 1.2x-2.5x float32's loss.
import importlib.util
spec = importlib.util.spec_from_file_location("house_prices", "HOUSE_PRICES")
house = importlib.util.module_from_spec(spec)
spec.loader.exec_module(house)
floored = PrecisionConfig.from_dict({"policy": "mixed_float16",
                                     "loss_scale": {"kind": "dynamic", "floor": 1e-6}})
for run, config, guarded in (("float32", PrecisionConfig(), False),
                             ("unguarded", floored, False), ("guarded", floored, True)):
    keras.utils.set_random_seed(0)
    with config.scope(), strategy.scope():
        model = house.build_model()
        model.compile(optimizer=config.wrap_optimizer(house.make_optimizer()), loss=house.LOSS,
                      **config.compile_kwargs())
    guard = config.guard(verbose=0)
    history = model.fit(*house.train_data(), batch_size=house.BATCH_SIZE, epochs=20,
                        shuffle=False, verbose=0, validation_data=house.val_data(),
                        callbacks=[guard] if guarded else [])
    found["house", run] = {"val_loss": history.history["val_loss"][-1],
                           "events": [event.to_dict() for event in guard.events],
                           "policy": guard.config.policy,
                           "float32": list(guard.config.float32.layers),
                           "dense": model.layers[-2].dtype_policy.name}
print("FOUND " + json.dumps({str(k): v for k, v in found.items()}, default=str))
'''


def _run(script: str, cwd) -> dict:
    script = script.replace("HOUSE_PRICES", str(ROOT / "examples" / "house_prices.py"))
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True,
                          text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    line = [line for line in done.stdout.splitlines() if line.startswith("FOUND ")][-1]
    return json.loads(line[len("FOUND "):])


@pytest.fixture(scope="module")
def distributed(tmp_path_factory):
    return _run(DISTRIBUTED, tmp_path_factory.mktemp("distributed"))


def test_a_config_and_its_guard_under_mirrored_strategy_over_two_devices(distributed):
    """The last resort's loss is asked to be finite (an inf equals itself); the last resort
    itself is tested fast in tests/apply/guard/test_last_resort.py (the mutation it catches is
    named there)."""
    found = distributed
    assert found["replicas"] == 2
    assert found["policies"] == {"dense": "mixed_float16", "dense_1": "mixed_float16",
                                 "softmax": "float32"}
    assert found["optimizer"] == "FlooredLossScaleOptimizer"
    assert found["mirrored"] == "MirroredVariable"
    assert found["healthy"]["events"] == 0
    assert all(math.isfinite(loss) for loss in found["healthy"]["loss"])   # finite, trained
    assert found["healthy"]["loss"][-1] < found["healthy"]["loss"][0]
    # A NaN in the data: the weights are lost without the guard; with it the batch (its
    # replicas' shares together) is seen to hold the NaN, and skipped.
    assert not found["('nan', False)"]["finite"]
    guarded = found["('nan', True)"]
    assert guarded["finite"] and guarded["events"]
    event = guarded["events"][0]
    assert event["kind"] == "non_finite_loss" and "skipped a batch holding NaN" in event["action"]
    assert event["cause"] == "the batch itself holds NaN or inf" and event["layers"] == []
    # A loss scale that keeps collapsing: one repair, then every layer in float32.
    overflow = found["overflow"]
    assert "every layer to float32" in overflow["events"][-1]["action"]
    assert set(overflow["layers"]) == {"float32"}
    assert math.isfinite(overflow["last_loss"])   # neither NaN nor inf (inf == inf)


def test_a_step_is_skipped_where_any_replica_overflows(distributed):
    """Keras's own scale applies the step when the first replica's gradients are finite, though
    the second's are not (NaN weights); the config's skips it, whichever replica overflows."""
    assert distributed["('replicas', 'keras', 1)"] == {"finite": False, "applied": 1}
    assert distributed["('replicas', 'keras', 0)"] == {"finite": True, "applied": 0}
    for second in (0, 1):
        assert distributed[f"('replicas', 'ours', {second})"] == {"finite": True, "applied": 0}


def test_under_a_strategy_the_guard_names_the_layer_and_keeps_the_policy(distributed):
    float32, unguarded, guarded = (distributed[f"('house', '{run}')"]
                                   for run in ("float32", "unguarded", "guarded"))
    assert not math.isfinite(unguarded["val_loss"])   # the head's output past 65504
    # Trained to the model float32 trains to (1.02x idle and under load, measured).
    assert guarded["val_loss"] <= 1.25 * float32["val_loss"]
    assert guarded["events"][0]["layers"] == ["price"]
    assert "moved price to float32" in guarded["events"][0]["action"]
    assert guarded["policy"] == "mixed_float16" and guarded["float32"] == ["price"]
    assert guarded["dense"] == "mixed_float16"


SAVED = r'''
import json
import keras
import numpy as np
from tuner import PrecisionConfig

cfg = PrecisionConfig.from_dict({"policy": "mixed_float16", "loss_scale": {"kind": "dynamic"},
                                 "float32": {"groups": ["softmax"]}})
x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
y = (x[:, 0] > 0).astype("int64")
with cfg.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=cfg.wrap_optimizer(keras.optimizers.Adam(1e-3)),
                  loss="sparse_categorical_crossentropy", **cfg.compile_kwargs())
    model.fit(x, y, epochs=1, verbose=0)
model.save("model.keras")
'''

LOADED = r'''
import json, sys
import keras
import numpy as np
found = {}
try:
    keras.models.load_model("model.keras")
    found["without_tuner"] = "loaded"
except Exception as error:
    found["without_tuner"] = type(error).__name__
served = keras.models.load_model("model.keras", compile=False)
found["served"] = [layer.dtype_policy.name for layer in served.layers]
found["output"] = str(served.predict(np.zeros((2, 8), "float32"), verbose=0).dtype)
import tuner.apply.loss_scaling  # noqa: F401 - registers the tuner's optimizers with Keras
found["with_tuner"] = type(keras.models.load_model("model.keras").optimizer).__name__
print("FOUND " + json.dumps(found))
'''


def test_a_model_saved_under_a_config_loads_in_a_fresh_process(tmp_path):
    _run(SAVED + 'print("FOUND {}")', tmp_path)
    found = _run(LOADED, tmp_path)
    assert found["served"] == ["mixed_float16", "float32"] and found["output"] == "float32"
    assert found["without_tuner"] == "TypeError"     # the loss-scale optimizer's class
    assert found["with_tuner"] == "FlooredLossScaleOptimizer"
