"""Turn an exception raised inside a trial into a failure class, a one-line reason and a layer.

TensorFlow's runtime errors (``InvalidArgumentError``, ``ResourceExhaustedError``, ...) open
with "Graph execution error:", then a stack of where the failing op was defined, then the real
message, then the op's node (``[[{{node functional_1/embed_1/GatherV2}}]]``). Keras's own
errors wrap the real message between "Exception encountered when calling ..." and "Arguments
received by ...". :func:`read_error` finds the real message, the node and the last frame of the
user's own code; :func:`layer_for_node` maps the node's name scopes back to the Keras layer
that owns it (TensorFlow uniquifies scopes as ``embed_1``); :func:`classify` names the cause and
the fix in the model's terms.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Sequence

import tuner
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
    r"Cannot convert a list containing a tensor of dtype",
)]
_OOM_PATTERNS = [re.compile(p, re.IGNORECASE) for p in (
    r"\bOOM when allocating", r"out of memory", r"ResourceExhausted", r"failed to allocate")]
_INDEX_PATTERN = re.compile(r"indices\[[^\]]*\] = -?\d+ is not in \[-?\d+, ?-?\d+\)")
_NUMERIC_PATTERN = re.compile(r"Tensor had (?:NaN|Inf|NaN and Inf) values|CheckNumerics",
                              re.IGNORECASE)
_TELLING = _DTYPE_PATTERNS + _OOM_PATTERNS + [_INDEX_PATTERN, _NUMERIC_PATTERN]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NODE = re.compile(r"(?:Detected at node|\{\{node) '?([A-Za-z_][\w.\-/]*)")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_PREAMBLE = ("Graph execution error", "Detected at node", "Traceback", "File ", "[[",
             "Exception encountered when calling", "Arguments received by", "•",
             "Error encountered:", "Stack trace for op definition", "Node:")
_TF_NOISE = (re.compile(r"\{\{function_node [^}]*\}\}\s*"),
             re.compile(r"\s*\[\[\{\{node [^}]*\}\}\]\]"),
             re.compile(r"\s*\[Op:[^\]]*\]( name: ?\S*)?"))
_MESSAGE_LIMIT = 240
_OUR_CODE = Path(tuner.__file__).resolve().parent


@dataclass(frozen=True)
class ErrorReading:
    """What an exception says, read past TensorFlow's and Keras's wrapping."""

    message: str             # the real message, one line
    node: str | None         # the failing op's node, for TensorFlow runtime errors
    user_frame: str | None   # "task.py:26 in call": the last frame in the user's own code


def read_error(exc: BaseException) -> ErrorReading:
    text = _ANSI.sub("", str(exc))
    lines = [line.strip() for line in text.strip().splitlines()]
    node = _NODE.search(text)
    return ErrorReading(message=_real_message(lines) or type(exc).__name__,
                        node=node.group(1) if node else None,
                        user_frame=_user_frame(text, exc.__traceback__))


def _real_message(lines: list[str]) -> str:
    kept = [_clean(line) for line in lines if line and not line.startswith(_PREAMBLE)]
    kept = [line for line in kept if line]
    for line in kept:
        if any(p.search(line) for p in _TELLING):
            return line
    return kept[0] if kept else ""


def _clean(line: str) -> str:
    for noise in _TF_NOISE:
        line = noise.sub("", line)
    line = line.strip()
    return line if len(line) <= _MESSAGE_LIMIT else line[:_MESSAGE_LIMIT - 3] + "..."


def _is_user_file(path: str) -> bool:
    if path.startswith("<") or {"site-packages", "dist-packages"} & set(Path(path).parts):
        return False
    return not Path(path).resolve().is_relative_to(_OUR_CODE)


def _user_frame(text: str, tb: TracebackType | None) -> str | None:
    # A graph error lists where its op was defined; a Python error has its own traceback.
    frames = [(path, int(line), name) for path, line, name in _FRAME.findall(text)]
    if not frames and tb is not None:
        frames = [(frame.filename, frame.lineno or 0, frame.name)
                  for frame in traceback.extract_tb(tb)]
    frames = [frame for frame in frames if _is_user_file(frame[0])]
    if not frames:
        return None
    path, line, name = frames[-1]
    return f"{Path(path).name}:{line} in {name}"


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


def _scope_matches(scope: str, name: str) -> int:
    """2: the node's name scope is the layer's name; 1: it is the name uniquified (``_3``)."""
    if scope == name:
        return 2
    return 1 if re.fullmatch(re.escape(name) + r"_\d+", scope) else 0


def layer_for_node(node: str, layer_paths: Sequence[str]) -> str | None:
    """The path of the deepest layer whose name scopes the node lies in, or None.

    ``functional_1/token_embedding_1/GatherV2`` lies in layer ``token_embedding`` (a functional
    model's layers are scoped under the model's uniquified name, their paths are not).
    """
    scopes = node.split("/")[:-1]
    best, best_score = None, (0, 0)
    for path in layer_paths:
        names = path.split("/")
        for start in range(len(scopes) - len(names) + 1):
            matches = [_scope_matches(scopes[start + i], name) for i, name in enumerate(names)]
            if all(matches):
                score = (len(names), sum(matches))
                if score > best_score:
                    best, best_score = path, score
                break
    return best


def classify(exc: BaseException, *, stage: str, layer_paths: Sequence[str] = (),
             loss_layers: Sequence[str] = ()) -> tuple[FailureClass, str, str | None]:
    """``stage`` is where it happened: "task" (user code: build/data) or "train".

    ``layer_paths`` are the model's layers (when it was built), to map a failing op's node to
    its layer; ``loss_layers`` those that added a 16-bit loss term (``add_loss``), which Keras
    sums with the float32 ones. Returns the class, a one-line reason that names the layer or
    the cause, with a fix where there is one, and the layer.
    """
    reading = read_error(exc)
    text = f"{type(exc).__name__}: {exc}"
    layer = layer_for_node(reading.node, layer_paths) if reading.node else None
    layer = layer or innermost_layer(exc.__traceback__)
    if layer is None and reading.node:  # no paths to match: the scope after the model's
        scopes = reading.node.split("/")
        layer = re.sub(r"_\d+$", "", scopes[1] if len(scopes) > 2 else scopes[0])
    if layer and layer_paths and not any(path == layer or path.endswith("/" + layer)
                                         for path in layer_paths):
        layer = None   # the model itself (its train_step): keeping it in float32 is no repair
    where = f" in layer {layer}" if layer else ""
    at = f" (at {reading.user_frame})" if reading.user_frame else ""
    keep = (f"keep {layer} in float32 (float32.layers: [{layer}])" if layer
            else "keep the offending layer in float32")
    if isinstance(exc, MemoryError) or any(p.search(text) for p in _OOM_PATTERNS):
        return (FailureClass.OUT_OF_MEMORY,
                f"out of memory{where}: {reading.message}{at}; fix: a smaller BATCH_SIZE, or "
                "fewer float32 placements", layer)
    if any(p.search(text) for p in _DTYPE_PATTERNS):
        if layer is None and loss_layers:
            layer = loss_layers[0]
            where = (f" in layer {layer} (its add_loss term is 16-bit; the model sums it with "
                     "float32 losses)")
            keep = f"keep {layer} in float32 (float32.layers: [{layer}])"
        fix = f"{keep} or cast its inputs"
        if layer is None:  # in the loss, a metric or a train_step: the predictions' dtype
            fix = ("float32 outputs (float32.outputs: true: the loss and metrics then see "
                   "float32 predictions), or cast the predictions there")
        return (FailureClass.DTYPE_MISMATCH,
                f"dtype mismatch{where}: {reading.message}{at}; fix: {fix}", layer)
    if _INDEX_PATTERN.search(text):
        return (FailureClass.INDEX_OUT_OF_RANGE,
                f"index out of range{where}: {reading.message}{at}; fix: if the ids reach "
                f"{layer or 'the layer'} as floats, 16-bit rounding moved them: {keep} or feed "
                "them as int32", layer)
    if _NUMERIC_PATTERN.search(text):
        return (FailureClass.NUMERIC_CHECK,
                f"non-finite values caught by a numerics check{where}: {reading.message}{at}; "
                f"fix: {keep}, or a loss scale", layer)
    if stage == "task":
        return (FailureClass.TASK_ERROR, f"the task's own code raised {type(exc).__name__}"
                f"{where}: {reading.message}{at}", layer)
    return FailureClass.OTHER, f"{type(exc).__name__}{where}: {reading.message}{at}", layer


def classify_on(model, exc: BaseException, *, stage: str) -> tuple[FailureClass, str, str | None]:
    """``classify`` with what it needs read off ``model`` (None: not built when it failed):
    a trial's failure and a bench measurement's are read alike."""
    paths, loss_layers = _failure_context(model)
    return classify(exc, stage=stage, layer_paths=paths, loss_layers=loss_layers)


def _failure_context(model) -> tuple[list[str], list[str]]:
    """What ``classify`` needs from the model, in one walk of its layers: every layer's path,
    and the layers whose last call added a loss term that is not float32 (``add_loss``)."""
    if model is None:
        return [], []
    from tuner.apply.keras_internals import added_losses
    from tuner.apply.layers import layer_paths

    try:
        pairs = layer_paths(model)
    except Exception:  # noqa: BLE001 - naming the layer is a courtesy; never fail on it
        return [], []
    loss_layers = [path for layer, path in pairs
                   if any(getattr(term, "dtype", "float32") not in ("float32", "float64")
                          for term in added_losses(layer))]
    return [path for _, path in pairs], loss_layers
