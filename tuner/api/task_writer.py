"""A task file for a model, data and loss defined in Python (a notebook's cells, a script's
``__main__``): the objects are pickled by value with cloudpickle into a data file beside a
small task file that loads it, so that a worker loads it like any task file, on this machine
or on a Ray node (tuner.execution.task_shipping ships both).

The data file is written once per ``tune()`` call (tuner.api.data_file): NumPy arrays go in
as their raw bytes, streamed to the file, and a worker maps them rather than reading them, so
the workers of a node share one copy. The task file defines the task contract's names at its
top level, as a hand-written one does, and names its data's size and SHA-256: new data makes
a new task file, and a Ray worker's copy of a task follows its file's content.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from tuner.api import data_file
from tuner.errors import UsageError, first_line
from tuner.execution.task_shipping import data_line

_TEMPLATE = '''"""Written by tuner.tune() from objects defined in Python; do not edit (tune again).
The objects (build_model, the data, the loss, ...) are in {name} beside this file:
{size:,} bytes, pickled by cloudpickle, their arrays mapped from it (tuner.api.data_file)."""
from pathlib import Path

from tuner.api.data_file import load as _load

{data_line}
_DATA_BYTES = {size}
_DATA_SHA256 = {digest!r}
_DATA = Path(__file__).with_name(_DATA_NAME)
if not _DATA.is_file() or _DATA.stat().st_size != _DATA_BYTES:
    raise FileNotFoundError(f"{{_DATA}} ({{_DATA_BYTES}} bytes), written by tuner.tune() beside "
                            "this task file, is missing or was changed: call tune() again")
_TASK = _load(_DATA)
build_model = _TASK["build_model"]
train_data = _TASK["train_data"]
LOSS = _TASK["LOSS"]
BATCH_SIZE = _TASK["BATCH_SIZE"]
{optional}'''
_OPTIONAL = ("make_optimizer", "train_step", "val_data", "METRICS", "CLASS_WEIGHT")


class _NotGiven:
    """``tune()``'s default ``loss``: none given. ``loss=None`` itself is a choice, as in
    ``compile(loss=None)``: a model whose ``train_step`` computes its own loss."""

    def __repr__(self) -> str:
        return "<required>"


LOSS_NOT_GIVEN = _NotGiven()


class Returns:
    """A data function for arrays given as values: ``train_data=(x, y)``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self) -> Any:
        return self.value


class Recorded:
    """A data function for a source of batches given as an object (a ``tf.data.Dataset``, a
    generator): its first batches, read once in the calling process, which a worker's
    trials cycle through. A dataset object is a graph of this process and a generator is
    spent once read: neither can be sent to a worker as it is."""

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def __call__(self) -> Any:
        return iter(self.batches)


# How much of a dataset object or a generator tune() reads: the batches a run cycles through
# (at most 50, or --steps) and the validation's 8, with room to spare; and no more bytes.
RECORDED_BATCHES = 256
RECORDED_BYTES = 1 << 30


def _data_function(name: str, value: Any) -> Callable[[], Any] | None:
    if value is None or callable(value):
        return value
    if isinstance(value, (tuple, list, dict)) or hasattr(value, "shape") or _is_py_dataset(value):
        return Returns(value)   # pickled as it is (a PyDataset reads its files in the worker)
    if _is_dataset(value) or (hasattr(value, "__next__") and hasattr(value, "__iter__")):
        return Recorded(_read_batches(name, value))
    raise UsageError(f"tune(): {name} must be what model.fit(x=...) takes: arrays ((x, y), x, "
                     "or a dict), a tf.data.Dataset, a keras.utils.PyDataset, a generator of "
                     "batches, or a function returning one of them. Received: "
                     f"{name}={value!r:.80}")


def _is_dataset(value: Any) -> bool:
    return type(value).__module__.startswith("tensorflow") and hasattr(value, "element_spec")


def _is_py_dataset(value: Any) -> bool:
    return any(kind.__name__ == "PyDataset" and kind.__module__.startswith("keras")
               for kind in type(value).__mro__)


def _read_batches(name: str, source: Any) -> list:
    """The first batches of ``source`` as NumPy, up to ``RECORDED_BATCHES`` or
    ``RECORDED_BYTES``, whichever comes first (an endless source included)."""
    import itertools

    import numpy as np

    if _is_dataset(source):
        source = source.take(RECORDED_BATCHES).as_numpy_iterator()
    batches, size = [], 0
    try:
        for element in itertools.islice(source, RECORDED_BATCHES):
            leaves = element if isinstance(element, (tuple, list)) else (element,)
            size += sum(np.asarray(leaf).nbytes for leaf in _leaves(leaves))
            batches.append(element)
            if size >= RECORDED_BYTES:
                break
    except Exception as exc:  # noqa: BLE001 - the user's pipeline failed: say where
        raise UsageError(f"tune(): reading {name} raised {type(exc).__name__}: "
                         f"{str(exc)[:200]}. Fix the data pipeline.") from None
    if not batches:
        raise UsageError(f"tune(): {name} yielded no batch. Pass data with at least one.")
    return batches


def _leaves(structure: Any) -> list:
    if isinstance(structure, dict):
        return [leaf for value in structure.values() for leaf in _leaves(value)]
    if isinstance(structure, (tuple, list)):
        return [leaf for value in structure for leaf in _leaves(value)]
    return [] if structure is None else [structure]


def task_objects(build_model, train_data, loss, optimizer=None, val_data=None, metrics=None,
                 batch_size=None, class_weight=None, train_step=None) -> dict[str, Any]:
    """The task contract's names for these objects, checked: one-line UsageErrors."""
    missing = [name for name, value in (("build_model", build_model), ("train_data", train_data))
               if value is None] + (["loss"] if loss is LOSS_NOT_GIVEN and train_step is None
                                    else [])
    if missing:
        raise UsageError(f"tune() without a task file needs build_model, train_data and loss; "
                         f"missing: {', '.join(missing)}. Pass them (loss=None for a train_step "
                         "that computes its own loss), or a task file path.")
    if train_step is not None and not callable(train_step):
        raise UsageError(f"tune(): train_step must be a function train_step(model, optimizer, "
                         f"batch) returning the step's loss. Received: train_step="
                         f"{train_step!r:.80}")
    if not callable(build_model):
        raise UsageError(f"tune(): build_model must be a function returning a new, uncompiled "
                         f"Keras model. Received: build_model={build_model!r:.80}")
    if optimizer is not None and not callable(optimizer):
        raise UsageError(f"tune(): optimizer must be a function returning a new optimizer (each "
                         f"trial needs its own), e.g. lambda: keras.optimizers.Adam(1e-3). "
                         f"Received: optimizer={optimizer!r:.80}")
    objects = {"build_model": build_model, "train_data": _data_function("train_data", train_data),
               "LOSS": None if loss is LOSS_NOT_GIVEN else loss, "train_step": train_step,
               "BATCH_SIZE": 32 if batch_size is None else batch_size,
               "make_optimizer": optimizer, "val_data": _data_function("val_data", val_data),
               "METRICS": metrics, "CLASS_WEIGHT": class_weight}
    return {name: value for name, value in objects.items()
            if value is not None or name == "LOSS"}


def write_task(path: Path, objects: dict[str, Any]) -> Path:
    """Write the task file for ``objects`` (from ``task_objects``) at ``path``, and its data
    file beside it (``path`` with the suffix ``.pkl``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = path.with_suffix(".pkl")
    size, digest = _pickle_to(data, objects)
    optional = "".join(f'{name} = _TASK["{name}"]\n' for name in _OPTIONAL if name in objects)
    path.write_text(_TEMPLATE.format(name=data.name, size=size, digest=digest,
                                     data_line=data_line(data.name), optional=optional))
    return path


def _pickle_to(path: Path, objects: dict[str, Any]) -> tuple[int, str]:
    """Pickle ``objects`` into ``path`` (whole or not at all); its size and SHA-256."""
    try:
        return data_file.write(path, objects)
    except Exception as exc:  # noqa: BLE001 - any pickling error is the user's object
        if isinstance(exc, OSError):   # the disk's, not the objects'
            raise
        raise UsageError(f"tune(): the model, data or loss could not be pickled for the workers "
                         f"({type(exc).__name__}: {first_line(exc, 160)}). Define them at the "
                         "top level of the notebook or script, or pass a task file; for data, "
                         "a function that builds the dataset (not one returning a dataset made "
                         "outside it), or the dataset object itself (tune() reads its first "
                         "batches).") from None
