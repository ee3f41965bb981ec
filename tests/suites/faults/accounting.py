"""Every trial accounted for: what a run directory's records say about each trial it started.

The executors write each spec to ``submitted.jsonl`` before a worker gets it (the driver's
side, so a crash of the worker cannot erase it). For each trial number started in the search,
this reads the other records and checks they agree:

- ``trials.jsonl`` (and ``trials.json`` once the run finished): the trial's verdict;
- Optuna (``optuna.db``): the told state of the trial's Optuna trial matches the verdict
  (failed -> FAIL, stopped_slow -> PRUNED, judged -> COMPLETE) and carries its number;
- MLflow (``mlflow.db``): a child run with the trial's number, closed with the verdict
  (FAILED for a failed trial, FINISHED otherwise).

A trial that started and did not finish (the driver was killed, and the resume re-queued it)
must be closed in the records as such: its MLflow run ended KILLED and its Optuna trial
failed; a float32 baseline that ended the job has its verdict in MLflow and fails in Optuna.
A trial the run itself states MLflow misses (run.json's ``mlflow_missing``, after MLflow
failed mid-run) is checked against the other records only, and counted as stated. A trial is
**lost** when it started and is in none of the records, or its records disagree; each loss comes
with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

_OPTUNA_STATE = {"failed": "FAIL", "stopped_slow": "PRUNED"}  # anything else: COMPLETE


@dataclass
class Accounting:
    run_dir: Path
    started: list[int] = field(default_factory=list)      # search trials handed to a worker
    finished: list[int] = field(default_factory=list)     # ... and in trials.jsonl
    ended: list[int] = field(default_factory=list)        # ... or closed as killed/failed
    remeasured: list[int] = field(default_factory=list)   # numbers run in the re-measurement
    stated: list[int] = field(default_factory=list)       # missing from MLflow, and said so
    lost: dict[int, str] = field(default_factory=dict)    # number -> why it counts as lost

    def describe(self) -> str:
        lost = "; ".join(f"#{n}: {why}" for n, why in sorted(self.lost.items())) or "none"
        return (f"{self.run_dir.name}: started {len(self.started)}, finished "
                f"{len(self.finished)}, ended unfinished {len(self.ended)}, re-measured "
                f"{len(set(self.remeasured))}, stated missing from MLflow {self.stated}; "
                f"lost: {lost}")


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a kill (resume re-runs that trial)
    return lines


def _mlflow_trial_runs(uri: str, run: dict) -> dict[int, list]:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(run["experiment"])
    if experiment is None:
        return {}
    runs: dict[int, list] = {}
    for found in client.search_runs([experiment.experiment_id], max_results=5000):
        tags = found.data.tags
        if tags.get("precision_tuner.kind") == "trial" and \
                tags.get("mlflow.parentRunId") == run["parent_run_id"]:
            runs.setdefault(int(tags["trial_number"]), []).append(found)
    return runs


def mlflow_trial_numbers(uri: str, run_dir: Path) -> set[int]:
    """The trials of the run in ``run_dir`` that MLflow at ``uri`` holds in full (their run
    closed, with its verdict: a run left RUNNING after a failed write holds part of the
    record), read from MLflow itself, not from the run's own list of what it missed."""
    run = json.loads((Path(run_dir) / "run.json").read_text())
    return {number for number, runs in _mlflow_trial_runs(uri, run).items()
            if any(found.info.status != "RUNNING" and "verdict" in found.data.tags
                   for found in runs)}


def _optuna_trials(run_dir: Path, run: dict) -> dict[int, object]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=run["study_name"],
                              storage=f"sqlite:///{run_dir / 'optuna.db'}")
    return {trial.number: trial for trial in study.get_trials(deepcopy=False)}


def account(run_dir: Path, mlflow_uri: str | None = None) -> Accounting:
    """The accounting of one run directory (an absent or empty one started nothing);
    ``mlflow_uri``: where its MLflow records are, when not in the run directory's mlflow.db."""
    run_dir = Path(run_dir)
    result = Accounting(run_dir)
    submitted = _jsonl(run_dir / "submitted.jsonl")
    result.started = sorted({s["number"] for s in submitted if s["phase"] == "search"})
    result.remeasured = [s["number"] for s in submitted if s["phase"] == "re-measurement"]
    if not (run_dir / "run.json").is_file():
        for number in result.started:
            result.lost[number] = "started, but the run directory has no run.json"
        return result
    run = json.loads((run_dir / "run.json").read_text())
    records: dict[int, list[dict]] = {}
    for record in _jsonl(run_dir / "trials.jsonl"):
        records.setdefault(record["number"], []).append(record)
    final = None
    if run.get("status") == "finished":
        final = {r["number"]: r for r in json.loads((run_dir / "trials.json").read_text())}
    mlflow_runs = _mlflow_trial_runs(mlflow_uri or f"sqlite:///{run_dir / 'mlflow.db'}", run)
    stated = set(run.get("mlflow_missing", ()))
    optuna_trials = _optuna_trials(run_dir, run)

    for number in sorted(set(result.started) | set(records) | set(final or {})):
        problem = (_check_finished(number, records[number], final, mlflow_runs, optuna_trials,
                                   number in stated)
                   if number in records else
                   _check_unfinished(number, run, mlflow_runs, optuna_trials))
        if number not in result.started:
            problem = problem or "in the records, but never handed to a worker"
        if problem:
            result.lost[number] = problem
        elif number in records:
            result.finished.append(number)
            if number in stated:
                result.stated.append(number)
        else:
            result.ended.append(number)
    for number in set(result.remeasured) - set(result.finished):
        result.lost.setdefault(number, "re-measured, but not a finished trial")
    return result


def _check_finished(number: int, lines: list[dict], final: dict | None, mlflow_runs,
                    optuna_trials, stated: bool = False) -> str | None:
    record = lines[-1]
    if any(line != record for line in lines):
        return "trials.jsonl holds it twice, differently"
    verdict = record["verdict"]
    if final is not None:
        if number not in final:
            return "in trials.jsonl but not in trials.json"
        if final[number]["verdict"] != verdict:
            return (f"trials.jsonl says {verdict}, trials.json says "
                    f"{final[number]['verdict']}")
    runs = {r.info.run_id: r for r in mlflow_runs.get(number, [])}
    child = runs.get(record.get("run_id"))
    status = "FAILED" if verdict == "failed" else "FINISHED"
    if stated:
        pass  # the run said MLflow misses it: the other records must hold it
    elif child is None:
        return f"finished ({verdict}), but not in MLflow"
    elif child.info.status != status or child.data.tags.get("verdict") != verdict:
        return (f"trials.jsonl says {verdict}, MLflow says {child.data.tags.get('verdict')} "
                f"({child.info.status})")
    if record.get("optuna_number") is not None:
        trial = optuna_trials.get(record["optuna_number"])
        expected = _OPTUNA_STATE.get(verdict, "COMPLETE")
        if trial is None:
            return f"finished ({verdict}), but its Optuna trial is missing"
        if trial.state.name != expected or trial.user_attrs.get("trial") != number:
            return (f"trials.jsonl says {verdict}, Optuna says {trial.state.name} for trial "
                    f"{trial.user_attrs.get('trial')}")
    return None


def _check_unfinished(number: int, run: dict, mlflow_runs, optuna_trials) -> str | None:
    runs = mlflow_runs.get(number, [])
    if not runs:
        return "started, and in no record"
    for child in runs:
        status, verdict = child.info.status, child.data.tags.get("verdict")
        # The one trial with a verdict that trials.jsonl leaves out on purpose: a float32
        # baseline that did not train stably ends the job (a resume starts from a new one).
        ended_the_job = number == 0 and run.get("status") == "failed" and \
            status in ("FAILED", "FINISHED") and verdict not in (None, "running")
        if status != "KILLED" and not ended_the_job:
            return f"started, not in trials.jsonl, but MLflow says {verdict} ({status})"
        optuna_number = child.data.tags.get("optuna_trial", "-")
        if optuna_number != "-":
            trial = optuna_trials.get(int(optuna_number))
            if trial is None or trial.state.name != "FAIL":
                state = trial.state.name if trial is not None else "missing"
                return f"started, not finished, but its Optuna trial is {state}"
    return None
