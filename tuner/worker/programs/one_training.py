"""One whole training of a task under a config with the precision guard (or in float32), run as
its own process by ``precision-tuner train``:
``python -m tuner.worker.programs.one_training TASK CONFIG|float32 EPOCHS [--no-guard]``.

It trains as a user's script does (the public API: ``cfg.scope()``, ``cfg.wrap_optimizer()``,
``cfg.guard()``), validates every epoch on the task's ``val_data()`` (without one, on the 20%
of NumPy training data the tuner's trials hold back, spread over the data, which it then does
not train on; without labels either, it does not validate: the training loss is compared),
keeps the data's sample weights, and writes one line per epoch (``PT-EPOCH {...}``) and one at
the end (``PT-DONE {...}``: the history, the guard's events and the amended config) on stdout
(tuner.apply.guard.mlflow_record).
"""

from __future__ import annotations

import sys

from tuner.apply.config import PrecisionConfig
from tuner.apply.guard.mlflow_record import guard_record
from tuner.process_lines import DEVICES, DONE, EPOCH, line
from tuner.worker.process.startup import prepare_process
from tuner.worker.task.array_rows import held_back_split, rows, sample_count
from tuner.worker.task.keras_state import reset_keras_state
from tuner.worker.task.task_loader import load_task
from tuner.worker.task.task_model import compile_for_trial


def _fit_data(task) -> dict:
    data = task.train_data()
    if not isinstance(data, tuple) and not hasattr(data, "element_spec"):
        data = (data,)  # x alone, as model.fit(x) takes it (no labels)
    if not isinstance(data, tuple):  # a tf.data.Dataset, batched by the task
        fit = {"x": data}
        if task.val_data is not None:
            fit["validation_data"] = task.val_data()
        return fit
    x, y, sample_weight = (list(data) + [None, None])[:3]
    fit = {"x": x, "y": y, "sample_weight": sample_weight, "batch_size": task.batch_size,
           "shuffle": False}
    if task.val_data is not None:
        fit["validation_data"] = task.val_data()
    elif y is not None:  # the rows the tuner's trials hold back too
        parts = [part for part in (x, y, sample_weight) if part is not None]
        trained_rows, held_rows = held_back_split(sample_count(parts))
        trained = rows(parts, trained_rows)
        fit.update(x=trained[0], y=trained[1],
                   sample_weight=trained[2] if sample_weight is not None else None,
                   validation_data=rows(parts, held_rows))
    return fit


def train(task_path: str, which: str, epochs: int, guarded: bool = True,
          seed: int = 0) -> dict:
    import keras

    reset_keras_state(seed)
    task = load_task(task_path)
    config = PrecisionConfig() if which == "float32" else PrecisionConfig.load(which)
    fit = _fit_data(task)

    class Report(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            figures = {key: float(value) for key, value in (logs or {}).items()}
            print(line(EPOCH, {"epoch": epoch + 1, **figures}), flush=True)

    guard = config.guard() if guarded and which != "float32" else None
    with config.scope():
        model = task.build_model()
        compile_for_trial(model, task, config)
        history = model.fit(epochs=epochs, verbose=0,
                            callbacks=[Report()] + ([guard] if guard else []), **fit)
    events = [event.to_dict() for event in guard.events] if guard else []
    amended = guard.config if guard else config
    return {"history": {key: [float(v) for v in values]
                        for key, values in history.history.items()},
            **guard_record(events, amended.to_dict())}


if __name__ == "__main__":
    # The devices first, before TensorFlow allocates: said on the first line, for the driver.
    print(line(DEVICES, prepare_process()), flush=True)
    result = train(sys.argv[1], sys.argv[2], int(sys.argv[3]),
                   guarded="--no-guard" not in sys.argv[4:])
    print(line(DONE, result), flush=True)
