"""What a worker process does once, before its first trial: import the frameworks, then freeze.

Every trial starts with ``gc.collect()`` (``reset_keras_state``: the previous trial's model must
be gone before this one is built and its memory measured). After TensorFlow and Keras are
imported the collector tracks about 400,000 objects, and a full collection walked all of them:
0.10-0.13 s per call here, several calls per trial, and as much again whenever Python's own
collection ran in the middle of a timed step. ``gc.freeze()`` moves the objects alive at that
point (modules, classes, the frameworks' registries: none of them ever becomes garbage) into
the permanent generation, which collections skip; a collection after a trial then takes 1-3 ms.
Objects created later, the trials' models included, are collected as before.
"""

from __future__ import annotations

import gc


def import_frameworks() -> None:
    """Import TensorFlow and Keras once, and keep the collector off what they left alive."""
    import keras  # noqa: F401
    import tensorflow  # noqa: F401

    gc.collect()
    gc.freeze()
