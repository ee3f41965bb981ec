"""Search-space YAML files: built-in names, parsing and validation into ``SearchSpace``.

Every error names the file, the key and the bad value, and says how to fix it (one line).
"""

from __future__ import annotations

import math
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

from tuner.apply.config import FLOAT32_GROUPS, POLICIES
from tuner.apply.vocabulary import LOSS_SCALE_KINDS, WEIGHT_UPDATES
from tuner.errors import SearchSpaceError, describe
from tuner.search.space import MIN_TIMED_STEPS, SearchSpace, TrialBudget

_REPO_SPACES = Path(__file__).resolve().parents[2] / "search_spaces"


def _choices(source: str, key: str, value: object, check, expected: str) -> tuple:
    if not isinstance(value, list) or not value:
        raise SearchSpaceError(f"{source}: `{key}` must be a non-empty list. Received: {key}="
                               f"{describe(value)}. Write it as a YAML list, e.g. {key}: [a, b]")
    for item in value:
        if not check(item):
            raise SearchSpaceError(f"{source}: bad choice in `{key}`: expected {expected}. "
                                   f"Received: {describe(item)}")
    if len(set(value)) != len(value):
        raise SearchSpaceError(f"{source}: `{key}` lists a choice twice: {value}. Remove the "
                               "duplicate.")
    return tuple(value)


def _positive(item: object) -> bool:
    return (not isinstance(item, bool) and isinstance(item, (int, float))
            and math.isfinite(item) and item > 0)


def _positive_or_null(item: object) -> bool:
    return item is None or _positive(item)


def _int_at_least(minimum: int):
    return lambda item: isinstance(item, int) and not isinstance(item, bool) and item >= minimum


def _mapping(source: str, key: str, value: object, allowed: Sequence[str]) -> Mapping:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SearchSpaceError(f"{source}: `{key}` must be a mapping. Received: {key}="
                               f"{describe(value)}")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        prefix = f"{key}." if key else ""
        raise SearchSpaceError(f"{source}: unknown key `{prefix}{unknown[0]}`; allowed: "
                               f"{', '.join(allowed)}. Remove or rename it.")
    return value


def _parse(data: object, source: str, name: str) -> SearchSpace:
    top = _mapping(source, "", data, ("description", "policies", "loss_scale", "epsilon",
                                      "float32", "weight_updates", "trials", "trial"))
    kwargs: dict[str, Any] = {"name": name, "description": str(top.get("description", ""))}
    kwargs.update(_policies(source, top))
    kwargs.update(_loss_scale(source, top))
    kwargs.update(_epsilons(source, top))
    kwargs.update(_placement(source, top))
    if "weight_updates" in top:
        kwargs["weight_updates"] = _choices(source, "weight_updates", top["weight_updates"],
                                            lambda u: u in WEIGHT_UPDATES,
                                            f"one of {', '.join(WEIGHT_UPDATES)}")
    if "trials" in top:
        if not _int_at_least(1)(top["trials"]):
            raise SearchSpaceError(f"{source}: `trials` must be an integer >= 1. Received: "
                                   f"trials={describe(top['trials'])}")
        kwargs["trials"] = top["trials"]
    kwargs["budget"] = _budget(source, top)
    return SearchSpace(**kwargs)


def _policies(source: str, top: Mapping) -> dict[str, Any]:
    if "policies" not in top:
        return {}
    policies = _choices(source, "policies", top["policies"], lambda p: p in POLICIES,
                        f"one of {', '.join(POLICIES)}")
    if "float32" not in policies:
        raise SearchSpaceError(f"{source}: `policies` must include float32 (the baseline every "
                               f"trial is judged against). Received: {list(policies)}. Add "
                               "float32.")
    return {"policies": policies}


def _loss_scale(source: str, top: Mapping) -> dict[str, Any]:
    scale = _mapping(source, "loss_scale", top.get("loss_scale"),
                     ("kinds", "initial_scales", "growth_steps", "fixed_values", "floor"))
    kwargs: dict[str, Any] = {}
    if "kinds" in scale:
        kwargs["loss_scale_kinds"] = _choices(source, "loss_scale.kinds", scale["kinds"],
                                              lambda k: k in LOSS_SCALE_KINDS,
                                              f"one of {', '.join(LOSS_SCALE_KINDS)}")
    if isinstance(scale.get("initial_scales"), list) and "auto" in scale["initial_scales"]:
        listed = [v for v in scale["initial_scales"] if v != "auto"]
        kwargs["auto_initial_scale"] = "add" if listed else "only"
        scale = {**scale, "initial_scales": listed or [2.0**15]}  # 2^15 until diagnosed
    for key, check, expected in (
            ("initial_scales", _positive, "a positive number or auto"),
            ("fixed_values", _positive, "a positive number"),
            ("growth_steps", _int_at_least(1), "an integer >= 1")):
        if key in scale:
            values = _choices(source, f"loss_scale.{key}", scale[key], check, expected)
            kwargs[key] = tuple(float(v) for v in values) if key != "growth_steps" else values
    if "floor" in scale:
        if not _positive(scale["floor"]):
            raise SearchSpaceError(f"{source}: `loss_scale.floor` must be a positive number. "
                                   f"Received: floor={describe(scale['floor'])}")
        kwargs["loss_scale_floor"] = float(scale["floor"])
    floor = kwargs.get("loss_scale_floor", 1.0)
    low = [v for v in kwargs.get("initial_scales", ()) if v <= floor]
    if low:
        raise SearchSpaceError(f"{source}: `loss_scale.initial_scales` must be above the floor "
                               f"({floor:g}), or the scale counts as collapsed before the first "
                               f"step. Received: {low[0]:g}. Raise it or lower `floor`.")
    return kwargs


def _epsilons(source: str, top: Mapping) -> dict[str, Any]:
    epsilon = _mapping(source, "epsilon", top.get("epsilon"), ("backend", "optimizer"))
    return {f"{key}_epsilons": tuple(
                None if v is None else float(v) for v in
                _choices(source, f"epsilon.{key}", epsilon[key], _positive_or_null,
                         "a positive number or null (keep the default)"))
            for key in ("backend", "optimizer") if key in epsilon}


def _placement(source: str, top: Mapping) -> dict[str, Any]:
    placement = _mapping(source, "float32", top.get("float32"), ("groups", "layers",
                                                                 "auto_layers"))
    kwargs: dict[str, Any] = {}
    if "auto_layers" in placement:
        if not _int_at_least(0)(placement["auto_layers"]):
            raise SearchSpaceError(f"{source}: `float32.auto_layers` must be an integer >= 0 "
                                   f"(how many of the riskiest diagnosed layers may go to "
                                   f"float32). Received: auto_layers="
                                   f"{describe(placement['auto_layers'])}")
        kwargs["float32_auto_layers"] = placement["auto_layers"]
    if placement.get("groups"):
        kwargs["float32_groups"] = _choices(source, "float32.groups", placement["groups"],
                                            lambda g: g in FLOAT32_GROUPS,
                                            f"one of {', '.join(FLOAT32_GROUPS)}")
    if placement.get("layers"):
        kwargs["float32_layers"] = _choices(source, "float32.layers", placement["layers"],
                                            lambda p: isinstance(p, str) and bool(p),
                                            "a layer name or glob pattern")
    return kwargs


def _budget(source: str, top: Mapping) -> TrialBudget:
    trial = _mapping(source, "trial", top.get("trial"), [f.name for f in fields(TrialBudget)])
    for key, value in trial.items():
        if key in ("steps", "warmup_steps"):
            ok = _int_at_least(1 if key == "steps" else 0)(value)
        elif key == "max_skipped_fraction":
            ok = _positive(value) and value <= 1
        else:
            ok = _positive(value)
        if not ok:
            raise SearchSpaceError(f"{source}: bad `trial.{key}`. Received: {key}="
                                   f"{describe(value)}")
    budget = TrialBudget(**trial)
    if budget.warmup_steps + MIN_TIMED_STEPS > budget.steps:
        raise SearchSpaceError(f"{source}: `trial.steps` ({budget.steps}) must exceed "
                               f"warmup_steps ({budget.warmup_steps}) by at least "
                               f"{MIN_TIMED_STEPS}, so that step times can be measured after "
                               "warm-up.")
    return budget


def looks_like_path(text: str) -> bool:
    """A space given as a YAML file rather than a built-in name."""
    return text.endswith((".yaml", ".yml")) or "/" in text


def builtin_space_names() -> list[str]:
    names = set()
    packaged = resources.files("tuner").joinpath("search_spaces")
    if packaged.is_dir():
        names |= {p.name[:-5] for p in packaged.iterdir() if p.name.endswith(".yaml")}
    if _REPO_SPACES.is_dir():
        names |= {p.stem for p in _REPO_SPACES.glob("*.yaml")}
    return sorted(names)


def _builtin_text(name: str) -> str | None:
    packaged = resources.files("tuner").joinpath("search_spaces", f"{name}.yaml")
    if packaged.is_file():  # a wheel install carries the YAML files inside the package
        return packaged.read_text()
    repo_file = _REPO_SPACES / f"{name}.yaml"  # a source checkout / editable install
    return repo_file.read_text() if repo_file.is_file() else None


def load_space(name_or_path: str | Path) -> SearchSpace:
    """Load a search space by built-in name (``quick``) or by path to a YAML file."""
    import yaml

    text_or_path = str(name_or_path)
    if looks_like_path(text_or_path):
        path = Path(text_or_path)
        if not path.is_file():
            raise SearchSpaceError(f"search space file not found: {text_or_path!r}. Check the path "
                                   f"or use a built-in space: {', '.join(builtin_space_names())}")
        text, source, name = path.read_text(), str(path), path.stem
    else:
        text = _builtin_text(text_or_path)
        if text is None:
            raise SearchSpaceError(f"unknown search space {text_or_path!r}. Use one of "
                                   f"{', '.join(builtin_space_names())}, or a path to a YAML file.")
        source, name = f"search space {text_or_path!r}", text_or_path
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise SearchSpaceError(f"{source}: YAML syntax error{where}: {problem}. Fix the "
                               "file.") from None
    return _parse(data if data is not None else {}, source, name)
