"""A power plant's electrical output in megawatts from its ambient conditions, written as the
regression tutorials write it: inputs through an adapted ``Normalization`` layer, an MLP, and a
linear head that predicts the output in its physical unit (420-495 MW), its bias started at the
mean output. MSE, a held-out ``val_data()``.

The head's output is a number in the hundreds: bfloat16 holds it to within 1 MW (its step
there is 2 MW), while float32 reaches a tenth of that.
"""

import keras
import numpy as np

BATCH_SIZE = 64
LOSS = "mse"
METRICS = ["mae"]
MEAN_OUTPUT_MW = 454.0


def _readings(count, seed):
    rng = np.random.default_rng(seed)
    temperature = rng.uniform(2.0, 37.0, count)        # degrees Celsius
    vacuum = rng.uniform(25.0, 81.0, count)            # exhaust vacuum, cm Hg
    humidity = rng.uniform(25.0, 100.0, count)         # relative humidity, %
    output = (MEAN_OUTPUT_MW - 1.8 * (temperature - 20.0) - 0.25 * (vacuum - 53.0)
              + 0.05 * (humidity - 62.0) + 3.0 * np.sin(temperature / 4.0)
              + rng.normal(0.0, 0.1, count))
    features = np.stack([temperature, vacuum, humidity], axis=1).astype("float32")
    return features, output.astype("float32")


def build_model():
    normalize = keras.layers.Normalization(name="normalization")
    normalize.adapt(_readings(4096, 0)[0])
    inputs = keras.Input(shape=(3,), name="conditions")
    x = normalize(inputs)
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    outputs = keras.layers.Dense(1, name="output_mw",
                                 bias_initializer=keras.initializers.Constant(MEAN_OUTPUT_MW))(x)
    return keras.Model(inputs, outputs, name="power_plant")


def make_optimizer():
    return keras.optimizers.Adam(3e-3)


def train_data():
    return _readings(8192, 0)


def val_data():
    return _readings(1024, 1)
