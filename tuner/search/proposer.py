"""Where the next config is chosen: fixed configs first, then Optuna's suggestions.

The proposer sees plain data only (configs, keys, verdicts), like KerasTuner's oracle. Order:
repairs (outside the space: a failing or first non-finite layer in float32), then the fixed
queue (the float32 baseline, the configs diagnostics recommends, trials a kill interrupted, and
— when the budget covers the space or ``--exhaustive`` — every config of the space once), then
Optuna's sampler.

Optuna's study shows each training once: a suggestion that repeats a config already run (a
sampler on a small discrete space does this often) is told as PRUNED with the user attribute
``repeat_of`` (the tuner's number of the trial it repeats), so ``trials_dataframe()`` and
optuna-dashboard count what ran. Every told trial carries ``trial``, the tuner's own number.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from tuner.apply.config import PrecisionConfig
from tuner.judging.objective import Objective
from tuner.judging.verdict import Verdict
from tuner.search.space import SearchSpace, effective_placement
from tuner.trial_types import FailureClass

UNSTABLE = 1.0  # Optuna constraint value of an unstable trial (feasible is <= 0)
_MAX_REPEATED_ASKS = 50  # a sampler that only repeats itself has nothing new to offer


def config_key(config: PrecisionConfig, matches: dict[str, Any] | None = None) -> str:
    """Identity of a config for "already tried": everything but its provenance, and — once the
    model's layers are known (``matches``) — only the float32 placements that change something,
    so that configs differing by a no-op placement count as one."""
    if matches is not None:
        config = dataclasses.replace(config, float32=effective_placement(config, matches))
    data = config.to_dict()
    data.pop("provenance", None)
    return json.dumps(data, sort_keys=True)


@dataclass
class Proposal:
    config: PrecisionConfig
    key: str
    optuna_trial: Any = None      # None for repairs (outside Optuna's space)

    @property
    def is_repair(self) -> bool:
        return self.optuna_trial is None


class Proposer:
    def __init__(self, space: SearchSpace, study, *, enumerate_space: bool,
                 requeued: Iterable[dict[str, Any]] = (),
                 matches: dict[str, Any] | None = None,
                 objective: Objective = Objective.SPEED) -> None:
        self.space = space
        self.objective = objective
        self.matches = matches
        self.study = study
        self.enumerate_space = enumerate_space
        self._requeued = list(requeued)
        self._queue: list[dict[str, Any]] | None = None
        self._repairs: list[PrecisionConfig] = []
        self._space_keys: set[str] = set()          # configs of the space proposed or done
        self._number_of: dict[str, int] = {}        # key -> tuner trial number that ran it
        self._repeats: dict[str, list] = {}         # key -> Optuna trials waiting on it
        self._not_trained: dict[str, str] = {}      # key -> why (tuner.judging.worth_training)
        self._repeated_asks = 0
        self.gave_up = False                        # the sampler only repeated itself

    def key(self, config: PrecisionConfig) -> str:
        return config_key(config, self.matches)

    # -- what has run ------------------------------------------------------------------------
    def restore(self, key: str, number: int, from_space: bool = True) -> None:
        """A trial that ran in an earlier process (resume)."""
        self._number_of[key] = number
        if from_space:
            self._space_keys.add(key)

    def _fixed_queue(self) -> list[dict[str, Any]]:
        queue = [self.space.baseline_params(), *self.space.recommended_params(),
                 *self._requeued]
        if self.enumerate_space:
            queue += self.space.grid_params()
        seen = set(self._number_of)
        todo = []
        for params in queue:
            key = self.key(self.space.config_from_params(params))
            if key not in seen:
                seen.add(key)
                todo.append(params)
        return todo

    @property
    def has_repairs(self) -> bool:
        """A repair is waiting to be proposed."""
        return bool(self._repairs)

    @property
    def exhausted(self) -> bool:
        """Nothing new can come from the space (repairs may still come)."""
        if self.gave_up or len(self._space_keys) >= self.space.size():
            return True
        return self.enumerate_space and self._queue is not None and not self._queue

    # -- proposing ---------------------------------------------------------------------------
    def next(self, pending: set[str]) -> Proposal | None:
        """The next config to run, or None when there is nothing new right now.

        ``pending``: keys of trials submitted but not finished (not to be proposed twice).
        """
        if self._queue is None:
            self._queue = self._fixed_queue()
        while self._repairs:
            config = self._repairs.pop(0)
            key = self.key(config)
            if key not in self._number_of and key not in pending:
                return Proposal(config, key)
        while not self.exhausted:
            if self._queue:
                self.study.enqueue_trial(self._queue.pop(0))
            trial = self.study.ask()
            config = self.space.suggest(trial)
            key = self.key(config)
            if key in self._number_of or key in pending or key in self._not_trained:
                self._repeat(trial, key)
                continue
            self._space_keys.add(key)
            return Proposal(config, key, trial)
        return None

    def _repeat(self, trial, key: str) -> None:
        """Optuna proposed a config already run (or running): not a new training."""
        self._repeated_asks += 1
        self.gave_up = self._repeated_asks > _MAX_REPEATED_ASKS
        if key in self._number_of:
            self._tell_repeat(trial, self._number_of[key])
        elif key in self._not_trained:
            self._tell_not_trained(trial, self._not_trained[key])
        else:
            self._repeats.setdefault(key, []).append(trial)

    def _tell_repeat(self, trial, number: int) -> None:
        from optuna.trial import TrialState

        trial.set_user_attr("repeat_of", number)
        self.study.tell(trial, state=TrialState.PRUNED)

    def not_trained(self, proposal: Proposal, why: str) -> None:
        """The proposal is not worth training (tuner.judging.worth_training): Optuna is told
        PRUNED with the user attribute ``not_trained``, and a repeat of it is not proposed."""
        self._not_trained[proposal.key] = why
        if proposal.optuna_trial is not None:
            self._tell_not_trained(proposal.optuna_trial, why)

    def _tell_not_trained(self, trial, why: str) -> None:
        from optuna.trial import TrialState

        trial.set_user_attr("not_trained", why)
        self.study.tell(trial, state=TrialState.PRUNED)

    # -- results -----------------------------------------------------------------------------
    def finished(self, proposal: Proposal, row) -> None:
        """Tell Optuna how the proposal's trial (a ``TrialRow``) went; plan a repair."""
        self._number_of[proposal.key] = row.number
        if proposal.optuna_trial is not None:
            tell(self.study, proposal.optuna_trial, row, self.objective)
        for trial in self._repeats.pop(proposal.key, []):
            self._tell_repeat(trial, row.number)
        repair = repair_for(row)
        if repair is not None and self.key(repair) not in self._number_of:
            self._repairs.append(repair)

    def fail(self, proposal: Proposal) -> None:
        """The trial could not be judged at all (the job is ending)."""
        from optuna.trial import TrialState

        if proposal.optuna_trial is not None:
            self.study.tell(proposal.optuna_trial, state=TrialState.FAIL)


def tell(study, trial, row, objective: Objective = Objective.SPEED) -> None:
    """Map a trial's verdict to an Optuna state: failed -> FAIL, stopped as too slow -> PRUNED,
    judged -> COMPLETE with the stability constraint and the objective's values: the median
    step time (speed), the training memory (memory), or both (balanced: a multi-objective
    study)."""
    from optuna.trial import TrialState

    verdict = row.judgement.verdict
    median = row.judgement.median_step_ms
    if median is None and row.result.step_times_ms:
        median = statistics.median(row.result.step_times_ms)
    trial.set_user_attr("trial", row.number)
    trial.set_user_attr("verdict", verdict.value)
    trial.set_user_attr("reason", row.judgement.reason)
    if verdict is Verdict.FAILED or median is None:
        study.tell(trial, state=TrialState.FAIL)
    elif verdict is Verdict.STOPPED_SLOW:
        study.tell(trial, state=TrialState.PRUNED)
    else:
        trial.set_constraint("unstable", 0.0 if row.judgement.stable else UNSTABLE)
        memory = (row.result.training_memory or {}).get("total_bytes")
        if objective.uses_memory and memory is None:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, objective.study_values(median, memory))


# Failures that keeping the named layer in float32 can cure.
REPAIRABLE = (FailureClass.DTYPE_MISMATCH, FailureClass.INTEGER_ROUNDING,
              FailureClass.INPUT_ROUNDING, FailureClass.INDEX_OUT_OF_RANGE,
              FailureClass.NUMERIC_CHECK)


def repair_for(row) -> PrecisionConfig | None:
    """A failure that names its layer and that float32 can cure (a dtype mismatch, integers
    rounded, an index pushed out of range, a numerics check): that layer in float32 is worth
    one trial. So is the layer whose output first went non-finite in a 16-bit forward pass
    (an overflow inside it, a hand-written softmax's ``exp``), once: the next layer's overflow
    after that repair is left to the search's float32 placements, so that a chain of layers
    cannot spend the whole budget on repairs. A dtype mismatch outside every layer gets the
    config with float32 outputs (``float32.outputs``), once."""
    layer = row.result.failure_layer
    if row.config.policy == "float32":
        return None
    if row.result.failure_class is FailureClass.DTYPE_MISMATCH and not layer \
            and not row.config.float32.outputs:
        # Outside every layer: the loss, a metric or a custom train_step mixing 16-bit
        # predictions with float32 targets. Float32 outputs are Keras's own advice for that.
        return dataclasses.replace(row.config, float32=dataclasses.replace(
            row.config.float32, outputs=True))
    repairable = row.result.failure_class in REPAIRABLE or (
        row.result.first_non_finite_step is not None and not row.repair)
    if not repairable or not layer or layer in row.config.float32.layers:
        return None
    placement = dataclasses.replace(row.config.float32,
                                    layers=row.config.float32.layers + (layer,))
    return dataclasses.replace(row.config, float32=placement)


def study_storage(run_dir: Path) -> str:
    """The run directory's Optuna storage (SQLite)."""
    return f"sqlite:///{(run_dir / 'optuna.db').resolve()}"


def create_study(run_dir: Path, study_name: str, seed: int, *, resume: bool = False,
                 objective: Objective = Objective.SPEED):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = study_storage(run_dir)
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)
    if resume:
        return optuna.load_study(study_name=study_name, storage=storage, sampler=sampler)
    # balanced: step time and training memory, both minimized (Optuna's multi-objective TPE).
    directions = ["minimize"] * objective.directions
    return optuna.create_study(study_name=study_name, storage=storage, directions=directions,
                               sampler=sampler)


def recover_study(study) -> list[dict[str, Any]]:
    """Fail the trials a killed process left RUNNING or WAITING; return their params."""
    from optuna.trial import TrialState

    requeue = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)
        requeue.append(dict(trial.params))
    for waiting in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        requeue.append(dict(waiting.system_attrs.get("fixed_params", {})))
        study.tell(study.ask(), state=TrialState.FAIL)  # pops the oldest waiting trial
    return [params for params in requeue if params]
