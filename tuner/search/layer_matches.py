"""Which layers a float32 placement selects in a model, from the task check's report. No
TensorFlow: ``matches`` is plain data (``check_task(...)["float32_matches"]``)."""

from __future__ import annotations

import difflib
import fnmatch
from typing import Any, Mapping, Sequence

from tuner.apply.config import Float32Placement, PrecisionConfig


def effective_placement(config: PrecisionConfig, matches: Mapping[str, Any]) -> Float32Placement:
    """The part of ``config.float32`` that changes something on this model.

    Under the float32 policy nothing does. Otherwise a group or pattern that selects no layer
    is left out, and so is a pattern whose layers the groups and earlier patterns already place
    (placing a layer places everything inside it). Two configs with equal effective placements
    train the same model the same way; an exported config names only these placements.
    ``matches`` as for :meth:`SearchSpace.fitted`.
    """
    if config.policy == "float32":
        return Float32Placement()
    groups = tuple(g for g in config.float32.groups if group_paths(matches, g))
    placed = [path for group in groups for path in group_paths(matches, group)]
    patterns = []
    for pattern in config.float32.layers:
        paths = pattern_paths(matches, pattern)
        if any(not _inside_any(path, placed) for path in paths):
            patterns.append(pattern)
            placed += paths
    return Float32Placement(groups, tuple(patterns), config.float32.outputs)


def placed_layers(config: PrecisionConfig, matches: Mapping[str, Any]) -> dict[str, Any]:
    """Per group and pattern of ``config.float32``, the model's layers it selects (plain data
    for a trial's summary line and MLflow): ``{"groups": {group: [path, ...]}, "layers":
    {pattern: [path, ...]}}``; empty under the float32 policy, where placement does nothing."""
    if config.policy == "float32":
        return {"groups": {}, "layers": {}}
    return {"groups": {group: group_paths(matches, group) for group in config.float32.groups},
            "layers": {pattern: pattern_paths(matches, pattern)
                       for pattern in config.float32.layers}}


def group_paths(matches: Mapping[str, Any], group: str) -> list[str]:
    return list(matches.get("groups", {}).get(group) or [])


def pattern_paths(matches: Mapping[str, Any], pattern: str) -> list[str]:
    """The layers a pattern selects: as the task check reported, else matched here the way the
    worker matches (a glob on the layer's path or on its name, the path's last part)."""
    reported = matches.get("layers", {}).get(pattern)
    if reported is not None:
        return list(reported)
    return [path for path in matches.get("all_layers", [])
            if fnmatch.fnmatchcase(path, pattern)
            or fnmatch.fnmatchcase(path.rpartition("/")[2], pattern)]


def _inside_any(path: str, placed: Sequence[str]) -> bool:
    return any(path == outer or path.startswith(outer + "/") for outer in placed)


def no_layer_message(source: str, pattern: str, matches: Mapping[str, Any]) -> str:
    paths = list(matches.get("all_layers", []))
    candidates = paths + sorted({path.rpartition("/")[2] for path in paths} - set(paths))
    close = difflib.get_close_matches(pattern, candidates, n=3, cutoff=0.4)
    hint = f"closest layers: {', '.join(close)}" if close else \
        f"the model's layers are: {', '.join(paths[:8])}{', ...' if len(paths) > 8 else ''}"
    return (f"{source}: float32.layers pattern {pattern!r} matches no layer of the model; "
            f"{hint}. Use a layer name or path (glob patterns allowed), or remove the pattern.")
