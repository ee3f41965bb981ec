"""What a task's ``train_data()`` and ``val_data()`` may return: what ``model.fit(x=...)``
takes. Arrays (``(x, y)``, ``(x, y, sample_weight)``, x alone, a dict of arrays for named
inputs), or a source of batches: a ``tf.data.Dataset``, a ``keras.utils.PyDataset``, or a
generator (any iterator) of batches, endless or not. tuner.worker.task.task_loader turns either
into its fixed lists of batches; this module says which one the data is, and reads the first
batches of a source, whatever its kind.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator

import numpy as np

from tuner.errors import TaskError, describe

ACCEPTED = ("arrays ((x, y), (x, y, sample_weight), x alone, or a dict of arrays), a batched "
            "tf.data.Dataset, a keras.utils.PyDataset, or a generator of batches")


def is_source(data: Any) -> bool:
    """Is ``data`` a source of batches (as opposed to arrays, which the tuner batches)?"""
    import tensorflow as tf

    return isinstance(data, tf.data.Dataset) or _is_py_dataset(data) or _is_iterator(data)


def as_input(data: Any, where: str) -> Any:
    """``data`` as the loader takes it: a tuple of array parts, or a source of batches; a
    one-line ``TaskError`` naming what is accepted otherwise (``where``: "train_data() in
    task.py")."""
    if isinstance(data, (np.ndarray, dict)) or _is_tensor(data):
        return (data,)                 # x alone, as model.fit(x) takes it (no labels)
    if isinstance(data, (tuple, list)) and len(data) in (1, 2, 3):
        return data
    if is_source(data):
        return data
    raise TaskError(f"{where} must return what model.fit(x=...) takes: {ACCEPTED}. Received: "
                    f"{describe(data)}")


def first_elements(source: Any, count: int) -> Iterator[Any]:
    """Up to ``count`` elements (batches) of ``source``, in its order: an endless source is
    read no further."""
    import tensorflow as tf

    if isinstance(source, tf.data.Dataset):
        return iter(source.take(count))
    if _is_py_dataset(source):
        return _py_dataset_batches(source, count)
    return itertools.islice(source, count)


def with_class_weight(elements: list[tuple], class_weight: dict[int, float],
                      where: str) -> list[tuple]:
    """Training batches with the sample weights ``model.fit(class_weight=...)`` gives them:
    each sample weighs its class's weight (1.0 for a class not named); a class is the label
    rounded to an integer, or the argmax of a one-hot label. Like fit, refused beside sample
    weights of the data's own, or without labels."""
    weighted = []
    for element in elements:
        if len(element) < 2 or element[1] is None:
            raise TaskError(f"{where} weighs samples by their labels, but the data has none "
                            "(x alone). Drop CLASS_WEIGHT, or return (x, y).")
        if len(element) == 3 and element[2] is not None:
            raise TaskError(f"{where}: the data has sample weights of its own; model.fit "
                            "takes class_weight or sample weights, not both. Drop one.")
        if isinstance(element[1], (dict, list, tuple)):
            raise TaskError(f"{where}: class weights apply to a model with one output, as in "
                            "model.fit; this data has several labels. Drop CLASS_WEIGHT, or "
                            "give per-sample weights in the data.")
        labels = np.asarray(element[1])
        if labels.ndim > 1:
            labels = np.argmax(labels, axis=-1) if labels.shape[-1] != 1 \
                else labels.reshape(labels.shape[:-1])
        classes = np.rint(labels).astype(np.int64).reshape(len(labels))
        weights = np.array([class_weight.get(int(c), 1.0) for c in classes], np.float32)
        weighted.append((element[0], element[1], weights))
    return weighted


def _py_dataset_batches(dataset: Any, count: int) -> Iterator[Any]:
    """A PyDataset's batches by index, as Keras reads them: ``num_batches`` of them (None:
    endless), or until it raises IndexError."""
    try:
        total = dataset.num_batches
    except (AttributeError, NotImplementedError):
        total = len(dataset) if hasattr(dataset, "__len__") else None
    indices = range(min(count, total)) if total is not None else range(count)
    for index in indices:
        try:
            yield dataset[index]
        except IndexError:
            return


def _is_py_dataset(data: Any) -> bool:
    import keras

    return isinstance(data, keras.utils.PyDataset)


def _is_iterator(data: Any) -> bool:
    return hasattr(data, "__next__") and hasattr(data, "__iter__")


def _is_tensor(data: Any) -> bool:
    import tensorflow as tf

    return isinstance(data, tf.Tensor)
