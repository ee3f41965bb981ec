"""The rows of a task's NumPy data: its parts (``[x, y]``, ``[x, y, sample_weight]``, nested
x included) read by row, and the order trials sample them in: one seeded permutation, the same
in every trial and worker (``spread_order``), so data sorted by class gives every batch a mix;
the share held back for validation where the task has no ``val_data()`` (``held_back_split``,
which ``precision-tuner train`` holds back too), and the validation batches cut from rows
(``validation_split``); and every row checked for NaN/inf before any is sampled
(``first_non_finite``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Validation: at most this many batches, of at most the training batch size (an evaluation
# step costs about a third of a training step, so 8 batches stay a few steps' time); arrays
# with fewer samples are split into this many smaller batches, so that their batch-to-batch
# scatter (the validation noise) can be measured.
VAL_BATCHES = 8
HELD_BACK_SHARE = 0.2
# The seed of the one permutation arrays are sampled in (``spread_order``).
SAMPLE_SEED = 0
# Rows checked for NaN/inf at a time (``first_non_finite``): a gigabyte of mapped arrays is
# read through, never copied whole.
SCAN_ROWS = 65536


def leading_dims(structure: Any) -> set[int]:
    import tensorflow as tf

    return {int(np.shape(leaf)[0]) if np.ndim(leaf) else -1
            for leaf in tf.nest.flatten(structure)}


def rows(parts: list, which) -> tuple:
    """The rows ``which`` (a slice, or an array of row indices) of every part (``[x, y]`` or
    ``[x, y, sample_weight]``, nested x included); an array of a mapped data file reads only
    those rows."""
    import tensorflow as tf

    return tuple(tf.nest.map_structure(lambda a: np.asarray(a)[which], p) for p in parts)


def first_non_finite(parts: list) -> tuple[str, int, int] | None:
    """The first part (``x``, ``y``, ``sample_weight``) holding NaN or inf in a float array:
    its name, how many such values it holds and the first row with one; None where all are
    finite. Every row, not only those a run samples: the user's training meets them all."""
    import tensorflow as tf

    for name, part in zip(("x", "y", "sample_weight"), parts):
        for leaf in tf.nest.flatten(part) if part is not None else []:
            values = np.asarray(leaf)
            if values.dtype.kind != "f":
                continue
            first, bad = None, 0
            for start in range(0, len(values), SCAN_ROWS):   # a mapped file: a chunk at a time
                finite = np.isfinite(values[start:start + SCAN_ROWS])
                if not finite.all():
                    bad += int(finite.size - np.count_nonzero(finite))
                    if first is None:
                        rows_finite = finite.reshape(len(finite), -1).all(axis=1)
                        first = start + int(np.argmin(rows_finite))
            if first is not None:
                return name, bad, first
    return None


def sample_count(parts: list) -> int:
    """The parts' one number of rows."""
    return next(iter(leading_dims(parts)))


def spread_order(samples: int) -> np.ndarray:
    """The order arrays are sampled in: one seeded permutation of their rows, the same for
    every trial and every worker (and for ``precision-tuner train``)."""
    return np.random.default_rng(SAMPLE_SEED).permutation(samples)


def held_back_split(samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows trained on and the rows held back for validation where the task has no
    ``val_data()``: ``HELD_BACK_SHARE`` of them, spread over the data, both in
    ``spread_order``."""
    order = spread_order(samples)
    kept = samples - max(2, int(samples * HELD_BACK_SHARE))
    return order[:kept], order[kept:]


def validation_split(parts: list, order: np.ndarray, batch_size: int) -> list[tuple]:
    """At most ``VAL_BATCHES`` equal batches of at most ``batch_size`` samples, the rows
    ``order`` names, taken in that order."""
    size = min(batch_size, len(order) // VAL_BATCHES) or 1
    count = min(VAL_BATCHES, len(order) // size)
    return [rows(parts, order[index * size:(index + 1) * size]) for index in range(count)] \
        if count >= 2 else []
