"""The tune job, from the task check to the summary: what ``tuner.tune()`` and
``precision-tuner tune`` both run (``run_job``), on the ``TuneOptions`` each builds.

The task is checked, the plan resolved from the options (tuner.run.plan), the space fitted to
the model on the executor, and the search runs (tuner.run.search_run) under the live progress
bar; the summary is printed and the pick exported at the end. The options are read, never
written: whatever the job derives from them is its own.
"""

from __future__ import annotations

import datetime
import importlib
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tuner import interrupt, job_context
from tuner.api.progress import live_progress
from tuner.api.result import TuneResult
from tuner.dependency_versions import refuse_if_unsupported
from tuner.errors import UsageError
from tuner.execution.base import Executor
from tuner.execution.choice import ExecutorChoice, choose
from tuner.execution.local import LocalProcessExecutor
from tuner.execution.ray_pool import RayExecutor
from tuner.records.mlflow_stores import StagedStores, redact_uri
from tuner.records.plots import warm_up
from tuner.records.report import print_summary
from tuner.records.run_store import RunStore
from tuner.records.timing import TimeBreakdown
from tuner.run.model_fit import fit_to_model
from tuner.run.options import TuneOptions
from tuner.run.plan import resolve
from tuner.run.search_run import run_search
from tuner.run.task_file import check_task_file, require_tensorflow
from tuner.task_facts import TaskFacts

# Long enough for a loaded cluster to accept a connection; short enough that a wrong address is
# refused at once (Ray and MLflow's HTTP client would otherwise retry for minutes).
_CONNECT_TIMEOUT_S = 5.0


def _check_writable_dir(path: Path) -> None:
    existing = path
    while not existing.exists():
        existing = existing.parent
    try:  # os.access() says yes to root everywhere; only a real attempt tells
        if not existing.is_dir():
            raise OSError("not a directory")
        os.rmdir(tempfile.mkdtemp(prefix=".precision-tuner-check-", dir=existing))
    except OSError as exc:
        raise UsageError(f"{str(path)!r} is not writable ({str(existing)!r}: "
                         f"{exc.strerror or exc}). Choose another location.") from None


def run_job(options: TuneOptions) -> TuneResult:
    """The job ``options`` ask for: check, fit, search, re-measure, confirm, export; the run
    read back. Ctrl-C (or a notebook's stop) is kept until the job can act on it."""
    with interrupt.handling():
        _run(options)
    return TuneResult(options.run_dir)


def _run(options: TuneOptions) -> None:
    from rich.console import Console

    started = time.perf_counter()
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    # Everything that can be refused is refused before anything is written.
    refuse_if_unsupported()
    task_path = check_task_file(options.task)
    if not options.ray_address:  # trials run here: this environment needs TensorFlow
        require_tensorflow()
    run_dir, out = options.run_dir, options.out
    choice = choose(options.executor, options.workers, options.ray_address,
                    service_job=job_context.job_id() is not None)
    store = RunStore(run_dir)
    previous = store.read_run() if store.exists else None
    if options.resume and previous is None:
        raise UsageError(f"--resume: {str(run_dir)!r} holds no run to resume (no run.json). "
                         "Pass the --run-dir of an interrupted `precision-tuner tune`.")
    if previous is None and run_dir.exists() and any(run_dir.iterdir()):
        raise UsageError(f"run directory {str(run_dir)!r} is not empty and holds no "
                         "precision-tuner run. Choose a new --run-dir.")
    plan = resolve(options, previous)
    _check_out(out)
    _check_writable_dir(run_dir)
    _check_writable_dir(out.resolve().parent)
    _check_reachable(options.ray_address, options.tracking_uri)

    budget = "every config" if plan.exhaustive else f"{plan.trials} trials"
    console.print(f"precision-tuner: tuning [bold]{task_path.name}[/] with space "
                  f"[bold]{plan.space.name}[/] ({budget}, {plan.describe_steps()})")
    staged = StagedStores(mlflow=not options.tracking_uri) if previous is None else None
    try:
        with _executor(choice, options.ray_address, console) as executor:
            clock = TimeBreakdown()
            plan, facts, diagnostics = _fit_to_model(executor, plan, console, clock,
                                                         started, importing=staged is None)
            if staged is not None:  # the task is checked: the run directory may be written
                staged.move_into(run_dir)
            summary = _search_with_progress(
                plan, executor, console, resuming=previous is not None,
                done=len(store.read_trials()), facts=facts, diagnostics=diagnostics,
                clock=clock, started=started)
    finally:
        if staged is not None:
            staged.discard()
    print_summary(summary, console)
    earlier = None if options.force else set_aside(out)
    summary.best_config.save(out, overwrite=True)
    console.print(f"best config written to [bold]{out}[/] (also in {run_dir}/)")
    if earlier is not None:
        console.print(f"the earlier {out.name} is kept as {earlier}", markup=False)
    if job_context.job_id() is not None:  # a service job: the user is on another machine
        console.print(f"fetch it: precision-tuner fetch {job_context.job_id()}; browse the "
                      "trials: precision-tuner ui --service ADDRESS", markup=False)
        return
    console.print(f"browse the trials: precision-tuner ui --run-dir {run_dir}"
                  + ("" if not options.tracking_uri else
                     f"  (tracking: {_redact(options.tracking_uri)})"))


def _search_with_progress(plan, executor, console, *, resuming: bool, done: int,
                          facts: TaskFacts, diagnostics: dict[str, Any],
                          clock: TimeBreakdown, started: float):
    """The search of the checked and fitted plan on ``executor`` (``done`` of its trials
    finished by the run it resumes), with the progress display."""
    if plan.exhaustive:
        console.print(f"exhaustive: {plan.trials} distinct configs in space {plan.space.name}")
    if resuming:
        console.print(f"resuming {plan.run_dir}: {done} of {plan.trials} trials already finished")
    with live_progress(console, plan.trials, done) as progress:
        summary = run_search(plan, executor, progress, facts, started=started,
                             diagnostics=diagnostics, clock=clock)
    if executor.log_path is not None:
        _copy_log(executor.log_path, plan.run_dir / "worker.log")
    return summary


def _fit_to_model(executor, plan, console, clock, started: float, importing: bool = True):
    """Check the task in the worker, fit the space to the model's layers, run diagnostics.
    Times the start-up (until the worker began the check), the check and the diagnostics.
    ``importing``: import the records' libraries meanwhile (not where StagedStores' thread
    already does: two threads importing one package can see it half initialised, as a
    suite run did: ``module 'optuna.pruners' has no attribute '_filter_study'``)."""
    console.print("starting the TensorFlow worker and checking the task...")
    # The records' libraries take a second or more to import (MLflow, then Optuna's SQLite
    # storage, matplotlib for the plots), and the plots' first drawing most of another;
    # meanwhile the driver only waits on the worker. Joined before anything else runs here,
    # for the same reason.
    thread = threading.Thread(target=_import_quietly, args=RECORD_MODULES if importing else (),
                              daemon=True)
    thread.start()
    try:
        # One call: the task is loaded and the model built once for the check and the
        # diagnostics.
        facts = TaskFacts.from_dict(executor.probe(
            str(plan.task_path), plan.learned.batch_pool or plan.steps, plan.space.float32_layers,
            ceiling=True, diagnose_steps=3))
    finally:
        thread.join()
    parts = {"task check": facts.probe_s, "ceiling probe": facts.ceiling_s,
             "diagnostics": facts.diagnostics_s}
    clock.add("start-up", time.perf_counter() - started - sum(parts.values()))
    for phase, spent in parts.items():
        clock.add(phase, spent)
    plan, diagnostics, lines = fit_to_model(plan, facts)
    console.print(lines[0])
    for line in lines[1:]:
        console.print(line, markup=False)
    return plan, facts, diagnostics


# The plots' matplotlib too (0.3-0.8 s, paid at the end of every tune otherwise).
RECORD_MODULES = ("mlflow", "optuna.storages._rdb.storage", "alembic.migration",
                  "sqlalchemy.dialects.sqlite", "matplotlib.figure",
                  "matplotlib.backends.backend_agg")


def _import_quietly(*modules: str) -> None:
    """Import ``modules``, then draw the plots' warm-up figure."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the records import it again and say what is wrong
            pass
    try:
        warm_up()
    except Exception:  # noqa: BLE001 - the plots draw without it, a little later
        pass


def _check_out(out: Path) -> None:
    if out.suffix.lower() not in (".json", ".yaml", ".yml"):
        raise UsageError(f"--out must end in .json, .yaml or .yml. Received: --out {out}")


def set_aside(out: Path) -> Path | None:
    """A second ``tune`` in the same folder is the normal case: the export already at ``out``
    is renamed after the time it was written (``best_precision.20261206-101500.json``), so
    the new one takes its place and the earlier stays beside it. None when there was none."""
    if not out.is_file():
        return None
    stamp = datetime.datetime.fromtimestamp(out.stat().st_mtime).strftime("%Y%m%d-%H%M%S")
    kept = out.with_name(f"{out.stem}.{stamp}{out.suffix}")
    number = 1
    while kept.exists():
        number += 1
        kept = out.with_name(f"{out.stem}.{stamp}-{number}{out.suffix}")
    os.replace(out, kept)
    return kept


def _host_port(address: str, default_port: int | None) -> tuple[str, int] | None:
    """``HOST:PORT`` (or ``scheme://HOST:PORT/...``) as a pair; None when there is none."""
    import urllib.parse

    parts = urllib.parse.urlsplit(address if "://" in address else f"//{address}")
    try:
        port = parts.port or default_port
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname and port else None


def _check_reachable(ray_address: str | None, tracking_uri: str | None) -> None:
    """Refuse a --ray-address or an HTTP --tracking-uri that accepts no connection, in seconds,
    before anything is started or written."""
    import socket

    targets = []
    if ray_address and ray_address != "auto":
        targets.append(("--ray-address", ray_address, _host_port(ray_address, None),
                        "Start the cluster (`ray start --head`) or fix the address"))
    uri = tracking_uri or ""
    if uri.startswith(("http://", "https://")):
        targets.append(("--tracking-uri", _redact(uri),
                        _host_port(uri, 443 if uri.startswith("https") else 80),
                        "Start the tracking server (`mlflow server`) or fix the URI"))
    for flag, shown, where, fix in targets:
        if where is None:
            raise UsageError(f"{flag} needs a host and a port. Received: {flag} {shown}. "
                             f"Pass HOST:PORT{' or auto' if flag == '--ray-address' else ''}.")
        try:
            socket.create_connection(where, timeout=_CONNECT_TIMEOUT_S).close()
        except OSError as exc:
            why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
            raise UsageError(f"{flag} is unreachable ({why} from {where[0]}:{where[1]} within "
                             f"{_CONNECT_TIMEOUT_S:g} s). Received: {flag} {shown}. {fix}.") \
                from None


def _redact(uri: str) -> str:
    return redact_uri(uri)


def _executor(choice: ExecutorChoice, ray_address: str | None, console) -> Executor:
    """The executor ``choice`` names (tuner.execution.choice), said in one line; what it was
    and why goes into run.json and MLflow with it."""
    console.print(f"trials: {choice.line()}", markup=False)
    if choice.kind == "local":
        local = LocalProcessExecutor()
        local.chosen = choice.to_dict()
        return local
    where = f"Ray cluster at {_redact(ray_address)}" if ray_address else "a local Ray instance"
    console.print(f"starting Ray workers on {where}...")
    if job_context.job_id() is not None and ray_address:
        # A service job on the team's cluster: screen on a share of it, and wait for a
        # whole node (behind other jobs' re-measurements) rather than time on a busy one.
        executor = RayExecutor(workers=choice.workers, address=ray_address,
                               worker_cpus=job_context.worker_cpus(), node_wait_s=3600.0)
    else:
        executor = RayExecutor(workers=choice.workers, address=ray_address)
    executor.chosen = {**choice.to_dict(), "workers": executor.workers}
    if executor.warm:
        console.print("the cluster keeps warm workers (the service's pool): this job borrows "
                      "them, TensorFlow already imported, and gives them back at its end")
    return executor


def _copy_log(source: str, target: Path) -> None:
    try:
        target.write_bytes(Path(source).read_bytes())
        os.unlink(source)
    except OSError:
        pass
