"""Turn an exception raised inside a trial into a failure class, a one-line message and a layer."""

from __future__ import annotations

import re
import traceback
from types import TracebackType

from tuner.trial_types import FailureClass

_DTYPE_PATTERNS = [re.compile(p, re.IGNORECASE) for p in (
    r"have types \[.*\] that don't all match",
    r"was expected to be a \w+ tensor but is a \w+ tensor",
    r"expected to be of type \w+ but is",
    r"Tensor conversion requested dtype \w+ for Tensor with dtype \w+",
    r"Incompatible type conversion requested",
    r"must have the same dtype",
    r"dtype mismatch",
    r"cannot compute \w+ as input #\d+",
    r"has type \w+ that does not match type \w+",
    r"has type \w+ that does not match expected type",
)]
_OOM_PATTERNS = [re.compile(p, re.IGNORECASE) for p in (
    r"\bOOM when allocating", r"out of memory", r"ResourceExhausted", r"failed to allocate")]
_NODE_PATTERN = re.compile(r"(?:node|name:)\s+'?([A-Za-z_][\w.\-]*)(?:/[\w.\-/]*)?")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_line(exc: BaseException) -> str:
    """The most telling line of an error message (Keras wraps the real error in a preamble)."""
    lines = [_ANSI.sub("", line).strip() for line in str(exc).strip().splitlines()]
    lines = [line for line in lines if line and not line.startswith(("Traceback", "File "))]
    for line in lines:
        if any(p.search(line) for p in _DTYPE_PATTERNS + _OOM_PATTERNS):
            return _clean(line)
    if "Error encountered:" in lines:
        inner = lines.index("Error encountered:") + 1
        if inner < len(lines):
            return _clean(lines[inner])
    return _clean(lines[0]) if lines else type(exc).__name__


def _clean(line: str) -> str:
    # TensorFlow prefixes messages with `{{function_node ...}}`; drop that noise.
    return re.sub(r"\{\{function_node [^}]*\}\}\s*", "", line)[:300]


def innermost_layer(tb: TracebackType | None) -> str | None:
    """Name of the innermost Keras layer (not the model) whose code is on the traceback."""
    try:
        import keras
    except ImportError:  # pragma: no cover - the worker always has Keras
        return None
    found = None
    model_found = None
    for frame, _ in traceback.walk_tb(tb):
        owner = frame.f_locals.get("self")
        if isinstance(owner, keras.Model):
            model_found = owner.name
        elif isinstance(owner, keras.layers.Layer):
            found = owner.name
    return found or model_found


def classify(exc: BaseException, *, stage: str) -> tuple[FailureClass, str, str | None]:
    """``stage`` is where it happened: "task" (user code: build/data) or "train"."""
    text = f"{type(exc).__name__}: {exc}"
    layer = innermost_layer(exc.__traceback__)
    if layer is None:
        node = _NODE_PATTERN.search(str(exc))
        layer = node.group(1) if node else None
    message = f"{type(exc).__name__}: {first_line(exc)}"
    if isinstance(exc, MemoryError) or any(p.search(text) for p in _OOM_PATTERNS):
        return FailureClass.OUT_OF_MEMORY, message, layer
    if any(p.search(text) for p in _DTYPE_PATTERNS):
        where = f" in layer {layer}" if layer else ""
        fix = (f"; fix: keep {layer} in float32 (float32.layers: [{layer}]) or cast its inputs"
               if layer else "; fix: keep the offending layer in float32 or cast its inputs")
        return FailureClass.DTYPE_MISMATCH, f"dtype mismatch{where}: {first_line(exc)}{fix}", layer
    if stage == "task":
        return FailureClass.TASK_ERROR, message, layer
    return FailureClass.OTHER, message, layer
