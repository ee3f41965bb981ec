"""What a tuning job produces: one row per trial and the job's summary. No TensorFlow.

The report, the plots and the MLflow records read these types; they do not depend on how the
trials were chosen or scheduled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuner.apply.config import PrecisionConfig
from tuner.judging.noise import SpeedupEstimate, median
from tuner.judging.verdict import Judgement
from tuner.records.timing import TimeBreakdown, run_parts
from tuner.task_facts import TaskFacts
from tuner.trial_types import TrialResult


@dataclass
class TrialRow:
    number: int
    config: PrecisionConfig
    result: TrialResult
    judgement: Judgement
    run_id: str | None = None
    optuna_number: int | None = None          # None for trials outside Optuna (repairs)
    repair: bool = False                      # a dtype-mismatch repair, outside the space
    remeasured_rounds: list[list[float]] = field(default_factory=list)  # timed steps per round
    estimate: SpeedupEstimate | None = None   # re-measured speedup vs float32, with interval
    placed: dict[str, Any] | None = None      # layers each float32 group/pattern selected
    record_s: float = 0.0                     # the driver's time recording it (MLflow, files)

    @property
    def remeasured_ms(self) -> float | None:
        """Median over the re-measurement rounds of each round's median step time."""
        medians = [median(steps) for steps in self.remeasured_rounds if steps]
        return median(medians) if medians else None

    @property
    def round_medians_ms(self) -> list[float | None]:
        """Each re-measurement round's median step time, in order (None: that run failed)."""
        return [round(median(steps), 4) if steps else None for steps in self.remeasured_rounds]


@dataclass
class TuneSummary:
    rows: list[TrialRow]
    best: TrialRow | None
    baseline: TrialRow | None
    estimate: SpeedupEstimate | None   # the winner's speedup vs float32, re-measured
    wall_s: float
    train_s: float                      # time inside training steps, all trials + re-measure
    run_dir: Path
    parent_run_id: str | None
    tracking_uri: str
    space_exhausted: bool = False
    facts: TaskFacts = field(default_factory=TaskFacts)   # the task check's
    best_config: PrecisionConfig | None = None   # the winner, with provenance
    shared_remeasure: bool = False      # no node could be reserved for the re-measurement
    trace_s: float = 0.0                # first steps (tracing the training step), likewise
    tie: bool = False                   # a faster-looking config lost to a simpler one
    decision: str = ""                  # why the winner won, one line
    remeasure_notes: list[str] = field(default_factory=list)  # rounds, target, losses
    breakdown: TimeBreakdown | None = None   # where the wall time went, phase by phase
    objective_lines: list[str] = field(default_factory=list)  # memory/balanced: the choice
    record_notes: list[str] = field(default_factory=list)  # a record that failed (MLflow)
    head_lines: list[str] = field(default_factory=list)  # output heads kept float32 (targets)
    # Proposals not trained and trials stopped early, one line per reason (tuner.run.held).
    search_lines: list[str] = field(default_factory=list)
    # tuner.run.confirmation_findings.Confirmation, one per config confirmed
    confirmations: list[Any] = field(default_factory=list)
    confirm_skipped: bool = False       # --no-confirm

    @property
    def outside_training_fraction(self) -> float:
        return max(0.0, 1.0 - self.train_s / self.wall_s) if self.wall_s else 0.0


class Progress(Protocol):
    def trial_started(self, number: int, description: str) -> None: ...
    def trial_finished(self, row: TrialRow, best: TrialRow | None,
                       speedup: float | None) -> None: ...
    def phase(self, text: str) -> None: ...
    def more(self, count: int) -> None: ...   # trials beyond the budget the bar started with


class NoProgress:
    def trial_started(self, number: int, description: str) -> None:
        pass

    def trial_finished(self, row: TrialRow, best: TrialRow | None, speedup: float | None) -> None:
        pass

    def phase(self, text: str) -> None:
        pass

    def more(self, count: int) -> None:
        pass


def row_record(row: TrialRow) -> dict[str, Any]:
    """A trial as plain data (trials.jsonl / trials.json)."""
    return {"number": row.number, "config": row.config.to_dict(),
            "result": row.result.to_dict(), "verdict": row.judgement.verdict.value,
            "reason": row.judgement.reason, "note": row.judgement.note,
            "loss_decrease_ratio": row.judgement.loss_decrease_ratio,
            "median_step_ms": row.judgement.median_step_ms,
            "remeasured_ms": row.remeasured_ms,
            "round_medians_ms": row.round_medians_ms,
            "speedup_interval": row.estimate.to_dict() if row.estimate else None,
            "run_id": row.run_id, "optuna_number": row.optuna_number, "repair": row.repair,
            "float32_layers": row.placed,
            "time_s": {**run_parts(row.result), "worker": row.result.wall_s,
                       "record": row.record_s}}
