"""A saved model that ``build_model()`` cannot load, said in one line: which file, why, the fix.

Keras's own errors for a model file that does not load are long and name the fix only in
part (an unregistered custom layer is reported as the *model* that "could not be deserialized
properly", with the class name buried in a dumped config). ``model_file_failure(exc)`` reads
the failing call's frames for the file it was loading (``keras.models.load_model``,
``model.load_weights``: their ``filepath`` argument) and turns the kinds a user meets into a
line the task check raises as a TaskError (exit 2, before any trial).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tuner.errors import first_line

_LOADERS = ("load_model", "load_weights")
_UNKNOWN_CLASS = re.compile(r"Could not locate (?:class|function) '([^']+)'")


def _loaded_file(exc: BaseException) -> str | None:
    """The ``filepath`` of the outermost load call in the exception's traceback."""
    traceback = exc.__traceback__
    found = None
    while traceback is not None:
        frame = traceback.tb_frame
        if frame.f_code.co_name in _LOADERS and "filepath" in frame.f_locals:
            found = found or frame.f_locals["filepath"]
        traceback = traceback.tb_next
    return None if found is None else os.fspath(found) if isinstance(found, os.PathLike) \
        else str(found)


def _chain_text(exc: BaseException) -> str:
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def model_file_failure(exc: BaseException, task_name: str) -> str | None:
    """One line for a model file that ``build_model()`` of ``task_name`` could not load, or
    None when the failure was not a model file's."""
    path = _loaded_file(exc)
    if path is None:
        return None
    where = path if os.path.isabs(path) else f"{path} (relative to the working directory " \
        f"{os.getcwd()})"
    text = _chain_text(exc)
    start = f"build_model() in {task_name} could not load the model file {where}"
    unknown = _UNKNOWN_CLASS.search(text)
    if unknown:
        name = unknown.group(1)
        return (f"{start}: it uses the custom class {name!r}, which is not registered. Fix: "
                f"define or import {name} in the task file, decorated with "
                f"@keras.saving.register_keras_serializable(), or pass "
                f"custom_objects={{{name!r}: {name}}} to load_model()")
    if isinstance(exc, FileNotFoundError) or "File not found" in text \
            or not Path(path).exists():
        return (f"{start}: no such file. Fix: save the model there, or give build_model() "
                "the file's path (beside the task file: "
                "Path(__file__).with_name('model.keras'))")
    if Path(path).is_dir() and (Path(path) / "saved_model.pb").exists():
        return (f"{start}: it is a TensorFlow SavedModel directory (Keras 2), which Keras 3 "
                "cannot load as a trainable model. Fix: load it where it was made (Keras 2 or "
                "tf_keras) and save it as .keras (model.save('model.keras')), or rebuild the "
                "model in code and load its weights")
    if "File format not supported" in text:
        return (f"{start}: Keras 3 loads only .keras files and legacy .h5 files. Fix: save "
                "the model as .keras (model.save('model.keras'))")
    return (f"{start}: {type(exc).__name__}: {first_line(exc, 200)}. Fix: check that the file "
            "was saved by model.save() (a .keras or .h5 file) and loads in plain Keras")
