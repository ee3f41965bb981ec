"""Models the way users have them, saved by plain Keras in float32 (or mixed) outside any
scope: each kind of file, config or clone a fine-tuning user starts from, beside the code that
builds the same architecture (its float32 twin, built under the scope as a task would).

``save_all(folder)`` writes every kind once; ``KINDS[name].load(folder)`` gets the model back
the user's way (to be called inside a config's scope); ``KINDS[name].twin()`` builds it in code.
``task_file(folder, name)`` writes a task whose ``build_model()`` loads that kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import keras
import numpy as np

X = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
Y = np.random.default_rng(1).integers(0, 3, size=64).astype("int32")


@keras.saving.register_keras_serializable("precision_tuner_tests")
class Residual(keras.layers.Layer):
    """A custom layer that builds its sublayer with the dtype passed down (as libraries do)."""

    def __init__(self, units=16, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.inner = keras.layers.Dense(units, activation="relu", dtype=self.dtype_policy)

    def build(self, input_shape):
        self.inner.build(input_shape)

    def call(self, x):
        return x + self.inner(x)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


@keras.saving.register_keras_serializable("precision_tuner_tests")
class Classifier(keras.Model):
    """A subclassed model with a custom layer, saved and loaded through get_config."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.stem = keras.layers.Dense(16, activation="relu")
        self.block = Residual(16)
        self.head = keras.layers.Dense(3, activation="softmax")

    def call(self, x):
        return self.head(self.block(self.stem(x)))


@keras.saving.register_keras_serializable("precision_tuner_tests")
class Tower(keras.Model):
    """A subclassed model that hands its own dtype down to the sublayers it builds, as
    KerasHub's backbones do: loaded, its sublayers are 16-bit only if the model itself is."""

    def __init__(self, units=16, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.stem = keras.layers.Dense(units, activation="relu", dtype=self.dtype_policy)
        self.head = keras.layers.Dense(3, activation="softmax", dtype=self.dtype_policy)

    def call(self, x):
        return self.head(self.stem(x))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


@keras.saving.register_keras_serializable("precision_tuner_tests")
class Gated(keras.layers.Layer):
    """A custom layer with its own ``from_config``: its gate is a layer handed to the
    constructor, saved as a nested config and deserialised by the override."""

    def __init__(self, gate, units=16, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.gate = gate
        self.value = keras.layers.Dense(units, dtype=self.dtype_policy)

    def build(self, input_shape):
        if not self.gate.built:   # deserialised with its build config, it comes built
            self.gate.build(input_shape)
        self.value.build(input_shape)

    def call(self, x):
        return self.value(x) * keras.ops.sigmoid(self.gate(x))

    def get_config(self):
        return {**super().get_config(), "units": self.units,
                "gate": keras.saving.serialize_keras_object(self.gate)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["gate"] = keras.saving.deserialize_keras_object(config["gate"])
        return cls(**config)


def functional(softmax_dtype=None):
    inputs = keras.Input((8,))
    x = keras.layers.Dense(16, activation="relu")(inputs)
    x = Residual(16)(x)
    outputs = keras.layers.Dense(3, activation="softmax", dtype=softmax_dtype)(x)
    return keras.Model(inputs, outputs)


def sequential():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(3, activation="softmax")])


def subclassed():
    model = Classifier()
    model(X[:2])
    return model


def dtype_passed_down():
    model = Tower(16)
    model(X[:2])
    return model


def own_from_config():
    inputs = keras.Input((8,))
    x = Gated(keras.layers.Dense(16), 16)(inputs)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))


def nested():
    inner_in = keras.Input((16,))
    inner = keras.Model(inner_in, keras.layers.Dense(16, activation="relu")(inner_in),
                        name="encoder")
    inputs = keras.Input((8,))
    x = keras.layers.Dense(16)(inputs)
    x = inner(x)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))


def recurrent():
    return keras.Sequential([keras.Input((5, 8)), keras.layers.Bidirectional(
        keras.layers.LSTM(8)), keras.layers.Dense(3, activation="softmax")])


def attention():
    inputs = keras.Input((5, 8))
    x = keras.layers.MultiHeadAttention(2, 4)(inputs, inputs)
    x = keras.layers.LayerNormalization()(x + inputs)
    x = keras.layers.TimeDistributed(keras.layers.Dense(8, activation="relu"))(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))


def conv():
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(4, 3, padding="same")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation("relu")(x)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))


def _inputs(build) -> np.ndarray:
    if build in (recurrent, attention):
        return np.random.default_rng(2).normal(size=(64, 5, 8)).astype("float32")
    if build is conv:
        return np.random.default_rng(2).normal(size=(64, 8, 8, 1)).astype("float32")
    return X


@dataclass(frozen=True)
class Kind:
    build: Callable            # the architecture in code (the twin)
    save: Callable             # (model, folder) -> None: how the user saved it
    load: Callable             # folder -> model: how the user gets it back
    expression: str | None = None   # build_model()'s body in a task file (a saved file)
    pure: bool = True          # also loads under pure bfloat16 (Keras's LSTM cannot init there)

    def twin(self):
        return self.build()

    def inputs(self):
        return _inputs(self.build)


def _keras_file(name):
    return (lambda model, folder: model.save(Path(folder) / name),
            lambda folder: keras.models.load_model(Path(folder) / name, compile=False),
            f"keras.models.load_model(HERE / {name!r}, compile=False)")


def _weights_file(build):
    def load(folder):
        model = build()   # built in code, inside the scope: the control
        model.load_weights(Path(folder) / f"{build.__name__}.weights.h5")
        return model
    return (lambda model, folder: model.save_weights(Path(folder) / f"{build.__name__}.weights.h5"),
            load, None)


def _json(build):
    name = f"{build.__name__}.json"
    return (lambda model, folder: (Path(folder) / name).write_text(model.to_json()),
            lambda folder: keras.models.model_from_json((Path(folder) / name).read_text()),
            None)


def _clone(build):
    # The model the user cloned exists before the scope: a module-level float32 model.
    def load(folder):
        return keras.models.clone_model(_SOURCES[build.__name__])
    return (lambda model, folder: _SOURCES.__setitem__(build.__name__, model), load, None)


_SOURCES: dict = {}

KINDS = {
    "functional_keras": Kind(functional, *_keras_file("functional.keras")),
    "functional_h5": Kind(functional, *_keras_file("functional.h5")),
    "sequential_keras": Kind(sequential, *_keras_file("sequential.keras")),
    "subclassed_keras": Kind(subclassed, *_keras_file("subclassed.keras")),
    "dtype_passed_down_keras": Kind(dtype_passed_down, *_keras_file("passed_down.keras")),
    "own_from_config_keras": Kind(own_from_config, *_keras_file("own_from_config.keras")),
    "nested_keras": Kind(nested, *_keras_file("nested.keras")),
    "recurrent_keras": Kind(recurrent, *_keras_file("recurrent.keras"), pure=False),
    "attention_keras": Kind(attention, *_keras_file("attention.keras")),
    "conv_h5": Kind(conv, *_keras_file("conv.h5")),
    "functional_json": Kind(functional, *_json(functional)),
    "functional_clone": Kind(functional, *_clone(functional)),
    "sequential_clone": Kind(sequential, *_clone(sequential)),
    "weights_only": Kind(functional, *_weights_file(functional)),
}


def save_all(folder: Path) -> None:
    """Each kind saved in float32, by plain Keras, outside any scope (weights trained a step,
    so that a load that dropped them would show)."""
    keras.config.set_dtype_policy("float32")
    for name, kind in KINDS.items():
        keras.utils.set_random_seed(0)
        model = kind.build()
        model.compile("adam", "sparse_categorical_crossentropy")
        model.fit(kind.inputs(), Y, epochs=1, batch_size=32, verbose=0)
        kind.save(model, folder)


def save_mixed_with_float32_softmax(folder: Path, policy: str = "mixed_bfloat16") -> Path:
    """A model saved from a ``policy`` training whose softmax head was kept in float32
    (Keras's mixed precision guide)."""
    keras.config.set_dtype_policy(policy)
    try:
        model = functional(softmax_dtype="float32")
        path = Path(folder) / f"{policy}_softmax.keras"
        model.save(path)
    finally:
        keras.config.set_dtype_policy("float32")
    return path
TASK = '''"""build_model() loads a model saved by plain Keras, as a fine-tuning user's does."""
import sys
from pathlib import Path
import keras
import numpy as np
sys.path.insert(0, {root!r})
from tests.apply.loaded.saved_kinds import KINDS, X, Y  # registers the custom classes too
HERE = Path(__file__).parent
LOSS = "sparse_categorical_crossentropy"
BATCH_SIZE = 16
def build_model():
    return {expression}
def train_data():
    return {inputs}, Y
'''


def task_file(folder: Path, name: str, expression: str | None = None) -> Path:
    """A task file in ``folder`` whose build_model() returns ``expression`` (by default, the
    kind ``name``'s own load)."""
    path = Path(folder) / f"task_{name}.py"
    inputs = f"KINDS[{name!r}].inputs()" if name in KINDS else "X"
    path.write_text(TASK.format(expression=expression or KINDS[name].expression, inputs=inputs,
                                root=str(Path(__file__).resolve().parents[3])))
    return path
