"""Search spaces: YAML files parsed into frozen, self-validating dataclasses.

Every dimension is a list of choices, so a space is both what Optuna samples from and a finite
grid. Loss-scale dimensions are only sampled where the policy computes in float16.
No TensorFlow and no Optuna here: sampling goes through any object with Optuna's
``suggest_categorical(name, choices)``.
"""

from __future__ import annotations

import difflib
import fnmatch
import itertools
import math
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any, Iterator, Mapping, Protocol, Sequence

from tuner.config import (FLOAT32_GROUPS, LOSS_SCALE_KINDS, POLICIES, Epsilon, Float32Placement,
                          LossScale, PrecisionConfig, compute_dtype_of)
from tuner.errors import SearchSpaceError, describe

_REPO_SPACES = Path(__file__).resolve().parent.parent / "search_spaces"


class Suggester(Protocol):
    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...


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


@dataclass(frozen=True)
class TrialBudget:
    """How long each trial trains and how it is judged."""

    steps: int = 30
    warmup_steps: int = 5
    max_skipped_fraction: float = 0.2
    min_loss_decrease_ratio: float = 0.9


@dataclass(frozen=True)
class SearchSpace:
    name: str
    description: str = ""
    policies: tuple[str, ...] = ("float32", "mixed_float16", "mixed_bfloat16")
    loss_scale_kinds: tuple[str, ...] = ("none", "dynamic")
    initial_scales: tuple[float, ...] = (2.0**15,)
    # "auto" in initial_scales: add the scale diagnostics recommends ("only": it alone).
    auto_initial_scale: str = ""           # "" | "add" | "only"
    growth_steps: tuple[int, ...] = (2000,)
    fixed_values: tuple[float, ...] = (2.0**10,)
    loss_scale_floor: float = 1.0
    backend_epsilons: tuple[float | None, ...] = (None,)
    optimizer_epsilons: tuple[float | None, ...] = (None,)
    float32_groups: tuple[str, ...] = ()
    float32_layers: tuple[str, ...] = ()
    float32_auto_layers: int = 0           # search the k riskiest diagnosed layers, k <= this
    risky_layers: tuple[str, ...] = ()     # filled from diagnostics at run time
    trials: int = 8
    budget: TrialBudget = TrialBudget()

    # -- sampling --------------------------------------------------------------------------
    def suggest(self, trial: Suggester) -> PrecisionConfig:
        """Sample one config (define-by-run: loss-scale choices only for float16 compute)."""
        params = {"policy": trial.suggest_categorical("policy", list(self.policies))}
        if compute_dtype_of(params["policy"]) == "float16":
            kind = trial.suggest_categorical("loss_scale", list(self.loss_scale_kinds))
            params["loss_scale"] = kind
            if kind == "dynamic":
                params["initial_scale"] = trial.suggest_categorical(
                    "initial_scale", list(self.initial_scales))
                params["growth_steps"] = trial.suggest_categorical(
                    "growth_steps", list(self.growth_steps))
            elif kind == "fixed":
                params["fixed_value"] = trial.suggest_categorical(
                    "fixed_value", list(self.fixed_values))
        params["backend_epsilon"] = trial.suggest_categorical(
            "backend_epsilon", list(self.backend_epsilons))
        params["optimizer_epsilon"] = trial.suggest_categorical(
            "optimizer_epsilon", list(self.optimizer_epsilons))
        if params["policy"] != "float32":  # placing layers in float32 is a no-op there
            for group in self.float32_groups:
                params[f"f32_{group}"] = trial.suggest_categorical(f"f32_{group}", [False, True])
            for pattern in self.float32_layers:
                params[f"f32_layer:{pattern}"] = trial.suggest_categorical(
                    f"f32_layer:{pattern}", [False, True])
            if self.risky_layers:
                # One searched k instead of 2^layers switches: the k riskiest go to float32.
                params["f32_riskiest"] = trial.suggest_categorical(
                    "f32_riskiest", list(range(len(self.risky_layers) + 1)))
        return self.config_from_params(params)

    def fitted(self, matches: Mapping[str, Any]) -> tuple["SearchSpace", list[str]]:
        """This space with its float32 placements resolved against the model's layers.

        ``matches`` is what the worker's task check found, ``probe_task(...)["float32_matches"]``:
        ``{"groups": {group: [path, ...]}, "layers": {pattern: [path, ...]}, "all_layers":
        [path, ...]}``. A group that selects no layer would only repeat other configs, so it is
        dropped, with one line saying so (returned). A ``float32.layers`` pattern that selects no
        layer is the user's mistake: SearchSpaceError, naming the closest layer paths.
        """
        kept, notes = [], []
        for group in self.float32_groups:
            if _group_paths(matches, group):
                kept.append(group)
            else:
                notes.append(f"float32 group {group!r} matches no layer of the model: dropped "
                             "from the space")
        for pattern in self.float32_layers:
            if not _pattern_paths(matches, pattern):
                raise SearchSpaceError(_no_layer_message(f"search space {self.name!r}", pattern,
                                                         matches))
        return replace(self, float32_groups=tuple(kept)), notes

    def with_diagnostics(self, ranked_layers: Sequence[str],
                         recommended_scale: float | None = None) -> "SearchSpace":
        """This space with what diagnostics found: the riskiest layers (for `auto_layers`) and
        the recommended initial loss scale (for `initial_scales: [auto, ...]`)."""
        scales = self.initial_scales
        if recommended_scale is not None:
            # Never the floor itself: a scale that starts there reads as collapsed at once.
            recommended_scale = max(float(recommended_scale), 2.0 * self.loss_scale_floor)
        if self.auto_initial_scale and recommended_scale:
            scales = (float(recommended_scale),) if self.auto_initial_scale == "only" else \
                scales + tuple(s for s in (float(recommended_scale),) if s not in scales)
        return replace(self, risky_layers=tuple(ranked_layers[:self.float32_auto_layers]),
                       initial_scales=scales)

    def config_from_params(self, params: Mapping[str, Any]) -> PrecisionConfig:
        kind = params.get("loss_scale", "none")
        loss_scale = LossScale(
            kind=kind,
            initial_scale=float(params.get("initial_scale", self.initial_scales[0])),
            growth_steps=int(params.get("growth_steps", self.growth_steps[0])),
            value=float(params["fixed_value"]) if kind == "fixed" else None,
            floor=self.loss_scale_floor)
        groups = tuple(g for g in self.float32_groups if params.get(f"f32_{g}"))
        layers = tuple(p for p in self.float32_layers if params.get(f"f32_layer:{p}"))
        riskiest = self.risky_layers[:int(params.get("f32_riskiest", 0))]
        layers += tuple(name for name in riskiest if name not in layers)
        return PrecisionConfig(
            policy=params["policy"], loss_scale=loss_scale,
            epsilon=Epsilon(params.get("backend_epsilon"), params.get("optimizer_epsilon")),
            float32=Float32Placement(groups, layers))

    def params_for(self, policy: str, *, loss_scale: str = "dynamic",
                   float32_groups: Sequence[str] = ()) -> dict[str, Any] | None:
        """Optuna params of a named config, or None where the space cannot express it."""
        if policy not in self.policies:
            return None
        params: dict[str, Any] = {"policy": policy}
        if compute_dtype_of(policy) == "float16":
            if loss_scale not in self.loss_scale_kinds:
                return None
            params["loss_scale"] = loss_scale
            if loss_scale == "dynamic":
                params["initial_scale"] = 2.0**15 if 2.0**15 in self.initial_scales \
                    else self.initial_scales[0]
                params["growth_steps"] = self.growth_steps[0]
            elif loss_scale == "fixed":
                params["fixed_value"] = self.fixed_values[0]
        params["backend_epsilon"] = None if None in self.backend_epsilons \
            else self.backend_epsilons[0]
        params["optimizer_epsilon"] = None if None in self.optimizer_epsilons \
            else self.optimizer_epsilons[0]
        if policy != "float32":
            for group in self.float32_groups:
                params[f"f32_{group}"] = group in float32_groups
            for pattern in self.float32_layers:
                params[f"f32_layer:{pattern}"] = False
            if self.risky_layers:
                params["f32_riskiest"] = 0
        return params

    def baseline_params(self) -> dict[str, Any]:
        params = self.params_for("float32")
        assert params is not None  # float32 is always in a valid space
        return params

    def recommended_params(self) -> list[dict[str, Any]]:
        """The usual advice: a mixed policy, dynamic loss scale, float32 output activation."""
        recommended = []
        for policy in ("mixed_float16", "mixed_bfloat16"):
            params = self.params_for(policy, loss_scale="dynamic", float32_groups=("softmax",))
            if params is not None:
                recommended.append(params)
        return recommended

    # -- the grid --------------------------------------------------------------------------
    def grid(self) -> Iterator[PrecisionConfig]:
        """Every distinct config of the space, for exhaustive search."""
        return (self.config_from_params(params) for params in self.grid_params())

    def grid_params(self) -> Iterator[dict[str, Any]]:
        """The Optuna params of every distinct config (``suggest`` maps each to its config)."""
        names = [f"f32_{g}" for g in self.float32_groups] + \
                [f"f32_layer:{p}" for p in self.float32_layers]
        switches = list(itertools.product([False, True], repeat=len(names)))
        for policy in self.policies:
            scales: list[dict[str, Any]] = [{}]
            if compute_dtype_of(policy) == "float16":
                scales = []
                for kind in self.loss_scale_kinds:
                    if kind == "dynamic":
                        scales += [{"loss_scale": kind, "initial_scale": s, "growth_steps": g}
                                   for s in self.initial_scales for g in self.growth_steps]
                    elif kind == "fixed":
                        scales += [{"loss_scale": kind, "fixed_value": v} for v in self.fixed_values]
                    else:
                        scales.append({"loss_scale": kind})
            mixed = policy != "float32"  # float32 placement is a no-op under float32
            for scale, eps_b, eps_o, switch in itertools.product(
                    scales, self.backend_epsilons, self.optimizer_epsilons,
                    switches if mixed else [()]):
                params = {"policy": policy, **scale, "backend_epsilon": eps_b,
                          "optimizer_epsilon": eps_o, **dict(zip(names, switch))}
                if mixed and self.risky_layers:
                    for k in range(len(self.risky_layers) + 1):
                        yield {**params, "f32_riskiest": k}
                else:
                    yield params

    def size(self) -> int:
        """Number of distinct configs, computed without enumerating the grid."""
        scale_options = sum(len(self.initial_scales) * len(self.growth_steps) if kind == "dynamic"
                            else len(self.fixed_values) if kind == "fixed" else 1
                            for kind in self.loss_scale_kinds)
        switches = 2 ** (len(self.float32_groups) + len(self.float32_layers)) \
            * (len(self.risky_layers) + 1)
        epsilons = len(self.backend_epsilons) * len(self.optimizer_epsilons)
        return sum(epsilons
                   * (scale_options if compute_dtype_of(policy) == "float16" else 1)
                   * (switches if policy != "float32" else 1)
                   for policy in self.policies)


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
    groups = tuple(g for g in config.float32.groups if _group_paths(matches, g))
    placed = [path for group in groups for path in _group_paths(matches, group)]
    patterns = []
    for pattern in config.float32.layers:
        paths = _pattern_paths(matches, pattern)
        if any(not _inside_any(path, placed) for path in paths):
            patterns.append(pattern)
            placed += paths
    return Float32Placement(groups, tuple(patterns))


def placed_layers(config: PrecisionConfig, matches: Mapping[str, Any]) -> dict[str, Any]:
    """Per group and pattern of ``config.float32``, the model's layers it selects (plain data
    for a trial's summary line and MLflow): ``{"groups": {group: [path, ...]}, "layers":
    {pattern: [path, ...]}}``; empty under the float32 policy, where placement does nothing."""
    if config.policy == "float32":
        return {"groups": {}, "layers": {}}
    return {"groups": {group: _group_paths(matches, group) for group in config.float32.groups},
            "layers": {pattern: _pattern_paths(matches, pattern)
                       for pattern in config.float32.layers}}


def _group_paths(matches: Mapping[str, Any], group: str) -> list[str]:
    return list(matches.get("groups", {}).get(group) or [])


def _pattern_paths(matches: Mapping[str, Any], pattern: str) -> list[str]:
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


def _no_layer_message(source: str, pattern: str, matches: Mapping[str, Any]) -> str:
    paths = list(matches.get("all_layers", []))
    candidates = paths + sorted({path.rpartition("/")[2] for path in paths} - set(paths))
    close = difflib.get_close_matches(pattern, candidates, n=3, cutoff=0.4)
    hint = f"closest layers: {', '.join(close)}" if close else \
        f"the model's layers are: {', '.join(paths[:8])}{', ...' if len(paths) > 8 else ''}"
    return (f"{source}: float32.layers pattern {pattern!r} matches no layer of the model; "
            f"{hint}. Use a layer name or path (glob patterns allowed), or remove the pattern.")


def _parse(data: object, source: str, name: str) -> SearchSpace:
    top = _mapping(source, "", data, ("description", "policies", "loss_scale", "epsilon",
                                      "float32", "trials", "trial"))
    kwargs: dict[str, Any] = {"name": name, "description": str(top.get("description", ""))}
    if "policies" in top:
        kwargs["policies"] = _choices(source, "policies", top["policies"],
                                      lambda p: p in POLICIES, f"one of {', '.join(POLICIES)}")
        if "float32" not in kwargs["policies"]:
            raise SearchSpaceError(f"{source}: `policies` must include float32 (the baseline "
                                   f"every trial is judged against). Received: "
                                   f"{list(kwargs['policies'])}. Add float32.")
    scale = _mapping(source, "loss_scale", top.get("loss_scale"),
                     ("kinds", "initial_scales", "growth_steps", "fixed_values", "floor"))
    if "kinds" in scale:
        kwargs["loss_scale_kinds"] = _choices(source, "loss_scale.kinds", scale["kinds"],
                                              lambda k: k in LOSS_SCALE_KINDS,
                                              f"one of {', '.join(LOSS_SCALE_KINDS)}")
    if isinstance(scale.get("initial_scales"), list) and "auto" in scale["initial_scales"]:
        listed = [v for v in scale["initial_scales"] if v != "auto"]
        kwargs["auto_initial_scale"] = "add" if listed else "only"
        scale = {**scale, "initial_scales": listed or [2.0**15]}  # 2^15 until diagnosed
    for key, attr, check, expected in (
            ("initial_scales", "initial_scales", _positive, "a positive number or auto"),
            ("fixed_values", "fixed_values", _positive, "a positive number"),
            ("growth_steps", "growth_steps", _int_at_least(1), "an integer >= 1")):
        if key in scale:
            values = _choices(source, f"loss_scale.{key}", scale[key], check, expected)
            kwargs[attr] = tuple(float(v) for v in values) if attr != "growth_steps" else values
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
    epsilon = _mapping(source, "epsilon", top.get("epsilon"), ("backend", "optimizer"))
    for key in ("backend", "optimizer"):
        if key in epsilon:
            kwargs[f"{key}_epsilons"] = tuple(
                None if v is None else float(v) for v in
                _choices(source, f"epsilon.{key}", epsilon[key], _positive_or_null,
                         "a positive number or null (keep the default)"))
    placement = _mapping(source, "float32", top.get("float32"), ("groups", "layers",
                                                                 "auto_layers"))
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
    if "trials" in top:
        if not _int_at_least(1)(top["trials"]):
            raise SearchSpaceError(f"{source}: `trials` must be an integer >= 1. Received: "
                                   f"trials={describe(top['trials'])}")
        kwargs["trials"] = top["trials"]
    trial = _mapping(source, "trial", top.get("trial"), [f.name for f in fields(TrialBudget)])
    budget = {}
    for key, value in trial.items():
        if key in ("steps", "warmup_steps"):
            ok = _int_at_least(1 if key == "steps" else 0)(value)
        else:
            ok = _positive(value) and value <= 1 if key == "max_skipped_fraction" else _positive(value)
        if not ok:
            raise SearchSpaceError(f"{source}: bad `trial.{key}`. Received: {key}="
                                   f"{describe(value)}")
        budget[key] = value
    kwargs["budget"] = TrialBudget(**budget)
    if kwargs["budget"].warmup_steps + 3 > kwargs["budget"].steps:
        raise SearchSpaceError(f"{source}: `trial.steps` ({kwargs['budget'].steps}) must exceed "
                               f"warmup_steps ({kwargs['budget'].warmup_steps}) by at least 3, "
                               "so that step times can be measured after warm-up.")
    return SearchSpace(**kwargs)


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
    looks_like_path = text_or_path.endswith((".yaml", ".yml")) or "/" in text_or_path
    if looks_like_path:
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
