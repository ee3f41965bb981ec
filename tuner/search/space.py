"""Search spaces: frozen, self-validating dataclasses (parsed from YAML by tuner.search.space_files).

Every dimension is a list of choices, so a space is both what Optuna samples from and a finite
grid (enumerated by tuner.search.grid). Loss-scale dimensions are only sampled where the policy
computes in float16, each epsilon only where it guards a 16-bit quantity.
No TensorFlow and no Optuna here: sampling goes through any object with Optuna's
``suggest_categorical(name, choices)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterator, Mapping, Protocol, Sequence

from tuner.apply.config import (PURE_POLICIES, Epsilon, Float32Placement, LossScale,
                          PrecisionConfig, compute_dtype_of)
from tuner.errors import SearchSpaceError
from tuner.search.grid import grid_params, grid_size
from tuner.search.layer_matches import (effective_placement, group_paths, no_layer_message,
                                        pattern_paths, placed_layers)

MIN_TIMED_STEPS = 3  # step times after warm-up needed to measure anything
# `initial_scales: [auto]` searches powers of two around the diagnostics' recommendation: a
# short trial can tell a scale that overflows (the dynamic scale backs off, skipping steps)
# from one that lets small gradients flush (it learns less), while the recommendation itself
# comes from three float32 steps' largest gradient.
AUTO_SCALE_EXPONENTS = (-4, 0, 4)
MAX_INITIAL_SCALE = 2.0**24

__all__ = ["SearchSpace", "TrialBudget", "Suggester",
           "effective_placement", "placed_layers"]


class Suggester(Protocol):
    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...


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
    # How 16-bit weights take their updates, searched under pure policies only.
    weight_updates: tuple[str, ...] = ("nearest",)
    risky_layers: tuple[str, ...] = ()     # filled from diagnostics at run time
    # Output layers whose targets a 16-bit output cannot produce (diagnostics' output_heads):
    # (layer path, compute dtypes under which every config keeps it in float32).
    output_heads: tuple[tuple[str, tuple[str, ...]], ...] = ()
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
        if params["policy"] in PURE_POLICIES:
            params["weight_update"] = trial.suggest_categorical(
                "weight_update", list(self.weight_updates))
        backend, optimizer = self.epsilons_for(params["policy"])
        if backend:
            params["backend_epsilon"] = trial.suggest_categorical("backend_epsilon", list(backend))
        if optimizer:
            params["optimizer_epsilon"] = trial.suggest_categorical("optimizer_epsilon",
                                                                    list(optimizer))
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

    def epsilons_for(self, policy: str) -> tuple[tuple[float | None, ...], ...]:
        """The backend and optimizer epsilons searched under ``policy``; empty where an epsilon
        is no precision question and stays the task's own: the backend epsilon only where the
        policy computes in 16 bits, the optimizer's only where weights and optimizer state are
        16-bit (pure policies). Elsewhere a changed epsilon changes the training, not its
        precision: a float32 trial with another epsilon is judged against a baseline it does
        not share an optimizer with."""
        backend = self.backend_epsilons if compute_dtype_of(policy) != "float32" else ()
        optimizer = self.optimizer_epsilons if policy in PURE_POLICIES else ()
        return backend, optimizer

    def epsilon_notes(self) -> list[str]:
        """One line per searched epsilon saying where it is searched."""
        notes = []
        for key, values, where, needed in (
                ("backend", self.backend_epsilons, "a policy computes in 16 bits",
                 any(compute_dtype_of(p) != "float32" for p in self.policies)),
                ("optimizer", self.optimizer_epsilons, "weights and optimizer state are 16-bit "
                 "(float16, bfloat16)", any(p in PURE_POLICIES for p in self.policies))):
            if values == (None,):
                continue
            listed = ", ".join("default" if v is None else f"{v:g}" for v in values)
            notes.append(f"epsilon.{key} [{listed}]: searched only where {where}; elsewhere "
                         "an epsilon changes the optimizer, not the precision"
                         + ("" if needed else " (no policy of this space, so never)"))
        return notes

    def fitted(self, matches: Mapping[str, Any],
               optimizer: Mapping[str, Any] | None = None) -> tuple["SearchSpace", list[str]]:
        """This space with its float32 placements resolved against the model's layers.

        ``matches`` is what the worker's task check found, ``probe_task(...)["float32_matches"]``:
        ``{"groups": {group: [path, ...]}, "layers": {pattern: [path, ...]}, "all_layers":
        [path, ...]}``. A group that selects no layer would only repeat other configs, so it is
        dropped, with one line saying so (returned). A ``float32.layers`` pattern that selects no
        layer is the user's mistake: SearchSpaceError, naming the closest layer paths. With
        ``optimizer`` (the task check's ``"optimizer"``: ``{"class", "epsilon"}``), optimizer
        epsilons are dropped, with a line, when the optimizer has no epsilon to set: every
        such config would fail the same way.
        """
        kept, notes = [], []
        for group in self.float32_groups:
            if group_paths(matches, group):
                kept.append(group)
            else:
                notes.append(f"float32 group {group!r} matches no layer of the model: dropped "
                             "from the space")
        for pattern in self.float32_layers:
            if not pattern_paths(matches, pattern):
                raise SearchSpaceError(no_layer_message(f"search space {self.name!r}", pattern,
                                                         matches))
        epsilons = self.optimizer_epsilons
        if optimizer is not None and not optimizer["epsilon"] and epsilons != (None,):
            values = ", ".join(f"{value:g}" for value in epsilons if value is not None)
            notes.append(f"epsilon.optimizer [{values}]: {optimizer['class']} has no epsilon, so "
                         "no config can set one: dropped from the space")
            epsilons = (None,)
        fitted = replace(self, float32_groups=tuple(kept), optimizer_epsilons=epsilons)
        return fitted, notes + fitted.epsilon_notes()

    def fitted_to_steps(self, steps: int) -> tuple["SearchSpace", list[str]]:
        """This space without growth intervals a ``steps``-step trial cannot tell apart: a
        dynamic scale grows only after that many overflow-free steps in a row, so every value
        of at least ``steps`` gives the same trial. They are searched as one, the largest
        (Keras's default is 2000), with one line saying so (returned)."""
        reachable = tuple(g for g in self.growth_steps if g < steps)
        unreachable = [g for g in self.growth_steps if g >= steps]
        if len(unreachable) < 2 or not self._searches_dynamic_scale():
            return self, []
        kept = max(unreachable)
        listed = ", ".join(str(g) for g in self.growth_steps)
        note = (f"loss_scale.growth_steps [{listed}]: a dynamic scale grows only after that many "
                f"overflow-free steps in a row, and none of "
                f"{', '.join(str(g) for g in sorted(unreachable))} is below the {steps} steps "
                f"every trial trains, so they would give the same trial: searched as one "
                f"({kept})")
        return replace(self, growth_steps=reachable + (kept,)), [note]

    def _searches_dynamic_scale(self) -> bool:
        return "dynamic" in self.loss_scale_kinds and \
            any(compute_dtype_of(p) == "float16" for p in self.policies)

    def with_diagnostics(self, ranked_layers: Sequence[str],
                         recommended_scale: float | None = None,
                         output_heads: Sequence[Mapping[str, Any]] = ()) -> "SearchSpace":
        """This space with what diagnostics found: the riskiest layers (for `auto_layers`), the
        recommended initial loss scale (for `initial_scales: [auto, ...]`) and the output
        layers that stay float32 under the compute dtypes their targets need."""
        scales = self.initial_scales
        if self.auto_initial_scale and recommended_scale:
            # Never the floor itself: a scale that starts there reads as collapsed at once.
            around = sorted({min(MAX_INITIAL_SCALE, max(float(recommended_scale) * 2.0**k,
                                                        2.0 * self.loss_scale_floor))
                             for k in AUTO_SCALE_EXPONENTS})
            scales = tuple(around) if self.auto_initial_scale == "only" else \
                scales + tuple(s for s in around if s not in scales)
        heads = tuple((path, tuple(entry["needs_float32_in"])) for entry in output_heads
                      for path in entry["layers"])
        return replace(self, risky_layers=tuple(ranked_layers[:self.float32_auto_layers]),
                       initial_scales=scales, output_heads=heads)

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
        compute = compute_dtype_of(params["policy"])
        layers += tuple(path for path, dtypes in self.output_heads
                        if compute in dtypes and path not in layers)
        return PrecisionConfig(
            policy=params["policy"], loss_scale=loss_scale,
            epsilon=Epsilon(params.get("backend_epsilon"), params.get("optimizer_epsilon")),
            float32=Float32Placement(groups, layers),
            weight_update=params.get("weight_update", "nearest"))

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
        if policy in PURE_POLICIES:
            params["weight_update"] = "nearest" if "nearest" in self.weight_updates \
                else self.weight_updates[0]
        backend, optimizer = self.epsilons_for(policy)
        if backend:
            params["backend_epsilon"] = None if None in backend else backend[0]
        if optimizer:
            params["optimizer_epsilon"] = None if None in optimizer else optimizer[0]
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
        return grid_params(self)

    def size(self) -> int:
        """Number of distinct configs, computed without enumerating the grid."""
        return grid_size(self)
