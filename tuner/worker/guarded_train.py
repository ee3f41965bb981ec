"""One whole training of a task under a config with the precision guard (or in float32), run as
its own process by ``precision-tuner train``: ``python -m tuner.worker.guarded_train TASK
CONFIG|float32 EPOCHS``. It trains as a user's script does (the public API: ``cfg.scope()``,
``cfg.wrap_optimizer()``, ``cfg.guard()``), validates every epoch on the task's ``val_data()``
(without one, on the last 20% of NumPy training data, which it then does not train on), and
writes one JSON line per epoch (``PT-EPOCH {...}``) and one at the end (``PT-DONE {...}``:
the history, the guard's events and the amended config) on stdout.
"""

from __future__ import annotations

import json
import sys

from tuner.apply.config import PrecisionConfig
from tuner.errors import TaskError
from tuner.worker.task_loader import load_task
from tuner.worker.task_model import compile_for_trial
from tuner.worker.trial import reset_keras_state

EPOCH, DONE = "PT-EPOCH ", "PT-DONE "


def _fit_data(task) -> dict:
    data = task.train_data()
    if hasattr(data, "shape"):  # x alone, as model.fit(x) takes it (no labels)
        data = (data,)
    if not isinstance(data, tuple):  # a tf.data.Dataset, batched by the task
        if task.val_data is None:
            raise TaskError("a task whose train_data() is a dataset needs val_data() for a "
                            "whole training's validation. Define val_data() in the task file.")
        return {"x": data, "validation_data": task.val_data()}
    x, y = data[0], data[1] if len(data) > 1 else None
    fit = {"x": x, "y": y, "batch_size": task.batch_size, "shuffle": False}
    if task.val_data is not None:
        fit["validation_data"] = task.val_data()
    elif y is not None:
        keep = int(len(y) * 0.8)
        fit.update(x=x[:keep], y=y[:keep], validation_data=(x[keep:], y[keep:]))
    return fit


def train(task_path: str, which: str, epochs: int, seed: int = 0) -> dict:
    import keras

    reset_keras_state(seed)
    task = load_task(task_path)
    config = PrecisionConfig() if which == "float32" else PrecisionConfig.load(which)
    fit = _fit_data(task)

    class Report(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            figures = {key: float(value) for key, value in (logs or {}).items()}
            print(EPOCH + json.dumps({"epoch": epoch + 1, **figures}), flush=True)

    guard = config.guard() if which != "float32" else None
    with config.scope():
        model = task.build_model()
        compile_for_trial(model, task, config)
        history = model.fit(epochs=epochs, verbose=0,
                            callbacks=[Report()] + ([guard] if guard else []), **fit)
    return {"history": {key: [float(v) for v in values]
                        for key, values in history.history.items()},
            "events": guard.events if guard else [],
            "config": (guard.config if guard else config).to_dict()}


if __name__ == "__main__":
    result = train(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    print(DONE + json.dumps(result), flush=True)
