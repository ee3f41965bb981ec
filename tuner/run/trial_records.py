"""Each trial recorded as it finishes: in trials.jsonl at once (the crash-safe record) and in
MLflow, off the critical path (``TrialRecorder``)."""

from __future__ import annotations

import time
from typing import Any

from tuner.apply.config import PrecisionConfig
from tuner.errors import first_line
from tuner.records.results import TrialRow, row_record
from tuner.records.run_store import RunStore
from tuner.records.timing import TimeBreakdown
from tuner.search.space import placed_layers


class TrialRecorder:
    """Each trial in trials.jsonl (at once: the crash-safe record) and in MLflow (a child run,
    opened when it starts), written off the critical path.

    MLflow's calls (a SQLite transaction or an HTTP request each) run in order on one
    background thread, so the next trial starts while the last one is still being logged; the
    driver waits only for a trial's run id, which was created while the trial ran. ``flush``
    waits for everything queued (and raises what failed) and is called before the parent run
    closes, fails or is killed. A kill before the queue drained leaves trials in trials.jsonl
    whose MLflow runs are still open: a resume catches them up from trials.jsonl
    (``_open``).

    MLflow going away mid-run (a tracking server down, a store that refuses writes) does not
    stop the trials: the first failure is kept (``outage``), later MLflow calls are skipped
    (each would wait for the same dead store), every trial still goes to trials.jsonl and
    Optuna, and the trials MLflow misses are listed (``missing``) for the summary and run.json.
    """

    def __init__(self, tracker, store: RunStore, matches: dict[str, Any] | None,
                 clock: TimeBreakdown) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.tracker = tracker
        self.matches = matches
        self.store = store
        self.clock = clock
        self.open_runs: dict[int, Any] = {}    # trial number -> Future of its MLflow run id
        self._queue = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-records")
        self._queued: list[Any] = []
        self.outage: str | None = None    # MLflow's first failure, once it failed
        self.missing: list[int] = []       # trials in trials.jsonl that MLflow does not have
        self._after_first: list[tuple] | None = []   # None once the first trial's run is queued
        self._finished: list[tuple[TrialRow, float | None]] = []   # logged once the next starts
        self.releases: list[dict[str, Any]] = []   # live models let go, in order

    def later(self, call, *args, **kwargs):
        future = self._queue.submit(self._guarded, call, *args, **kwargs)
        self._queued.append(future)
        return future

    def after_first_trial(self, call, *args) -> None:
        """``later``, but behind the first trial's run: the parent run's diagnostics and
        ceiling (two artifacts, metrics and five tags: 0.2 s of requests to a tracking server)
        queued first had put off the first trial's run, which is where a watcher sees the job
        begin."""
        if self._after_first is None:
            self.later(call, *args)
        else:
            self._after_first.append((call, *args))

    def _release_after_first(self) -> None:
        waiting, self._after_first = self._after_first or [], None
        for call, *args in waiting:
            self.later(call, *args)

    def _guarded(self, call, *args, **kwargs):
        if self.outage is not None:
            raise RuntimeError(f"MLflow unavailable: {self.outage}")
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            self.outage = f"{type(exc).__name__}: {first_line(exc, 200)}"
            raise

    def flush(self) -> None:
        """Wait until MLflow has everything queued; re-raise the first failure, unless it is
        an outage (stated in the summary instead)."""
        self._release_after_first()            # a job that ran no trial still records them
        self._release_finished()
        queued, self._queued = self._queued, []
        for future in queued:
            try:
                future.result()
            except Exception:
                if self.outage is None:
                    raise

    def open_run_ids(self) -> list[str]:
        """The MLflow runs of trials still running (their creation waited for)."""
        ids = []
        for future in self.open_runs.values():
            try:
                ids.append(future.result())
            except Exception:  # noqa: BLE001 - a run that was never created needs no closing
                pass
        return ids

    def trial_started(self, number: int, config: PrecisionConfig, optuna_number: int | None,
                      repair: bool) -> None:
        placed = placed_layers(config, self.matches) if self.matches is not None else None
        self.open_runs[number] = self.later(
            self.tracker.start_trial, number=number, config=config,
            optuna_number=optuna_number, purpose="repair" if repair else "search",
            placed=placed)
        self._release_after_first()
        self._release_finished()

    def trial_finished(self, row: TrialRow, baseline_ms: float | None) -> None:
        began = time.perf_counter()
        try:
            row.run_id = self.open_runs.pop(row.number).result()  # created while it ran
        except Exception:
            if self.outage is None:
                raise
            row.run_id = None
        if self.matches is not None:
            row.placed = placed_layers(row.config, self.matches)
        if row.run_id is None:
            self.missing.append(row.number)
        else:
            self._finished.append((row, baseline_ms))
        if row.number == 0 and not row.judgement.stable:
            self.flush()
            return  # the job ends here; a resume must start from a good baseline
        self.store.append_trial(row_record(row))
        row.record_s = time.perf_counter() - began
        self.clock.workers["trials"].record_s += row.record_s

    def _release_finished(self) -> None:
        """Queue the finished trials' MLflow records. They wait until the next trial has
        started: logged at once (a trial's per-step series: 0.1-0.3 s of Python), they held
        the GIL against the driver's Optuna tell and ask and the next trial's submission, and
        the worker stood idle the longer."""
        finished, self._finished = self._finished, []
        for row, baseline_ms in finished:
            logged = self.later(self.tracker.log_trial, row.run_id, config=row.config,
                                result=row.result, judgement=row.judgement,
                                baseline_ms=baseline_ms)
            logged.add_done_callback(lambda done, number=row.number: self._check(done, number))

    def _check(self, logged, number: int) -> None:
        if logged.exception() is not None:
            self.missing.append(number)

    def outage_lines(self) -> list[str]:
        """What the summary says when MLflow failed: since when, and what it misses."""
        if self.outage is None:
            return []
        missing = ", ".join(f"#{n}" for n in sorted(set(self.missing))) or "none"
        return [f"MLflow failed during the run ({self.outage}); the trials went on. Trials "
                f"missing from MLflow: {missing} (all are in trials.jsonl and Optuna); the "
                "job's parent run was not closed"]

    def steps_sized(self, steps: int, why: str) -> None:
        """The run's step count, decided by the sized baseline: in run.json (a resume keeps
        it) and on the MLflow parent run."""
        self.store.update_run(steps=steps, sizing=None, sized_by=why)
        self.later(self.tracker.log_sizing, steps, why)

    def live_models_released(self, event: dict[str, Any]) -> None:
        """Models the worker let go (tuner.run.kept_models): in run.json's ``live_models``."""
        self.releases.append(event)
        self.store.update_run(live_models=list(self.releases))

    def close(self) -> None:
        self._queue.shutdown(wait=True)


def flush_quietly(records: TrialRecorder) -> None:
    """Drain the MLflow queue on the way out of a failed job: the job's own error is the one
    to report."""
    try:
        records.flush()
    except Exception:  # noqa: BLE001 - the job's own error is the one to report
        pass
