"""A finished job's records: the exported config with its provenance (speedup, interval,
confirmation), trials.json, the plots, the MLflow parent run and its summary table."""

from __future__ import annotations

import dataclasses
import datetime
import time
from pathlib import Path
from typing import Any

from tuner.apply.config import PrecisionConfig
from tuner.execution.base import Executor
from tuner.execution.local import fresh_process_peak_rss
from tuner.machine import machine_description
from tuner.records.plots import diagnostics_heatmap, make_all
from tuner.records.report import summary_markdown
from tuner.records.results import TrialRow, TuneSummary, row_record
from tuner.records.run_store import RunStore
from tuner.run.held import stopped_lines
from tuner.run.loss_scale_why import loss_scale_why
from tuner.run.plan import RunPlan
from tuner.run.remeasure import Remeasured
from tuner.run.trial_loop import Scheduler, make_spec
from tuner.search.space import effective_placement
from tuner.task_facts import TaskFacts


def provenance(best: TrialRow, outcome: Remeasured, plan: RunPlan,
               facts: TaskFacts) -> dict[str, Any]:
    """Where an exported config came from, with its speedup *and* that speedup's interval."""
    estimate = outcome.decision.estimate
    return {
        "task": plan.task_path.name,
        "tuned_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "trial": best.number,
        "median_step_ms": round(best.remeasured_ms or best.judgement.median_step_ms or 0.0, 4),
        "speedup_vs_float32": round(estimate.ratio, 4),
        "speedup_interval": [round(estimate.low, 4), round(estimate.high, 4)],
        # The interval from this run's timings alone, and the run-to-run allowance (the sd of
        # the log speedup between runs) that widened it into the one above.
        "speedup_interval_this_run": [round(end, 4) for end in estimate.rounds_interval],
        "run_drift_sd": estimate.run_drift,
        "confidence": estimate.confidence,
        "remeasure_rounds": (best.estimate or estimate).rounds,
        "speedup_from": speedup_source(best, outcome),
        "tie_within_noise": outcome.decision.tie,
        "decision": outcome.decision.explanation,
        "min_gain": plan.min_gain,
        "objective": plan.objective.value,
        "training_memory_bytes": (best.result.training_memory or {}).get("total_bytes"),
        "confirmation": _confirmation_record(best, outcome),
        "loss_scale_why": loss_scale_why(best.config, best.result, plan),
        "machine": machine_description(),
        "tensorflow": facts.tensorflow,
        "keras": facts.keras,
        "tf32": float32_math(facts, plan),
    }


def float32_math(facts: TaskFacts, plan: RunPlan) -> dict[str, Any]:
    """What "float32" meant in this run's trials: TF32 products (TensorFlow's default on a
    GPU with TF32 units) or IEEE float32, and why: run.json and the export's provenance."""
    tf32 = dict(facts.tf32 or {})
    applies = bool(tf32.get("applies")) and not plan.strict_float32
    return {**tf32, "strict": plan.strict_float32, "float32_products": "tf32" if applies
            else "float32"}


def speedup_source(best: TrialRow, outcome: Remeasured) -> str:
    """Which timings the exported speedup comes from: fresh ones (tuner.run.confirmation_run)
    when the pick's confirmation or speed check timed it, else the rounds it was chosen on."""
    checked = [c for c in outcome.confirmations if c.trial == best.number and c.passed]
    if checked and checked[-1].speed is not None:
        return (f"{checked[-1].speed.rounds} fresh stretches timed back to back after the pick "
                "was chosen")
    return "float32 itself" if best.number == 0 else "the re-measurement's rounds"


def _confirmation_record(best: TrialRow, outcome: Remeasured) -> dict[str, Any] | None:
    """What the exported config's provenance says of its confirmation run."""
    if outcome.confirm_skipped:
        checked = [c.to_dict() for c in outcome.confirmations]
        return {"verdict": "skipped", "reason": "--no-confirm: not trained longer before export",
                **({"speed_checks": checked} if checked else {})}
    confirmed = [c.to_dict() for c in outcome.confirmations if c.trial == best.number]
    rejected = [c.to_dict() for c in outcome.confirmations if c.trial != best.number]
    if confirmed:
        return {**confirmed[-1], "rejected_before": rejected}
    if rejected:
        return {"verdict": "float32: every confirmed 16-bit pick was rejected",
                "rejected_before": rejected}
    return None


def fresh_rss_line(plan: RunPlan, winner: TrialRow, baseline: TrialRow) -> str:
    """The peak RSS of a fresh process training the pick and float32: the check, on this
    machine, of the counted training memory the objective chose by."""
    figures = []
    for label, row in (("float32", baseline), (f"the pick #{winner.number}", winner)):
        if label != "float32" and winner is baseline:
            continue
        peak = fresh_process_peak_rss(make_spec(plan, row.number, row.config))
        figures.append(f"{label} {peak / 1e6:.0f} MB" if peak else f"{label} failed")
    return ("check: peak RSS of a fresh process training it (TensorFlow's own footprint "
            "included): " + ", ".join(figures))


def summary_of(plan: RunPlan, scheduler: Scheduler, outcome: Remeasured, exhausted: bool,
             started: float, tracker, facts: TaskFacts) -> TuneSummary:
    best = outcome.winner
    config = best.config
    if plan.learned.matches is not None:  # export only the placements that change something
        config = dataclasses.replace(config,
                                     float32=effective_placement(config, plan.learned.matches))
    best_config = PrecisionConfig.from_dict(
        {**config.to_dict(), "provenance": provenance(best, outcome, plan, facts)})
    return TuneSummary(
        rows=sorted(scheduler.rows, key=lambda r: r.number), best=best,
        baseline=scheduler.baseline, estimate=outcome.decision.estimate,
        wall_s=time.perf_counter() - started, train_s=scheduler.train_s,
        trace_s=scheduler.trace_s, run_dir=plan.run_dir, parent_run_id=tracker.parent_id,
        tracking_uri=tracker.tracking_uri, space_exhausted=exhausted, facts=facts,
        best_config=best_config, shared_remeasure=outcome.shared, tie=outcome.decision.tie,
        decision=outcome.decision.explanation, remeasure_notes=outcome.notes,
        objective_lines=outcome.objective_lines, confirmations=outcome.confirmations,
        confirm_skipped=outcome.confirm_skipped,
        search_lines=scheduler.held.lines() + stopped_lines(scheduler.rows, plan.steps),
        head_lines=[f"output head {path} stays float32 in every {' and '.join(dtypes)} config: "
                    "the targets it must produce need it (see the diagnostics)"
                    for path, dtypes in plan.space.output_heads])


def close_records(plan: RunPlan, summary: TuneSummary, scheduler: Scheduler, tracker,
                   store: RunStore, diagnostics: dict[str, Any] | None,
                   mlflow_missing: list[int] = ()) -> None:
    """The run's closing records; ``tracker`` None when MLflow failed during the run (the
    files are written, run.json lists the trials MLflow misses). ``diagnostics``: those whose
    plot is still to draw (None where ``plot_diagnostics_early`` drew it)."""
    summary.best_config.save(plan.run_dir / "best_precision.json", overwrite=True)
    store.write_trials([row_record(r) for r in summary.rows])
    plots = make_plots(summary, diagnostics, plan.run_dir / "plots")
    if tracker is None:
        store.update_run(status="finished", mlflow_missing=list(mlflow_missing))
        return
    tracker.log_plots(plots)
    if summary.confirmations:
        tracker.log_confirmation([c.to_dict() for c in summary.confirmations])
    estimate, best, baseline = summary.estimate, summary.best, summary.baseline
    metrics = {
        "best_speedup_vs_float32": estimate.ratio if estimate else None,
        "best_speedup_low": estimate.low if estimate else None,
        "best_speedup_high": estimate.high if estimate else None,
        "tie_within_noise": float(summary.tie),
        "best_median_step_ms": best.remeasured_ms if best else None,
        "float32_median_step_ms": baseline.remeasured_ms if baseline else None,
        "trials": float(len(summary.rows)),
        "stable_trials": float(sum(r.judgement.stable for r in summary.rows)),
        "wall_s": summary.wall_s, "train_s": summary.train_s, "trace_s": summary.trace_s,
        "outside_training_fraction": summary.outside_training_fraction,
    }
    tracker.finish_parent(metrics={k: v for k, v in metrics.items() if v is not None},
                          best=summary.best_config, summary_markdown=summary_markdown(summary),
                          status="FINISHED", table=trials_table(summary))
    store.update_run(status="finished")


def trials_table(summary: TuneSummary) -> dict[str, list]:
    """Every trial's config, verdict, speedup and median step time, one column each (the
    parent run's summary table in MLflow)."""
    base = summary.baseline.judgement.median_step_ms if summary.baseline else None
    columns: dict[str, list] = {"trial": [], "config": [], "verdict": [], "speedup_vs_float32": [],
                                "median_step_ms": [], "remeasured_ms": [], "val_loss": [],
                                "reason": []}
    for row in summary.rows:
        median = row.judgement.median_step_ms
        if row.estimate is not None and row is not summary.baseline:
            speedup = round(row.estimate.ratio, 4)
        else:
            speedup = round(base / median, 4) if base and median else None
        columns["trial"].append(row.number)
        columns["config"].append(row.config.describe() + (" ★" if row is summary.best else ""))
        columns["verdict"].append(row.judgement.verdict.value)
        columns["speedup_vs_float32"].append(speedup)
        columns["median_step_ms"].append(None if median is None else round(median, 4))
        columns["remeasured_ms"].append(None if row.remeasured_ms is None
                                        else round(row.remeasured_ms, 4))
        columns["val_loss"].append((row.result.validation or {}).get("loss"))
        columns["reason"].append(row.judgement.reason or "")
    return columns


def node_losses(executor: Executor, store: RunStore) -> list[str]:
    """Ray nodes lost mid-trial (their trials ran again elsewhere): run.json and the summary."""
    losses = list(executor.node_losses)
    if losses:
        store.update_run(node_losses=losses)
    return losses


def record_exclusive_phases(executor: Executor, store: RunStore, tracker) -> None:
    """When and on which node the finalists were timed with a node to themselves: run.json and
    the parent run (``exclusive_phases.json``), so overlaps between jobs can be checked."""
    phases = list(executor.exclusive_phases)
    if not phases:
        return
    store.update_run(exclusive_phases=phases)
    tracker.client.log_dict(tracker.parent_id, {"phases": phases}, "exclusive_phases.json")


def make_plots(summary: TuneSummary, diagnostics: dict[str, Any] | None,
                folder: Path) -> list[Path]:
    """Plots are a courtesy: a plotting problem is reported, never fatal to the job."""
    return _courtesy(make_all, summary, diagnostics, folder) or []


def plot_diagnostics_early(diagnostics: dict[str, Any], folder: Path, tracker,
                           drawn: list[Path]) -> None:
    """The diagnostics' heatmap, which needs no trial: drawn and logged on the records' thread
    while the baseline builds and traces (0.08 s the closing records then spare); appended to
    ``drawn`` once made, so that the closing does not draw it again."""
    folder.mkdir(parents=True, exist_ok=True)
    path = _courtesy(diagnostics_heatmap, diagnostics, folder / "diagnostics.png")
    if path is not None:
        drawn.append(path)
        tracker.log_plots([path])


def _courtesy(draw, *args):
    import warnings

    try:
        return draw(*args)
    except Exception as exc:  # noqa: BLE001 - plots are a courtesy: a warning, never the end
        warnings.warn(f"could not draw the plots: {type(exc).__name__}: {exc}", stacklevel=2)
        return None
