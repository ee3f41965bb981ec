"""The rows of a task's NumPy data: its parts (``[x, y]``, ``[x, y, sample_weight]``, nested
x included) read by row, and the order trials sample them in: one seeded permutation, the same
in every trial and worker (``spread_order``), so data sorted by class gives every batch a mix;
the share held back for validation where the task has no ``val_data()`` (``held_back_split``,
which ``precision-tuner train`` holds back too), and the validation batches cut from rows
(``validation_split``).
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
