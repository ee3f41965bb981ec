"""Search spaces: frozen, self-validating dataclasses, parsed from YAML by tuner.search.space_files.

Every dimension is a list of choices, so a space is both what Optuna samples from and a finite
grid. ``SearchSpace.dimensions`` writes its conditional tree once (which parameter is asked
under which earlier choice); sampling, the grid, its size and a named config's params walk it
(tuner.search.dimensions), and ``config_from_params`` maps its params to a ``PrecisionConfig``.
No TensorFlow and no Optuna here: sampling goes through any object with Optuna's
``suggest_categorical(name, choices)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterator, Mapping, Sequence

from tuner.apply.config import (
    PURE_POLICIES,
    Epsilon,
    Float32Placement,
    LossScale,
    PrecisionConfig,
    compute_dtype_of,
)
from tuner.apply.vocabulary import LossScaleKind, WeightUpdate
from tuner.errors import SearchSpaceError
from tuner.search import dimensions as walk
from tuner.search.dimensions import Dimension, Suggester
from tuner.search.layer_matches import (
    effective_placement,
    group_paths,
    no_layer_message,
    pattern_paths,
    placed_layers,
)

MIN_TIMED_STEPS = 3  # step times after warm-up needed to measure anything
# `initial_scales: [auto]` searches powers of two around the diagnostics' recommendation: a
# short trial can tell a scale that overflows (the dynamic scale backs off, skipping steps)
# from one that lets small gradients flush (it learns less), while the recommendation itself
# comes from three float32 steps' largest gradient.
AUTO_SCALE_EXPONENTS = (-4, 0, 4)
MAX_INITIAL_SCALE = 2.0**24

__all__ = ["SearchSpace", "TrialBudget", "Suggester",
           "effective_placement", "placed_layers"]


# Optuna parameter names. A study keeps them: a run resumes only while they stay as they are.
POLICY, LOSS_SCALE, INITIAL_SCALE, GROWTH_STEPS, FIXED_VALUE = (
    "policy", "loss_scale", "initial_scale", "growth_steps", "fixed_value")
WEIGHT_UPDATE, BACKEND_EPSILON, OPTIMIZER_EPSILON, RISKIEST = (
    "weight_update", "backend_epsilon", "optimizer_epsilon", "f32_riskiest")


def float32_group_param(group: str) -> str:
    return f"f32_{group}"


def float32_layer_param(pattern: str) -> str:
    return f"f32_layer:{pattern}"


def _computes_in_float16(policy: str) -> bool:
    return compute_dtype_of(policy) == "float16"


def _computes_in_16_bits(policy: str) -> bool:
    return compute_dtype_of(policy) != "float32"


def _is_pure(policy: str) -> bool:
    """16-bit weights and optimizer state too."""
    return policy in PURE_POLICIES


def _scale_moves(kind: str) -> bool:
    """A dynamic scale: its start and growth interval are searched."""
    return LossScaleKind(kind).moves


def _scale_is_fixed(kind: str) -> bool:
    """A fixed scale: its value is searched."""
    return LossScaleKind(kind).fixed


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
    # Optuna's choices are the plain strings (LossScaleKind, WeightUpdate values).
    loss_scale_kinds: tuple[str, ...] = (LossScaleKind.NONE.value, LossScaleKind.DYNAMIC.value)
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
    weight_updates: tuple[str, ...] = (WeightUpdate.NEAREST.value,)
    risky_layers: tuple[str, ...] = ()     # filled from diagnostics at run time
    # Output layers whose targets a 16-bit output cannot produce (diagnostics' output_heads):
    # (layer path, compute dtypes under which every config keeps it in float32).
    output_heads: tuple[tuple[str, tuple[str, ...]], ...] = ()
    trials: int = 8
    budget: TrialBudget = TrialBudget()

    # -- the tree ---------------------------------------------------------------------------
    def dimensions(self) -> tuple[Dimension, ...]:
        """This space's Optuna parameters as one conditional tree, in the order they are asked.

        An epsilon is searched only where it guards a 16-bit quantity, and stays the task's own
        elsewhere: there a changed epsilon changes the training, not its precision (a float32
        trial with another epsilon is judged against a baseline it shares no optimizer with).
        """
        switch = (False, True)
        placements = [*(float32_group_param(group) for group in self.float32_groups),
                      *(float32_layer_param(pattern) for pattern in self.float32_layers)]
        # One searched k instead of 2^layers switches: the k riskiest go to float32.
        riskiest = [Dimension(RISKIEST, tuple(range(len(self.risky_layers) + 1)), POLICY,
                              _computes_in_16_bits)] if self.risky_layers else []
        return (
            Dimension(POLICY, self.policies),
            Dimension(LOSS_SCALE, self.loss_scale_kinds, POLICY, _computes_in_float16),
            Dimension(INITIAL_SCALE, self.initial_scales, LOSS_SCALE, _scale_moves,
                      preferred=(2.0**15,)),
            Dimension(GROWTH_STEPS, self.growth_steps, LOSS_SCALE, _scale_moves),
            Dimension(FIXED_VALUE, self.fixed_values, LOSS_SCALE, _scale_is_fixed),
            Dimension(WEIGHT_UPDATE, self.weight_updates, POLICY, _is_pure,
                      preferred=(WeightUpdate.NEAREST.value,)),
            Dimension(BACKEND_EPSILON, self.backend_epsilons, POLICY, _computes_in_16_bits,
                      preferred=(None,)),
            Dimension(OPTIMIZER_EPSILON, self.optimizer_epsilons, POLICY, _is_pure,
                      preferred=(None,)),
            # Placing a layer in float32 is a no-op where everything computes in float32.
            *(Dimension(name, switch, POLICY, _computes_in_16_bits) for name in placements),
            *riskiest)

    def suggest(self, trial: Suggester) -> PrecisionConfig:
        """Sample one config, define-by-run down the tree."""
        return self.config_from_params(walk.suggest(self.dimensions(), trial))

    def epsilon_notes(self) -> list[str]:
        """One line per searched epsilon saying where it is searched."""
        notes = []
        for key, values, where, needed in (
                ("backend", self.backend_epsilons, "a policy computes in 16 bits",
                 any(map(_computes_in_16_bits, self.policies))),
                ("optimizer", self.optimizer_epsilons, "weights and optimizer state are 16-bit "
                 "(float16, bfloat16)", any(map(_is_pure, self.policies)))):
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

        ``matches`` is what the worker's task check found, ``check_task(...)["float32_matches"]``:
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
        return any(map(_scale_moves, self.loss_scale_kinds)) and \
            any(map(_computes_in_float16, self.policies))

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
        """The config of the tree's ``params``; a parameter not asked takes its config's value
        where it does not apply (the space's first scale settings, nearest updates, no
        epsilon, no float32 placement)."""
        kind = LossScaleKind(params.get(LOSS_SCALE, LossScaleKind.NONE))
        loss_scale = LossScale(
            kind=kind,
            initial_scale=float(params.get(INITIAL_SCALE, self.initial_scales[0])),
            growth_steps=int(params.get(GROWTH_STEPS, self.growth_steps[0])),
            value=float(params[FIXED_VALUE]) if kind.fixed else None,
            floor=self.loss_scale_floor)
        groups = tuple(g for g in self.float32_groups if params.get(float32_group_param(g)))
        layers = tuple(p for p in self.float32_layers if params.get(float32_layer_param(p)))
        riskiest = self.risky_layers[:int(params.get(RISKIEST, 0))]
        layers += tuple(name for name in riskiest if name not in layers)
        compute = compute_dtype_of(params[POLICY])
        layers += tuple(path for path, dtypes in self.output_heads
                        if compute in dtypes and path not in layers)
        return PrecisionConfig(
            policy=params[POLICY], loss_scale=loss_scale,
            epsilon=Epsilon(params.get(BACKEND_EPSILON), params.get(OPTIMIZER_EPSILON)),
            float32=Float32Placement(groups, layers),
            weight_update=params.get(WEIGHT_UPDATE, WeightUpdate.NEAREST))

    def params_for(self, policy: str, *, loss_scale: str = LossScaleKind.DYNAMIC.value,
                   float32_groups: Sequence[str] = ()) -> dict[str, Any] | None:
        """Optuna params of a named config, or None where the space cannot express it: every
        other parameter at its default (2^15 and nearest updates where offered, else the
        first choice; no epsilon where offered; float32 placements off)."""
        wanted = {POLICY: policy, LOSS_SCALE: loss_scale,
                  **{float32_group_param(group): True for group in float32_groups}}
        return walk.pick(self.dimensions(), wanted)

    def baseline_params(self) -> dict[str, Any]:
        params = self.params_for("float32")
        assert params is not None  # float32 is always in a valid space
        return params

    def recommended_params(self) -> list[dict[str, Any]]:
        """The usual advice: a mixed policy, dynamic loss scale, float32 output activation."""
        recommended = []
        for policy in ("mixed_float16", "mixed_bfloat16"):
            params = self.params_for(policy, loss_scale=LossScaleKind.DYNAMIC.value,
                                     float32_groups=("softmax",))
            if params is not None:
                recommended.append(params)
        return recommended

    # -- the grid --------------------------------------------------------------------------
    def grid(self) -> Iterator[PrecisionConfig]:
        """Every distinct config of the space, for exhaustive search."""
        return (self.config_from_params(params) for params in self.grid_params())

    def grid_params(self) -> Iterator[dict[str, Any]]:
        """The Optuna params of every distinct config (``suggest`` maps each to its config)."""
        return walk.grid(self.dimensions())

    def size(self) -> int:
        """Number of distinct configs, computed without enumerating the grid."""
        return walk.count(self.dimensions())

    def choices(self) -> dict[str, tuple[Any, ...]]:
        """Every parameter ``suggest`` may ask for, with its choices."""
        return {dimension.name: dimension.choices for dimension in self.dimensions()}
