"""Import a task file in the worker and turn its data into fixed lists of batches.

Two lists, materialised once per worker: the training batches every trial trains on, in one
fixed order, and the validation batches every trial is evaluated on (``validation_batches``):
from the task's ``val_data()``, or, without one, a held-back share of the training data that
no trial trains on (20% of NumPy samples; for a dataset, the batches after the run's pool, or
the last fifth of a shorter epoch). Arrays are sampled spread over the data, not read in file
order (``spread_order``: one seeded permutation, the same in every worker and trial), so data
sorted by class gives every batch, and the held-back share, a mix; a dataset's batches come in
the order its pipeline yields them (shuffle there, as for ``fit``). Past 300 lines: both lists
come from one scan of the same data and share its caches.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tuner.errors import TaskError, describe, first_line
from tuner.worker.task.array_rows import (
    VAL_BATCHES,
    first_non_finite,
    held_back_split,
    leading_dims,
    rows,
    sample_count,
    spread_order,
    validation_split,
)
from tuner.worker.task.fit_inputs import as_input, first_elements, with_class_weight
from tuner.worker.task.task_model import compiling_own_step


@dataclass
class Task:
    path: Path
    module: Any
    build_model: Callable
    train_data: Callable
    loss: Any
    make_optimizer: Callable | None
    batch_size: int
    metrics: Any
    val_data: Callable | None = None
    # compile_model(model, wrap_optimizer): the task compiles its model itself (a GAN, any
    # model with its own compile), passing every optimizer it makes through wrap_optimizer.
    compile_model: Callable | None = None
    val_metric: Callable | None = None   # val_metric(model) -> float, lower is better
    from_dataset: bool = False   # train_data() returned batches (a dataset, PyDataset, generator)
    class_weight: dict | None = None   # CLASS_WEIGHT: fit's class_weight, {class: weight}

    def optimizer(self):
        import keras

        return self.make_optimizer() if self.make_optimizer else keras.optimizers.Adam(1e-3)


_loaded: dict[tuple[str, float], Task] = {}


def load_task(path: str) -> Task:
    """Import the task file once per worker (re-imported when the file changes)."""
    resolved = Path(path).resolve()
    key = (str(resolved), resolved.stat().st_mtime)
    if key in _loaded:
        return _loaded[key]
    module_name = f"precision_tuner_task_{abs(hash(key))}"
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise TaskError(f"cannot import task file {resolved}. Is it a Python file?")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(resolved.parent))  # let the task import its neighbours
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise TaskError(f"importing task file {resolved.name} raised {type(exc).__name__}: "
                        f"{first_line(exc)}. Fix the task file.") from exc
    finally:
        sys.path.remove(str(resolved.parent))
    compiles_itself = hasattr(module, "compile_model") or hasattr(module, "train_step")
    for name in ("build_model", "train_data") + (() if compiles_itself else ("LOSS",)):
        if not hasattr(module, name):
            raise TaskError(f"task file {resolved.name} does not define {name}. A task file must "
                            "define build_model(), train_data() and LOSS, or compile_model(model, "
                            "wrap_optimizer) or train_step(model, optimizer, batch) instead of "
                            "LOSS.")
    if hasattr(module, "compile_model") and hasattr(module, "train_step"):
        raise TaskError(f"task file {resolved.name} defines both compile_model and train_step. "
                        "Keep one: train_step(model, optimizer, batch) for a custom loop's step, "
                        "compile_model(model, wrap_optimizer) for a model with its own compile.")
    for name in ("build_model", "train_data", "compile_model", "train_step", "val_metric",
                 "val_data", "make_optimizer"):
        if hasattr(module, name) and not callable(getattr(module, name)):
            raise TaskError(f"{name} in {resolved.name} must be a function. Received: "
                            f"{name}={describe(getattr(module, name))}")
    batch_size = getattr(module, "BATCH_SIZE", 32)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise TaskError(f"BATCH_SIZE in {resolved.name} must be a positive integer. Received: "
                        f"BATCH_SIZE={describe(batch_size)}. Set it to a whole number such as 32.")
    task = Task(path=resolved, module=module, build_model=module.build_model,
                train_data=module.train_data, loss=getattr(module, "LOSS", None),
                make_optimizer=getattr(module, "make_optimizer", None),
                batch_size=batch_size, metrics=getattr(module, "METRICS", None),
                val_data=getattr(module, "val_data", None),
                compile_model=getattr(module, "compile_model", None) or (
                    compiling_own_step(module, resolved.name)
                    if hasattr(module, "train_step") else None),
                val_metric=getattr(module, "val_metric", None),
                class_weight=_class_weight(module, resolved.name))
    _loaded[key] = task
    return task


def _class_weight(module, name: str) -> dict | None:
    weights = getattr(module, "CLASS_WEIGHT", None)
    if weights is None:
        return None
    if not isinstance(weights, dict) or not all(
            isinstance(k, (int, np.integer)) and isinstance(v, (int, float, np.number))
            and not isinstance(k, bool) for k, v in weights.items()):
        raise TaskError(f"CLASS_WEIGHT in {name} must map class indices to weights, as "
                        f"model.fit(class_weight=...) takes. Received: CLASS_WEIGHT="
                        f"{describe(weights)}. Write it as {{0: 1.0, 1: 5.0}}.")
    return {int(k): float(v) for k, v in weights.items()}


_received: dict[str, str] = {}   # the code's digest -> its file on this node
_here: dict[str, str] = {}       # the driver's path -> the file of the code last received


def receive_task(task_path: str, digest: str, fetch: Callable[[], str],
                 data: tuple[str, Callable[[], bytes]] | None = None) -> None:
    """The driver's task file, shipped by reference (Ray's object store): its code is fetched
    (``fetch()``) the first time this worker sees ``digest``, not with every trial, and from
    then on ``task_path`` names it here. ``data``: the name of the data file a task written
    by tuner.tune() loads from beside itself, and its fetch, called only where this node has
    no copy of it."""
    if digest not in _received:
        _received[digest] = task_file_here(task_path, fetch(), data)
    _here[task_path] = _received[digest]


def forget_tasks() -> int:
    """Drop every task this worker imported, with its batches: a warm worker of the service
    (tuner.execution.warm_pool) serves one job after another, and one job's task file and
    arrays must neither stay in memory nor answer for the next job's. Returns how many."""
    count = len(_loaded)
    for cache in (_loaded, _received, _here, _batch_cache, _held_back):
        cache.clear()
    return count


def task_file_here(task_path: str, task_source: str | None = None,
                   data: tuple[str, Callable[[], bytes]] | None = None) -> str:
    """The task file on this node: the same path when it holds the same code, and the data
    file beside it where the task has one (one machine, or a shared file system), else a copy
    of the driver's file, its data file beside it, in a per-content cache folder.
    Without ``task_source``: the file last received for ``task_path``, or the path itself."""
    if task_source is None:
        return _here.get(task_path, task_path)
    path = Path(task_path)
    try:
        if path.read_text() == task_source and (data is None
                                                or (path.parent / data[0]).is_file()):
            return task_path
    except OSError:
        pass
    import hashlib
    import tempfile

    digest = hashlib.sha256(task_source.encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "precision-tuner-tasks" / digest
    folder.mkdir(parents=True, exist_ok=True)
    if data is not None:  # before the code: a copy of the task never lacks its data
        _write_once(folder / Path(data[0]).name, data[1])
    _write_once(folder / path.name, task_source.encode)
    return str(folder / path.name)


def _write_once(path: Path, content: Callable[[], bytes]) -> None:
    """Write ``content()`` at ``path`` unless it is there: whole or not at all, as another
    worker on this node may be reading it already."""
    if not path.exists():
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_bytes(content())
        os.replace(partial, path)


_batch_cache: dict[tuple[str, int], list] = {}
_held_back: dict[tuple[str, int], list] = {}   # same key: the slice no trial trains on



def fixed_batches(task: Task, steps: int) -> list[tuple]:
    """The first ``steps`` full batches of the task's data, as tensors, in a fixed order.

    Each batch keeps the structure the task's data has, as ``model.fit`` would hand it to
    ``train_step``: ``(x, y)``, or ``(x, y, sample_weight)`` where the data has sample weights,
    or ``(x,)`` where it has no labels (an autoencoder's custom ``train_step``; the dataset
    then yields x itself, as the task's did: ``tuner.worker.trial.steps.batch_dataset``).
    ``keras.utils.unpack_x_y_sample_weight`` takes any of them apart.
    Materialised once per worker so that every trial sees exactly the same data in the same
    order (a reshuffling ``tf.data`` pipeline would otherwise differ between trials). Batches
    whose size differs from the first (a partial last batch) are dropped: they would force a
    retrace in the middle of the timed steps.
    """
    key = (str(task.path), steps)
    if key not in _batch_cache:
        _batch_cache[key], _held_back[key] = _materialise(task, steps)
    return _batch_cache[key]


def validation_batches(task: Task, pool: int) -> tuple[list[tuple], str]:
    """The batches every trial of a run with this batch ``pool`` is evaluated on, and where
    they come from (``"val_data"``, ``"held-back"``, or ``"none"`` with no batches)."""
    if task.val_data is not None:
        key = (str(task.path), -1)
        if key not in _batch_cache:
            _batch_cache[key] = _validation_from(task)
        return _batch_cache[key], "val_data"
    fixed_batches(task, pool)
    held = _held_back[(str(task.path), pool)]
    return held, "held-back" if held else "none"


def _data_of(task: Task, function, name: str):
    """What the task's ``function`` (``train_data`` or ``val_data``) returns: a tuple of array
    parts, or a source of batches (tuner.worker.task.fit_inputs: what ``model.fit`` takes);
    its errors become one-line ``TaskError``s."""
    try:
        data = function()
    except Exception as exc:
        raise TaskError(f"{name} in {task.path.name} raised {type(exc).__name__}: "
                        f"{first_line(exc)}. Fix the task file.") from exc
    return as_input(data, f"{name} in {task.path.name}")


def _validation_from(task: Task) -> list[tuple]:
    data = _data_of(task, task.val_data, "val_data()")
    if isinstance(data, (tuple, list)):
        parts = _array_parts(task, data, "val_data()")
        elements = validation_split(parts, spread_order(sample_count(parts)), task.batch_size)
    else:
        elements, _ = _scan_dataset(task, data, VAL_BATCHES, "val_data()")
    return _as_tensors(task, elements[:VAL_BATCHES], "val_data()")


def _materialise(task: Task, steps: int) -> tuple[list[tuple], list[tuple]]:
    """The training batches and the held-back validation batches (empty with val_data())."""
    data = _data_of(task, task.train_data, "train_data()")
    if isinstance(data, (tuple, list)):
        elements, held = _from_arrays(task, data, steps)
    else:
        task.from_dataset = True
        elements, held = _from_dataset(task, data, steps)
    if task.class_weight:   # as fit applies it: to the training batches only
        elements = with_class_weight(elements, task.class_weight,
                                     f"CLASS_WEIGHT in {task.path.name}")
    return (_as_tensors(task, elements, "train_data()"),
            _as_tensors(task, held, "train_data()") if held else [])


def _as_tensors(task: Task, elements: list[tuple], source: str) -> list[tuple]:
    import tensorflow as tf

    _refuse_non_finite(task, elements, source)
    return [tuple(None if part is None else tf.nest.map_structure(tf.convert_to_tensor, part)
                  for part in element) for element in elements]


def _refuse_non_finite(task: Task, elements: list[tuple], source: str = "train_data()") -> None:
    """NaN or inf in the data would make every trial, float32 included, look unstable."""
    import tensorflow as tf

    for index, element in enumerate(elements):
        for name, part in zip(("x", "y", "sample_weight"), element):
            for leaf in tf.nest.flatten(part) if part is not None else []:
                values = np.asarray(leaf)
                if values.dtype.kind == "f" and not np.all(np.isfinite(values)):
                    bad = int(np.size(values) - np.count_nonzero(np.isfinite(values)))
                    raise TaskError(f"{source} in {task.path.name} has {bad} NaN/inf "
                                    f"value(s) in {name} of batch {index}. Clean or impute the "
                                    "data before tuning.")


def _array_parts(task: Task, data, source: str = "train_data()") -> list:
    """``[x, y]`` or ``[x, y, sample_weight]`` with one row per sample (checked)."""
    # fit(x, y, sample_weight=None) hands train_step (x, y): no trailing None.
    parts = list(data[:2]) if len(data) == 3 and data[2] is None else list(data)
    sizes = leading_dims(parts)
    if -1 in sizes:
        raise TaskError(f"{source} in {task.path.name} returned numbers where arrays with one "
                        f"row per sample belong (a Python list is read as separate values). "
                        f"Received: {describe(data)}. Return NumPy arrays, (x, y) or a dict "
                        "of them.")
    if len(sizes) != 1:
        raise TaskError(f"{source} in {task.path.name} returned arrays with different numbers "
                        f"of samples (first dimensions {sorted(sizes)}). x and y must have one row "
                        "per sample.")
    return parts


def _from_arrays(task: Task, data, steps: int) -> tuple[list[tuple], list[tuple]]:
    parts = _array_parts(task, data)
    found = first_non_finite(parts)
    if found is not None:   # NaN or inf would make every trial, float32's too, look unstable
        name, bad, row = found
        raise TaskError(f"train_data() in {task.path.name} has {bad} NaN/inf value(s) in "
                        f"{name} (the first in row {row}). Clean or impute the data before "
                        "tuning.")
    order = spread_order(sample_count(parts))
    held: list[tuple] = []
    if task.val_data is None and len(order) >= 2 * task.batch_size:
        order, held_rows = held_back_split(len(order))
        held = validation_split(parts, held_rows, task.batch_size)
    per_epoch = len(order) // task.batch_size
    if per_epoch == 0:
        raise TaskError(f"train_data() in {task.path.name} has {len(order)} samples, fewer "
                        f"than BATCH_SIZE={task.batch_size}. Lower BATCH_SIZE or provide more "
                        "data.")
    size = task.batch_size
    return [rows(parts, order[index * size:(index + 1) * size])
            for index in range(min(steps, per_epoch))], held


def _from_dataset(task: Task, dataset, steps: int) -> tuple[list[tuple], list[tuple]]:
    """The first ``steps`` batches (cycled when an epoch is shorter) and, without val_data(),
    the next ``VAL_BATCHES`` (or the last fifth of a shorter epoch), which no trial trains on."""
    if task.val_data is not None:   # an epoch shorter than the steps is cycled through
        elements, _ = _scan_dataset(task, dataset, steps, "train_data()")
        return [elements[index % len(elements)] for index in range(steps)], []
    elements, ended = _scan_dataset(task, dataset, steps + VAL_BATCHES, "train_data()")
    if not ended:
        return elements[:steps], elements[steps:]
    held = min(VAL_BATCHES, len(elements) // 5) if len(elements) >= 2 else 0
    train = elements[:len(elements) - held] if held else elements
    return [train[index % len(train)] for index in range(steps)], elements[len(train):]


def _scan_dataset(task: Task, dataset, count: int, source: str) -> tuple[list[tuple], bool]:
    """Up to ``count`` batches of one size (the first's), and whether the dataset ended first.
    The scan is bounded: a dataset of mixed batch sizes is read at most 4x ``count`` deep."""
    import tensorflow as tf

    batches: list[tuple] = []
    first_dims = None
    seen = 0
    for element in first_elements(dataset, count * 4):
        seen += 1
        if not isinstance(element, (tuple, list)):
            element = (element,)      # x alone (a dict of inputs too): fit trains on it
        if len(element) not in (1, 2, 3):
            raise TaskError(f"{source} in {task.path.name} must yield x, (x, y) or "
                            f"(x, y, sample_weight) batches. Received an element: "
                            f"{describe(element)}")
        element = tuple(element)
        dims = leading_dims(element)
        if first_dims is None:
            if min(len(tf.nest.flatten(element[0])[0].shape), 1) == 0:
                raise TaskError(f"{source} in {task.path.name} yields unbatched scalars; "
                                "call .batch(BATCH_SIZE) on the dataset.")
            first_dims = dims
        if dims != first_dims:
            continue
        batches.append(element)
        if len(batches) == count:
            break
    if not batches:
        raise TaskError(f"{source} in {task.path.name} returned an empty dataset. Provide "
                        "at least one batch.")
    return batches, seen < count * 4 and len(batches) < count
