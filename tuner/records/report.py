"""Human-readable summaries of a tuning job: a terminal table (rich) and Markdown for MLflow."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.records.mlflow_text import placement_text
from tuner.records.timing import describe_ceiling, peak_speed

if TYPE_CHECKING:
    from tuner.records.results import TuneSummary


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def table_rows(summary: "TuneSummary") -> list[list[str]]:
    """One row per trial: number, config, verdict, median ms, re-measured ms, speedup, ratio,
    training memory (tuner.worker.trial.memory: state plus activations), the shares of parameters
    and activations in the 16-bit dtype, reason. The speedup is the
    re-measured one with its interval where the trial was a finalist; otherwise the
    search-phase ratio (screening only, marked ~)."""
    base = summary.baseline.judgement.median_step_ms if summary.baseline else None
    rows = []
    for row in summary.rows:
        median = row.judgement.median_step_ms
        if row.estimate is not None and row is not summary.baseline:
            speedup = row.estimate.describe()
        else:
            speedup = _fmt(base / median if base and median else None, ".2f", "x ~")
        marker = " ★" if summary.best is not None and row is summary.best else ""
        shared = "" if row.result.exclusive_timing or median is None else " ‡"
        memory = row.result.training_memory
        rows.append([str(row.number), row.config.describe() + marker, row.judgement.verdict.value,
                     _fmt(median, ".2f") + shared, _fmt(row.remeasured_ms, ".2f"), speedup,
                     _fmt(row.judgement.loss_decrease_ratio, ".0%"),
                     _fmt(_validation_figure(row.result.validation or {}), ".4g"),
                     _fmt(memory["total_bytes"] / 1e6 if memory else None, ".3g"),
                     reach_cell(row.result.precision_reach),
                     row.judgement.reason or _bounded(row)])
    return rows


def reach_cell(reach: dict | None) -> str:
    """The share of the parameters and of the activations that computed in the config's 16-bit
    dtype (tuner.apply.reach): what the trial really trained; "-" for float32."""
    if not reach or reach.get("dtype") == "float32":
        return "-"
    return (f"{_fmt(reach.get('parameter_share'), '.0%')}/"
            f"{_fmt(reach.get('activation_share'), '.0%')}")


def _bounded(row) -> str:
    steps = row.judgement.judged_steps
    return f"time-bounded: judged on its first {steps} steps" if steps else ""


def _validation_figure(validation: dict) -> float | None:
    """The validation loss, or where the model has none, the task's val_metric."""
    return validation.get("loss", validation.get("val_metric"))


HEADERS = ["#", "config", "verdict", "median ms", "re-measured ms", "speedup", "loss decr.",
           "val loss", "memory MB", "16-bit params/acts", "why"]


def validation_line(summary: "TuneSummary") -> str | None:
    """Where the validation figures come from (the baseline's evaluation says)."""
    validation = summary.baseline.result.validation if summary.baseline else None
    if not validation:
        return None
    metric = validation.get("val_metric")
    also = "" if metric is None else \
        f"; and on the task's val_metric(model) (float32's {metric:.4g}, lower is better)"
    if "error" in validation and metric is not None:
        return (f"validation: no loss ({validation['error'].split(' (')[0]}); trials were "
                f"judged on their training losses{also}")
    if "error" in validation:
        return (f"validation: none ({validation['error']}); trials were judged on their "
                "training losses only")
    where = ("the task's val_data()" if validation["source"] == "val_data" else
             "a slice held back from the training data, which no trial trains on (the task "
             "defines no val_data())")
    return (f"validation: every trial evaluated on the same {validation['batches']} batches "
            f"({validation['samples']} samples) from {where}{also}")


def confirmation_lines(summary: "TuneSummary") -> list[str]:
    lines = []
    if summary.confirm_skipped:
        lines.append("confirmation: skipped (--no-confirm): the pick was not trained longer "
                     "than a trial before export")
    for confirmation in summary.confirmations:
        lines.append(f"{'confirmation' if confirmation.quality else 'speed check'}: "
                     f"{confirmation.line()}")
        if confirmation.quality:
            lines += confirmation.table()
    return lines


def _drift(estimate) -> str:
    return ", run-to-run drift allowed for" if estimate and estimate.run_drift else ""


def headline(summary: "TuneSummary") -> list[str]:
    lines = []
    only_baseline = summary.best is summary.baseline is not None and len(summary.rows) > 1 and \
        not any(r.judgement.stable for r in summary.rows if r is not summary.baseline)
    if only_baseline:
        lines.append("best: float32 (trial #0): no 16-bit config was both stable and within "
                     "the early-stop limit on this machine")
    elif summary.best is not None and summary.best is summary.baseline:
        lines.append(f"best: float32 (trial #0): {summary.decision}")
    elif summary.best is not None:
        estimate = summary.estimate
        lines.append(f"best: {summary.best.config.describe()} (trial #{summary.best.number}), "
                     f"{estimate.describe() if estimate else '-'} vs float32 "
                     f"({estimate.confidence:.0%} interval{_drift(estimate)}; "
                     f"{_fmt(summary.best.remeasured_ms, '.2f')} ms/step vs "
                     f"{_fmt(summary.baseline.remeasured_ms if summary.baseline else None, '.2f')}"
                     " ms/step, re-measured back to back)")
        lines.append(f"decision: {summary.decision}")
        ceiling = peak_speed(summary.facts.ceiling,
                             summary.best.config.compute_dtype)
        if estimate and ceiling:
            lines.append(f"of the ceiling: {estimate.ratio:.2f}x is {estimate.ratio / ceiling:.0%}"
                         f" of {summary.best.config.compute_dtype}'s peak {ceiling:.2g}x on "
                         "this device")
        if summary.best.placed and summary.best_config and \
                (summary.best_config.float32.groups or summary.best_config.float32.layers):
            lines.append(f"float32 layers in the pick: {placement_text(summary.best.placed)}")
        why = (summary.best_config.provenance or {}).get("loss_scale_why") \
            if summary.best_config else None
        # Without a loss scale, the re-measurement's note gives the evidence.
        if why and summary.best_config.loss_scale.kind.scales:
            lines.append(f"loss scale: {why}")
    lines += summary.head_lines + summary.objective_lines + summary.search_lines
    lines += [f"re-measurement: {note}" for note in summary.remeasure_notes]
    lines += confirmation_lines(summary)
    validation = validation_line(summary)
    if validation:
        lines.append(validation)
    lines += [f"warning: {note}" for note in summary.record_notes]
    notes = {r.judgement.note for r in summary.rows if r.judgement.note}
    lines += [f"note: {note}" for note in sorted(notes)]
    if summary.shared_remeasure:
        lines.append("warning: no Ray node could be reserved for the re-measurement (the "
                     "cluster was busy); the winner's timing was taken beside other work")
    if any(not r.result.exclusive_timing for r in summary.rows):
        lines.append("‡ timed while another trial ran on the same node: used to screen for "
                     "stability only; the winner was picked from exclusive re-measurements")
    stable = sum(r.judgement.stable for r in summary.rows)
    lines.append(f"trials: {len(summary.rows)} ({stable} stable)"
                 + ("; the search space was exhausted" if summary.space_exhausted else ""))
    train = f"{summary.train_s:.1f}" if summary.train_s >= 1 else f"{summary.train_s:.2f}"
    lines.append(f"wall time {summary.wall_s:.1f} s, of which {train} s in training "
                 f"steps: {summary.outside_training_fraction:.0%} spent outside them "
                 f"({summary.trace_s:.1f} s tracing each trial's training step on its first "
                 "call; the rest TensorFlow start-up, model builds and bookkeeping)")
    if summary.breakdown is not None:
        lines.append(summary.breakdown.describe(summary.wall_s))
    if summary.facts.ceiling:
        lines.append(f"device ceiling: {describe_ceiling(summary.facts.ceiling)}")
    return lines


def summary_markdown(summary: "TuneSummary") -> str:
    out = ["# precision-tuner summary", ""]
    out += [f"- {line}" for line in headline(summary)]
    out += ["", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for cells in table_rows(summary):
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(out) + "\n"


def print_summary(summary: "TuneSummary", console) -> None:
    from rich.table import Table

    table = Table(title="precision-tuner: trials", show_lines=False)
    for header in HEADERS:
        table.add_column(header, overflow="fold",
                         justify="right" if header in ("#", "median ms", "re-measured ms",
                                                       "speedup", "loss decr.", "val loss",
                                                       "memory MB", "16-bit params/acts")
                         else "left")
    styles = {"stable": "green", "unstable": "red", "failed": "red", "stopped_slow": "yellow"}
    from rich.markup import escape

    for cells in table_rows(summary):
        table.add_row(*map(escape, cells), style=styles.get(cells[2]))
    console.print(table)
    for line in headline(summary):
        console.print(line, markup=False)
