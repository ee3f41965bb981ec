"""MLflow records: one parent run per tuning job, one child run per trial.

Everything goes through ``MlflowClient`` from the driver only (many processes writing one
SQLite file give "database is locked"). Default store: ``sqlite:///RUN_DIR/mlflow.db`` with
artifacts under ``RUN_DIR/mlartifacts``; ``--tracking-uri`` points at a tracking server instead.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Iterable

from tuner.apply.config import PrecisionConfig
from tuner.judging.noise import SpeedupEstimate
from tuner.judging.underflow import gradient_histograms, underflow_note
from tuner.judging.verdict import Judgement
from tuner.records.diagnostics_report import markdown
from tuner.records.mlflow_stores import RANKED_BY
from tuner.records.mlflow_text import (
    SUMMARY_TABLE,
    chart_steps,
    config_params,
    placement_text,
    table_html,
    trial_run_name,
    validation_metrics,
)
from tuner.records.timing import describe_ceiling
from tuner.trial_types import TrialResult

_MAX_BATCH = 900  # MLflow accepts at most 1000 metrics per log_batch call

# MLflow 3 opens an experiment without this tag in its GenAI layout (traces, evaluations),
# where none of our metrics show; "custom_model_development" is the model-training layout.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def result_series(result: TrialResult) -> list[tuple[str, list]]:
    """The per-step series a multi-loss, multi-optimizer trial adds: each loss the train_step
    returned (``d_loss``) and each optimizer's loss scale (``loss_scale.g_optimizer``)."""
    return [*((name, values) for name, values in result.loss_terms.items() if name != "loss"),
            *((f"loss_scale.{record['name']}", record["loss_scales"])
              for record in result.optimizers)]


def experiment_for(client, name: str, artifact_location: str | None) -> str:
    """The id of experiment ``name``, created when missing. Two service jobs of one task start
    at once: both may find it missing, and the server refuses the second creation (a unique
    name), so a refused creation reads the experiment the other job made."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location,
                                            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except Exception:  # noqa: BLE001 - MLflow reports the clash as its own error types
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG,
                                  EXPERIMENT_KIND)
    return experiment.experiment_id


class Tracker:
    def __init__(self, tracking_uri: str, run_dir: Path, experiment_name: str) -> None:
        from mlflow import MlflowClient

        # After the import: importing mlflow configures its own loggers at INFO.
        for name in ("mlflow", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)

        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri)
        artifact_location = None
        if tracking_uri.startswith("sqlite:"):
            artifact_location = (run_dir / "mlartifacts").resolve().as_uri()
        self.experiment_id = experiment_for(self.client, experiment_name, artifact_location)
        self.parent_id: str | None = None
        self.trial_tags: dict[str, str] = {}   # on every trial run too (a service job's id)

    # -- parent ----------------------------------------------------------------------------
    def start_parent(self, run_name: str, params: dict[str, Any], tags: dict[str, str]) -> str:
        run = self.client.create_run(self.experiment_id, run_name=run_name,
                                     tags={"precision_tuner.kind": "tuning_job", **tags})
        self.parent_id = run.info.run_id
        self._log_params(self.parent_id, {k: str(v) for k, v in params.items()})
        return self.parent_id

    def finish_parent(self, *, metrics: dict[str, float], best: PrecisionConfig | None,
                      summary_markdown: str, status: str = "FINISHED",
                      table: dict[str, list] | None = None) -> None:
        """Close the parent run with its metrics, the best config and the summary; ``table``
        (column -> values, one value per trial) also goes in as ``trials_table.json`` (MLflow's
        table artifact) and ``summary.html``, which the artifact view renders as a table."""
        assert self.parent_id is not None
        self._log_metrics(self.parent_id, metrics.items())
        if best is not None:
            self.client.log_dict(self.parent_id, best.to_dict(), "best_precision.json")
            self.client.set_tag(self.parent_id, "best_config", best.describe())
        self.client.log_text(self.parent_id, summary_markdown, "summary.md")
        if table:
            self.client.log_table(self.parent_id, data=table, artifact_file="trials_table.json")
            self.client.log_text(self.parent_id, table_html(table), SUMMARY_TABLE)
        self.client.set_terminated(self.parent_id, status)

    def log_confirmation(self, confirmations: list[dict[str, Any]]) -> None:
        """Each confirmation's validation curves on the parent run (``confirm_val_loss_float32``
        and ``confirm_val_loss_trial_<n>``, by step) and its record (``confirmation.json``)."""
        assert self.parent_id is not None
        per_step = []
        for confirmation in confirmations:
            for point in confirmation["checkpoints"]:
                for who, key in (("float32", "confirm_val_loss_float32"),
                                 ("pick", f"confirm_val_loss_trial_{confirmation['trial']}")):
                    loss = point[who].get("loss")
                    if loss is not None:
                        per_step.append((key, loss, point["step"]))
        self._log_metrics(self.parent_id, [], per_step=per_step)
        self.client.log_dict(self.parent_id, {"confirmations": confirmations},
                             "confirmation.json")

    def log_ceiling(self, ceiling: dict[str, Any]) -> None:
        """Each precision's speed on the trial device, the limit the picks are read against."""
        assert self.parent_id is not None
        figures = [(f"ceiling_{dtype}", speed) for dtype, speed in ceiling["speed"].items()]
        for figure in ("peak", "model"):   # ceiling_peak_bfloat16, ceiling_model_bfloat16
            figures += [(f"ceiling_{figure}_{dtype}", speed) for dtype, speed
                        in (ceiling.get(figure) or {}).get("speed", {}).items()]
        self._log_metrics(self.parent_id, figures)
        self.client.set_tag(self.parent_id, "ceiling", describe_ceiling(ceiling)[:5000])

    def log_sizing(self, steps: int, why: str) -> None:
        """How many steps every trial trains, as the sized float32 baseline decided."""
        assert self.parent_id is not None
        self._log_metrics(self.parent_id, [("steps_per_trial", float(steps))])
        self.client.set_tag(self.parent_id, "steps_sized_by", why[:5000])

    def log_timing(self, metrics: dict[str, float], breakdown: dict[str, Any]) -> None:
        """Where the job's wall time went (after the parent run closed: the records' own time
        is part of it)."""
        assert self.parent_id is not None
        self._log_metrics(self.parent_id, metrics.items())
        self.client.log_dict(self.parent_id, breakdown, "timing.json")

    def log_plots(self, paths: list[Path]) -> None:
        assert self.parent_id is not None
        for path in paths:
            self.client.log_artifact(self.parent_id, str(path), "plots")

    def log_diagnostics(self, diagnostics: dict[str, Any]) -> None:
        assert self.parent_id is not None
        self.client.log_dict(self.parent_id, diagnostics, "diagnostics.json")
        self.client.log_text(self.parent_id, markdown(diagnostics), "diagnostics.md")
        if diagnostics.get("candidates"):
            self.client.set_tag(self.parent_id, "float32_candidates",
                                ", ".join(diagnostics["candidates"][:10]))
        self.client.set_tag(self.parent_id, "recommended_initial_loss_scale",
                            f"2^{diagnostics['loss_scale']['exponent']}")
        self.client.set_tag(self.parent_id, "float16_gradient_underflow_at_scale_1",
                            underflow_note(gradient_histograms(diagnostics), 1.0) or "none")

    def resume_parent(self, parent_id: str, recorded: set[str] = frozenset()) -> set[str]:
        """Continue an interrupted job's parent run. Its trial runs still open are ended as
        killed, except those of trials the run directory ``recorded`` as finished (killed
        before MLflow had their results): their ids are returned, for the caller to log."""
        self.parent_id = parent_id
        self.client.update_run(parent_id, status="RUNNING")
        orphans = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{parent_id}' and "
                          "attributes.status = 'RUNNING'")
        behind = set()
        for run in orphans:
            if run.info.run_id in recorded:
                behind.add(run.info.run_id)
            else:
                self.kill_trial(run.info.run_id, "the tuning process was stopped during this "
                                                 "trial; it was re-queued")
        return behind

    # -- children --------------------------------------------------------------------------
    def start_trial(self, *, number: int, config: PrecisionConfig,
                    optuna_number: int | None = None, purpose: str = "search",
                    placed: dict[str, Any] | None = None) -> str:
        """Open a trial's run when it starts, so the UI shows what is running."""
        assert self.parent_id is not None
        tags = {"mlflow.parentRunId": self.parent_id,
                "precision_tuner.kind": "trial",
                "trial_number": str(number),
                "purpose": purpose,
                "optuna_trial": "-" if optuna_number is None else str(optuna_number),
                "verdict": "running", **self.trial_tags}
        if placed is not None:  # which layers each float32 group and pattern selected
            tags["float32_layers"] = placement_text(placed)[:5000]
        run = self.client.create_run(self.experiment_id, tags=tags,
                                     run_name=f"#{number} {config.describe()}")
        self._log_params(run.info.run_id, config_params(config))
        return run.info.run_id

    def kill_trial(self, run_id: str, reason: str) -> None:
        self.client.set_tag(run_id, "verdict", "killed")
        self.client.set_tag(run_id, "reason", reason)
        self.client.set_terminated(run_id, "KILLED")

    def log_trial(self, run_id: str, *, config: PrecisionConfig, result: TrialResult,
                  judgement: Judgement, baseline_ms: float | None) -> None:
        """Record a finished trial in the run opened by ``start_trial`` and close it."""
        tags = {"verdict": judgement.verdict.value,
                "reason": judgement.reason or "-",
                "outcome": result.outcome.value,
                "failure_class": result.failure_class.value if result.failure_class else "-",
                "failure_message": result.failure_message[:5000] or "-",
                "failure_layer": result.failure_layer or "-",
                "exclusive_timing": str(result.exclusive_timing).lower(),
                "node": result.node or "-",
                "memory_source": result.memory_source or "-"}
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        now = int(time.time() * 1000)
        series = [("loss", result.losses), ("step_time_ms", result.step_times_ms),
                  ("loss_scale", result.loss_scales), *result_series(result)]
        per_step = [(key, values[step], step) for key, values in series
                    for step in chart_steps(values)]
        summary: dict[str, float | None] = {
            "median_step_ms": judgement.median_step_ms,
            "loss_decrease_ratio": judgement.loss_decrease_ratio,
            "stable": 1.0 if judgement.stable else 0.0,
            "skipped_steps": float(result.skipped_steps),
            "steps_run": float(len(result.losses)),
            "setup_s": result.setup_s, "trace_s": result.trace_s,
            "train_s": result.train_s, "wall_s": result.wall_s,
            "weights_bytes": result.weights_bytes, "peak_memory_bytes": result.peak_memory_bytes,
        }
        if judgement.median_step_ms and result.batch_size:
            summary["samples_per_s"] = result.batch_size * 1000.0 / judgement.median_step_ms
        if judgement.median_step_ms and baseline_ms:
            summary["speedup_vs_float32"] = baseline_ms / judgement.median_step_ms
        if result.losses:
            summary["final_loss"] = result.losses[-1]
        for record in result.optimizers:   # several optimizers: each one's skipped steps
            summary[f"skipped_steps.{record['name']}"] = float(len(record["skipped"]))
        summary.update(validation_metrics(result.validation))
        if result.training_memory:
            memory = result.training_memory
            summary["training_memory_bytes"] = float(memory["total_bytes"])
            for part in ("weights", "gradients", "optimizer", "activations"):
                summary[f"memory_{part}_bytes"] = float(sum(memory[part].values()))
        summary.update(self._reach(run_id, result.precision_reach or {}))
        self._log_metrics(run_id, [(k, v) for k, v in summary.items() if v is not None],
                          per_step=per_step, timestamp=now)
        self.client.log_dict(run_id, config.to_dict(), "precision_config.json")
        self.client.log_dict(run_id, dict(series), "steps.json")   # every step of each series
        # The runs table shows names but no metric until the user adds columns: the verdict,
        # speedup and median step time go in the name, so the first view shows them.
        self.client.update_run(run_id, name=trial_run_name(
            number=result.number,
            config=config, verdict=judgement.verdict.value,
            speedup=summary.get("speedup_vs_float32"), median_ms=judgement.median_step_ms))
        status = "FAILED" if judgement.verdict.value == "failed" else "FINISHED"
        self.client.set_terminated(run_id, status)

    def _reach(self, run_id: str, reach: dict) -> dict[str, float | None]:
        """How much of the model the trial's 16-bit dtype reached (tuner.apply.reach): two
        metrics, and the layers outside it as a tag."""
        if reach.get("elsewhere") and reach.get("dtype") != "float32":
            self.client.set_tag(run_id, "layers_outside_16bit", ", ".join(
                f"{entry['path']} ({entry['dtype']}, {entry['origin']})"
                for entry in reach["elsewhere"])[:5000])
        return {"precision_reach_parameters": reach.get("parameter_share"),
                "precision_reach_activations": reach.get("activation_share")}

    def log_remeasure(self, run_id: str, median_ms: float,
                      estimate: SpeedupEstimate | None) -> None:
        """The re-measured median and the speedup vs float32 with its interval."""
        metrics = [("remeasured_median_step_ms", median_ms)]
        if estimate is not None:
            metrics += [(RANKED_BY, estimate.ratio),
                        ("remeasured_speedup_low", estimate.low),
                        ("remeasured_speedup_high", estimate.high),
                        ("remeasure_rounds", float(estimate.rounds))]
        self._log_metrics(run_id, metrics)

    # -- helpers ---------------------------------------------------------------------------
    def _log_params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 90):
            self.client.log_batch(run_id, params=items[start:start + 90])

    def _log_metrics(self, run_id: str, summary: Iterable[tuple[str, float]], *,
                     per_step: list[tuple[str, float, int]] = (), timestamp: int | None = None
                     ) -> None:
        from mlflow.entities import Metric

        timestamp = timestamp or int(time.time() * 1000)
        metrics = [Metric(k, float(v), timestamp, 0) for k, v in summary]
        metrics += [Metric(k, float(v), timestamp, step) for k, v, step in per_step]
        for start in range(0, len(metrics), _MAX_BATCH):
            self.client.log_batch(run_id, metrics=metrics[start:start + _MAX_BATCH])
