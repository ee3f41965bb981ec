"""Tuning from Python, as in a notebook: the model, the data and the loss are defined here, in
``__main__`` (nothing to import from a task file), and handed to ``tuner.tune``.

Run it:  python examples/from_python.py [--executor local|ray] [--run-dir DIR]
         [--keep-slow-policies]
Each block below is what a notebook cell would hold. The script is written flat, with no
``if __name__ == "__main__":`` guard, as KerasTuner and Optuna scripts are: the tuner's
workers never re-run it.
"""

import argparse

import keras
import numpy as np

import tuner

# -- cell 1: data already in memory ----------------------------------------------------------
rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 32)).astype("float32")
y = (x[:, :8].sum(axis=1) > 0).astype("int64")


# -- cell 2: the model, a function that builds it afresh ------------------------------------
def build_model():
    inputs = keras.Input(shape=(32,))
    h = keras.layers.Dense(256, activation="relu")(inputs)
    h = keras.layers.Dense(256, activation="relu")(h)
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(h))


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--executor", default="local", choices=("local", "ray"))
parser.add_argument("--run-dir", default=None)
parser.add_argument("--keep-slow-policies", action="store_true",
                    help="try the 16-bit policies even where this CPU's ceiling says they are slow")
args = parser.parse_args()

# -- cell 3: tune (the CLI's options are keyword arguments) ----------------------------------
result = tuner.tune(build_model=build_model, train_data=(x, y),
                    loss="sparse_categorical_crossentropy",
                    optimizer=lambda: keras.optimizers.Adam(1e-3),
                    batch_size=128, space="quick", trials=3, steps=20, no_confirm=True,
                    executor=args.executor, run_dir=args.run_dir,
                    keep_slow_policies=args.keep_slow_policies)
print(result)         # the pick and its speedup: mixed_bfloat16, 1.12x [1.05-1.19] vs float32
print(result.trials[["trial", "config", "verdict", "median_ms", "speedup"]])   # a DataFrame

# -- cell 4: apply the pick to your own training ---------------------------------------------
cfg = result.best
with cfg.scope():
    model = build_model()
cfg.compile(model, keras.optimizers.Adam(1e-3),   # after the scope: the loss scale as tuned
            loss="sparse_categorical_crossentropy")
history = model.fit(x, y, batch_size=128, epochs=1, verbose=0)
print(f"applied {cfg.describe()}: one epoch, loss {history.history['loss'][-1]:.4f}")
