"""A task file for a model, data and loss defined in Python (a notebook's cells, a script's
``__main__``): the objects are pickled by value with cloudpickle and embedded in the file, so
that a worker loads it like any task file, on this machine or on a Ray node (Ray ships the
task file's text).

The file defines the task contract's names at its top level, as a hand-written one does.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, Callable

from tuner.errors import UsageError

_TEMPLATE = '''"""Written by tuner.tune() from objects defined in Python; do not edit (tune again)."""
import base64

import cloudpickle

_TASK = cloudpickle.loads(base64.b64decode(_PICKLED))
build_model = _TASK["build_model"]
train_data = _TASK["train_data"]
LOSS = _TASK["LOSS"]
BATCH_SIZE = _TASK["BATCH_SIZE"]
{optional}'''
_OPTIONAL = ("make_optimizer", "val_data", "METRICS")


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


def _data_function(name: str, value: Any) -> Callable[[], Any]:
    if value is None or callable(value):
        return value
    if isinstance(value, (tuple, list, dict)) or hasattr(value, "shape"):
        return Returns(value)
    raise UsageError(f"tune(): {name} must be arrays ((x, y), x, or a dict) or a function "
                     f"returning them or a tf.data.Dataset. Received: {name}={value!r:.80}")


def task_objects(build_model, train_data, loss, optimizer=None, val_data=None, metrics=None,
                 batch_size=None) -> dict[str, Any]:
    """The task contract's names for these objects, checked: one-line UsageErrors."""
    missing = [name for name, value in (("build_model", build_model), ("train_data", train_data))
               if value is None] + (["loss"] if loss is LOSS_NOT_GIVEN else [])
    if missing:
        raise UsageError(f"tune() without a task file needs build_model, train_data and loss; "
                         f"missing: {', '.join(missing)}. Pass them (loss=None for a train_step "
                         "that computes its own loss), or a task file path.")
    if not callable(build_model):
        raise UsageError(f"tune(): build_model must be a function returning a new, uncompiled "
                         f"Keras model. Received: build_model={build_model!r:.80}")
    if optimizer is not None and not callable(optimizer):
        raise UsageError(f"tune(): optimizer must be a function returning a new optimizer (each "
                         f"trial needs its own), e.g. lambda: keras.optimizers.Adam(1e-3). "
                         f"Received: optimizer={optimizer!r:.80}")
    objects = {"build_model": build_model, "train_data": _data_function("train_data", train_data),
               "LOSS": loss, "BATCH_SIZE": 32 if batch_size is None else batch_size,
               "make_optimizer": optimizer, "val_data": _data_function("val_data", val_data),
               "METRICS": metrics}
    return {name: value for name, value in objects.items()
            if value is not None or name == "LOSS"}


def write_task(path: Path, objects: dict[str, Any]) -> Path:
    """Write the task file for ``objects`` (from ``task_objects``) at ``path``."""
    import cloudpickle

    try:
        pickled = cloudpickle.dumps(objects)
    except Exception as exc:  # noqa: BLE001 - any pickling error is the user's object
        raise UsageError(f"tune(): the model, data or loss could not be pickled for the workers "
                         f"({type(exc).__name__}: {exc}). Define them at the top level of the "
                         "notebook or script, or pass a task file.") from None
    optional = "".join(f'{name} = _TASK["{name}"]\n' for name in _OPTIONAL if name in objects)
    encoded = base64.b64encode(pickled).decode("ascii")
    text = _TEMPLATE.format(optional=optional).replace(
        "import base64\n", f"import base64\n\n_PICKLED = {encoded!r}\n", 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
