"""``precision-tuner``: tune, export, ui, spaces. Exit 0 on success, 2 on bad input."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path

from tuner.errors import TunerError, UsageError

_DESCRIPTION = """\
Find the fastest stable 16-bit precision setup for your Keras model.

precision-tuner runs short trial trainings of your model across precision policies,
loss scales, epsilons and float32 layer placements, judges each against a float32
baseline, and writes the fastest stable config to a file you apply with two lines.
"""

_EPILOG = """\
examples:
  precision-tuner tune examples/digits_mlp.py --space quick
  precision-tuner export --run-dir runs/digits_mlp-20261129-101500 --format yaml
  precision-tuner ui --run-dir runs/digits_mlp-20261129-101500
"""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 0.9, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1] (a share of float32's loss decrease, "
                                         f"such as 0.9), got {value:g}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds such as 5, got "
                                         f"{text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be in (0, 3600] seconds, got {value:g}")
    return value


def _gain(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.03, got {text!r}") \
            from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every other bad input
        self.exit(2, f"{self.prog}: error: {message}. See `{self.prog} --help`.\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="precision-tuner", description=_DESCRIPTION, epilog=_EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    tune = _add_tune(commands)
    _add_other_commands(commands)
    _add_service_commands(commands, tune)
    return parser


def _add_tune(commands) -> argparse.ArgumentParser:
    tune = commands.add_parser("tune", help="tune a task file (the main job)",
                               description="Run trial trainings of TASK.py and write the fastest "
                                           "stable precision config.")
    tune.add_argument("task", metavar="TASK.py", help="task file: defines build_model(), "
                      "train_data() and LOSS (see README)")
    tune.add_argument("--space",
                      help="search space: a built-in name (quick, default) or a YAML path "
                           "[default: quick]")
    tune.add_argument("--trials", type=_positive_int, help="number of trials, baseline "
                      "included [default: the space's `trials`]")
    tune.add_argument("--exhaustive", action="store_true",
                      help="try every config of the space instead of a budget of trials (the "
                           "grid; its size is printed first). Not with --trials")
    tune.add_argument("--steps", type=_positive_int,
                      help="training steps per trial, fixed [default: sized by the float32 "
                           "baseline: at least the space's trial.steps, more for a fast model "
                           "until its step time and loss decrease are precise enough]")
    tune.add_argument("--trial-seconds", type=_seconds, metavar="S",
                      help="how long the float32 baseline may train while it sizes the "
                           "trials (a slow model gets fewer steps than trial.steps) [default: "
                           "2.5]")
    tune.add_argument("--confirm-steps", type=_positive_int, metavar="N",
                      help="how many more steps the pick and float32 train, side by side, "
                           "before the pick is exported (validated at 4 points) [default: 10x "
                           "a trial's steps, capped by --confirm-seconds]")
    tune.add_argument("--confirm-seconds", type=_seconds, metavar="S",
                      help="the most training time the default confirmation may take, both "
                           "models together [default: 20]")
    tune.add_argument("--no-confirm", action="store_true",
                      help="export the pick without the confirmation run (the provenance says "
                           "so)")
    tune.add_argument("--run-dir", type=Path, help="where the Optuna and MLflow stores go "
                      "[default: runs/TASK-TIMESTAMP]")
    tune.add_argument("--out", type=Path, default=Path("best_precision.json"),
                      help="where to write the best config (.json or .yaml) [default: %(default)s]")
    tune.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    tune.add_argument("--resume", action="store_true",
                      help="continue the interrupted run in --run-dir (also automatic when "
                           "--run-dir holds an unfinished run)")
    tune.add_argument("--seed", type=int, help="seed for weights, data order and Optuna "
                      "[default: 0]")
    tune.add_argument("--tolerance", type=_ratio, help="share of float32's loss decrease a "
                      "trial must reach to count as stable [default: the space's, 0.9]")
    tune.add_argument("--tracking-uri", help="MLflow tracking server URI [default: SQLite in "
                      "the run directory]")
    tune.add_argument("--time-limit", type=_positive_int, default=900, metavar="SECONDS",
                      help="per-trial time limit; a trial past it is killed [default: "
                           "%(default)s]")
    tune.add_argument("--workers", type=_positive_int, default=1,
                      help="trials run side by side on Ray (each worker a TensorFlow process); "
                           "the winner is always re-timed alone [default: %(default)s]")
    tune.add_argument("--ray-address", metavar="ADDRESS",
                      help="attach to an existing Ray cluster (auto, HOST:PORT or ray://...) "
                           "instead of starting a local one")
    tune.add_argument("--executor", choices=("ray", "local"), default="ray",
                      help="ray: trials on Ray actors; local: one plain subprocess, no Ray "
                           "[default: %(default)s]")
    tune.add_argument("--finalists", type=_positive_int, default=3, help="stable candidates "
                      "re-measured back to back before naming the winner [default: %(default)s]")
    tune.add_argument("--min-gain", type=_gain, default=0.03, metavar="FRACTION",
                      help="a 16-bit config is picked only when the lower end of its speedup "
                           "interval beats float32 by this much; otherwise float32 (a tie goes "
                           "to the simpler config) [default: %(default)s, i.e. 3%%]")
    tune.add_argument("--objective", choices=("speed", "memory", "balanced"), default=None,
                      help="what best means: speed (the fastest config whose gain is real), "
                           "memory (the least training memory), or balanced (from the Pareto "
                           "front of step time and memory, the fastest within --memory-slack "
                           "of the smallest) [default: speed]")
    tune.add_argument("--memory-slack", type=_gain, default=None, metavar="FRACTION",
                      help="balanced: how far above the front's smallest memory the pick may "
                           "be [default: 0.1, i.e. 10%%]")
    tune.add_argument("--keep-slow-policies", action="store_true",
                      help="also try policies whose 16-bit dtype runs a dense layer's training "
                           "step at under half float32's speed on the trial device (float16 on "
                           "most CPUs); by default they are skipped, with a line saying so")
    return tune


def _add_other_commands(commands) -> None:
    export = commands.add_parser("export", help="write the best config of a finished run",
                                 description="Write the best config of a run directory.")
    export.add_argument("--run-dir", type=Path, required=True)
    export.add_argument("--format", choices=("json", "yaml"), default="json")
    export.add_argument("--out", type=Path, help="output file [default: stdout]")
    export.add_argument("--force", action="store_true", help="overwrite --out if it exists")

    ui = commands.add_parser("ui", help="browse the trials in the MLflow UI",
                             description="Start the MLflow UI on a run directory's store, or "
                                         "open a service's MLflow UI (--service).")
    where = ui.add_mutually_exclusive_group()
    where.add_argument("--run-dir", type=Path)
    where.add_argument("--service", metavar="ADDRESS",
                       help="a tuning service's job server (http://HOST:8265; default "
                            "$PRECISION_TUNER_SERVICE when there is no --run-dir): print and "
                            "open its MLflow UI, one experiment per task")
    ui.add_argument("--token-file", type=Path, help=argparse.SUPPRESS)
    ui.add_argument("--no-browser", action="store_true",
                    help="--service: only print the links")
    ui.add_argument("--host", default="127.0.0.1", help="bind address [default: %(default)s; "
                    "anything else exposes your runs to the network]")
    ui.add_argument("--port", type=_positive_int, default=5000)

    diagnose = commands.add_parser(
        "diagnose", help="per-layer float16/bfloat16 range diagnostics of a task",
        description="Run a few instrumented float32 steps and show, per layer, how close "
                    "activations and gradients come to float16's limits.")
    diagnose.add_argument("task", metavar="TASK.py")
    diagnose.add_argument("--steps", type=_positive_int, default=3,
                          help="instrumented steps [default: %(default)s]")
    diagnose.add_argument("--json", type=Path, metavar="FILE",
                          help="also write the full diagnostics as JSON")
    diagnose.add_argument("--all", action="store_true", help="show every layer, not the 25 "
                          "riskiest")

    commands.add_parser("spaces", help="list the built-in search spaces")


_SERVICE_EPILOG = """\
The service is a Ray cluster (its job server takes the jobs) plus an MLflow tracking
server (every job's trials). Loopback by default; bound elsewhere (--host), both ends
require the token written to DIR/auth_token.
"""


def _add_service_commands(commands, tune: argparse.ArgumentParser) -> None:
    """service start|stop|status, and the job commands (submit, jobs, status, logs, stop,
    fetch), which all take --service ADDRESS (or PRECISION_TUNER_SERVICE)."""
    service = commands.add_parser(
        "service", help="start, stop or check a tuning service for a team (Ray + MLflow)",
        description="Run precision-tuner as a service: a Ray head with its job server and an "
                    "MLflow tracking server.", epilog=_SERVICE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = service.add_subparsers(dest="service_action", metavar="ACTION",
                                     parser_class=_Parser, required=True)
    start = actions.add_parser("start", help="start the Ray head and the MLflow server")
    start.add_argument("--dir", type=Path, default=Path("service"),
                       help="where the service keeps its stores, jobs and logs "
                            "[default: %(default)s]")
    start.add_argument("--host", default="127.0.0.1",
                       help="bind address [default: %(default)s]; anything else turns on "
                            "token authentication for Ray's job server and MLflow")
    start.add_argument("--ray-port", type=_positive_int, default=6379,
                       help="Ray's GCS port (worker nodes join here) [default: %(default)s]")
    start.add_argument("--dashboard-port", "--jobs-port", type=_positive_int, default=8265,
                       dest="dashboard_port",
                       help="Ray's dashboard and job server [default: %(default)s]")
    start.add_argument("--mlflow-port", type=_positive_int, default=5000,
                       help="MLflow tracking server and UI [default: %(default)s]")
    start.add_argument("--num-cpus", type=_positive_int,
                       help="CPUs the head offers to trials [default: all]")
    start.add_argument("--auth", action="store_true",
                       help="require the token on loopback too")
    for action in ("stop", "status"):
        parser = actions.add_parser(action, help=f"{action} the service in --dir")
        parser.add_argument("--dir", type=Path, default=Path("service"),
                            help="the service's directory [default: %(default)s]")

    def job_command(name: str, help_text: str, job: bool = True) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help_text, description=help_text[0].upper()
                                     + help_text[1:] + ".")
        if job:
            parser.add_argument("job", metavar="JOB", help="the job id (`precision-tuner jobs`)")
        parser.add_argument("--service", metavar="ADDRESS",
                            help="the service's job server, http://HOST:8265 [default: "
                                 "$PRECISION_TUNER_SERVICE]")
        parser.add_argument("--token-file", type=Path, metavar="FILE",
                            help="the service's token (its DIR/auth_token) when it requires "
                                 "one [default: $PRECISION_TUNER_TOKEN]")
        return parser

    submit = job_command("submit", "submit a task to a tuning service as a Ray job",
                         job=False)
    submit.add_argument("task", metavar="TASK.py", help="task file (shipped with the job)")
    from tuner.cli.jobs import FORWARDED

    for action in tune._actions:  # the same tune flags, same checks, same help
        if action.dest in FORWARDED:
            submit._add_action(action)
    submit.add_argument("--resume", dest="resume_job", metavar="JOB",
                        help="continue a stopped or killed job from its recorded trials, with "
                             "its own flags")
    submit.add_argument("--worker-cpus", type=_positive_int, default=1,
                        help="CPUs per screening worker on the shared cluster "
                             "[default: %(default)s]")
    job_command("jobs", "list the service's tuning jobs", job=False)
    job_command("status", "show a job's status, progress and failure reason")
    logs = job_command("logs", "print a job's log")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing as it grows")
    job_command("stop", "stop a job (its finished trials are kept)")
    fetch = job_command("fetch", "download a job's best config from the service's MLflow")
    fetch.add_argument("--out", type=Path, default=Path("best_precision.json"),
                       help="where to write it (.json or .yaml) [default: %(default)s]")
    fetch.add_argument("--force", action="store_true", help="overwrite --out if it exists")


def _service_command(args, parser: argparse.ArgumentParser) -> int:
    from tuner.cli import service_commands as service_cli
    from tuner.cli import jobs

    if args.command == "service":
        return service_cli.run(args)
    if args.command == "submit":
        defaults = {a.dest: a.default for a in _subparser(parser, "tune")._actions}
        options = {a.dest: a.option_strings[0] for a in _subparser(parser, "tune")._actions
                   if a.option_strings}
        return jobs.submit(args, defaults, options)
    return {"jobs": jobs.list_jobs, "status": jobs.status, "logs": jobs.logs,
            "stop": jobs.stop, "fetch": jobs.fetch}[args.command](args)


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


def _version() -> str:
    from tuner import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "tune":
            return _tune(args)
        if args.command in ("service", "submit", "jobs", "status", "logs", "stop", "fetch"):
            return _service_command(args, parser)
        from tuner.cli import commands

        return getattr(commands, args.command)(args)
    except UsageError as exc:
        print(f"precision-tuner: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except TunerError as exc:
        print(f"precision-tuner: failed: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        hint = ""
        if getattr(args, "command", None) == "tune" and getattr(args, "run_dir", None):
            hint = f"; resume with: precision-tuner tune {args.task} --run-dir {args.run_dir}"
        print(f"precision-tuner: interrupted{hint}", file=sys.stderr)
        return 130


def _check_writable_dir(path: Path) -> None:
    existing = path
    while not existing.exists():
        existing = existing.parent
    try:  # os.access() says yes to root everywhere; only a real attempt tells
        if not existing.is_dir():
            raise OSError("not a directory")
        os.rmdir(tempfile.mkdtemp(prefix=".precision-tuner-check-", dir=existing))
    except OSError as exc:
        raise UsageError(f"{str(path)!r} is not writable ({str(existing)!r}: {exc.strerror or exc})."
                         " Choose another location.") from None


def _tune(args) -> int:
    from rich.console import Console

    from tuner.run.plan import resolve
    from tuner.records.report import print_summary
    from tuner.records.run_store import RunStore
    from tuner.run.task_file import check_task_file
    from tuner.records.timing import TimeBreakdown
    from tuner.records.mlflow_records import StagedStores

    from tuner import interrupt

    interrupt.install()
    started = time.perf_counter()
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    # Everything that can be refused is refused before anything is written.
    task_path = check_task_file(args.task)
    run_dir = args.run_dir = args.run_dir or Path("runs") / (
        f"{task_path.stem}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}")
    if args.executor == "local" and (args.workers > 1 or args.ray_address):
        given = ([f"--workers {args.workers}"] if args.workers > 1 else []) \
            + ([f"--ray-address {args.ray_address}"] if args.ray_address else [])
        raise UsageError("--workers and --ray-address need --executor ray. Received: "
                         f"--executor local {' '.join(given)}. Drop them, or pass --executor ray.")
    store = RunStore(run_dir)
    previous = store.read_run() if store.exists else None
    if args.resume and previous is None:
        raise UsageError(f"--resume: {str(run_dir)!r} holds no run to resume (no run.json). "
                         "Pass the --run-dir of an interrupted `precision-tuner tune`.")
    if previous is None and run_dir.exists() and any(run_dir.iterdir()):
        raise UsageError(f"run directory {str(run_dir)!r} is not empty and holds no "
                         "precision-tuner run. Choose a new --run-dir.")
    plan = resolve(_flags(args, task_path), previous)
    _check_out(args.out, args.force)
    _check_writable_dir(run_dir)
    _check_writable_dir(args.out.resolve().parent)
    _check_reachable(args)

    budget = "every config" if plan.exhaustive else f"{plan.trials} trials"
    console.print(f"precision-tuner: tuning [bold]{task_path.name}[/] with space "
                  f"[bold]{plan.space.name}[/] ({budget}, {plan.describe_steps()})")
    staged = StagedStores() if previous is None and not args.tracking_uri else None
    try:
        with _executor(args, console) as executor:
            clock = TimeBreakdown()
            plan, task_info, diagnostics = _fit_to_model(executor, plan, console, clock,
                                                         started)
            if staged is not None:  # the task is checked: the run directory may be written
                staged.move_into(run_dir)
            summary = _run_job(args, plan, executor, console, store, previous, clock, started,
                               task_info, diagnostics)
    finally:
        if staged is not None:
            staged.discard()
    print_summary(summary, console)
    summary.best_config.save(args.out, overwrite=True)
    console.print(f"best config written to [bold]{args.out}[/] (also in {run_dir}/)")
    from tuner import job_context

    if job_context.job_id() is not None:  # a service job: the user is on another machine
        console.print(f"fetch it: precision-tuner fetch {job_context.job_id()}; browse the "
                      "trials: precision-tuner ui --service ADDRESS", markup=False)
        return 0
    console.print(f"browse the trials: precision-tuner ui --run-dir {run_dir}"
                  + ("" if not args.tracking_uri else
                     f"  (tracking: {_redact(args.tracking_uri)})"))
    return 0


def _run_job(args, plan, executor, console, store, previous, clock, started, task_info,
             diagnostics):
    """Run the checked and fitted plan on ``executor``, with the progress display."""
    from tuner.execution.local import LocalProcessExecutor
    from tuner.run.job import tune
    from tuner.cli.progress import LiveProgress

    if plan.exhaustive:
        console.print(f"exhaustive: {plan.trials} distinct configs in space {plan.space.name}")
    done = len(store.read_trials())
    if previous is not None:
        console.print(f"resuming {plan.run_dir}: {done} of {plan.trials} trials already finished")
    with LiveProgress(console, plan.trials, done) as progress:
        summary = tune(plan, executor, progress, task_info, started=started,
                       diagnostics=diagnostics, clock=clock)
    if isinstance(executor, LocalProcessExecutor):
        _copy_log(executor.log_path, plan.run_dir / "worker.log")
    return summary


def _fit_to_model(executor, plan, console, clock, started: float):
    """Check the task in the worker, fit the space to the model's layers, run diagnostics.
    Times the start-up (until the worker began the check), the check and the diagnostics."""
    from tuner.records.diagnostics_report import conclusions
    from tuner.records.timing import describe_ceiling

    console.print("starting the TensorFlow worker and checking the task...")
    # One call: the task is loaded and the model built once for the check and the diagnostics.
    task_info = executor.probe(str(plan.task_path), plan.batch_pool or plan.steps,
                               plan.space.float32_layers,
                               ceiling=True, diagnose_steps=3)
    diagnostics = task_info.pop("diagnostics")
    parts = {"task check": task_info.get("probe_s", 0.0),
             "ceiling probe": task_info.get("ceiling_s", 0.0),
             "diagnostics": task_info.get("diagnostics_s", 0.0)}
    clock.add("start-up", time.perf_counter() - started - sum(parts.values()))
    for phase, seconds in parts.items():
        clock.add(phase, seconds)
    console.print(f"task ok: {task_info['style']} model {task_info['model']!r}, batch size "
                  f"{task_info['batch_size']}, TensorFlow {task_info['tensorflow']}")
    if "ceiling" in task_info:
        console.print(f"ceiling: {describe_ceiling(task_info['ceiling'])}", markup=False)
    plan, skipped = plan.within_ceiling(task_info.get("ceiling"))
    for note in skipped:
        console.print(f"space: {note}", markup=False)
    plan, notes = plan.fitted_to(task_info["float32_matches"])
    for note in notes:
        console.print(f"space: {note}", markup=False)
    for line in conclusions(diagnostics):
        console.print(f"diagnostics: {line}", markup=False)
    return plan.with_diagnostics(diagnostics), task_info, diagnostics


def _flags(args, task_path: Path):
    from tuner.run.plan import Flags

    return Flags(task_path=task_path, run_dir=args.run_dir, space=args.space, trials=args.trials,
                 steps=args.steps, seed=args.seed, tolerance=args.tolerance,
                 exhaustive=args.exhaustive, tracking_uri=args.tracking_uri,
                 finalists=args.finalists, trial_time_limit_s=float(args.time_limit),
                 min_gain=args.min_gain, keep_slow_policies=args.keep_slow_policies,
                 objective=args.objective, memory_slack=args.memory_slack,
                 trial_seconds=args.trial_seconds, confirm_steps=args.confirm_steps,
                 confirm_seconds=args.confirm_seconds, no_confirm=args.no_confirm)


def _check_out(out: Path, force: bool) -> None:
    if out.suffix.lower() not in (".json", ".yaml", ".yml"):
        raise UsageError(f"--out must end in .json, .yaml or .yml. Received: --out {out}")
    if out.exists() and not force:
        raise UsageError(f"--out {str(out)!r} already exists. Pass --force to overwrite it, "
                         "or choose another --out.")


# Long enough for a loaded cluster to accept a connection; short enough that a wrong address is
# refused at once (Ray and MLflow's HTTP client would otherwise retry for minutes).
_CONNECT_TIMEOUT_S = 5.0


def _host_port(address: str, default_port: int | None) -> tuple[str, int] | None:
    """``HOST:PORT`` (or ``scheme://HOST:PORT/...``) as a pair; None when there is none."""
    import urllib.parse

    parts = urllib.parse.urlsplit(address if "://" in address else f"//{address}")
    try:
        port = parts.port or default_port
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname and port else None


def _check_reachable(args) -> None:
    """Refuse a --ray-address or an HTTP --tracking-uri that accepts no connection, in seconds,
    before anything is started or written."""
    import socket

    targets = []
    if args.ray_address and args.ray_address != "auto":
        targets.append(("--ray-address", args.ray_address,
                        _host_port(args.ray_address, None),
                        "Start the cluster (`ray start --head`) or fix the address"))
    uri = args.tracking_uri or ""
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
    from tuner.records.mlflow_records import redact_uri

    return redact_uri(uri)


def _executor(args, console):
    from tuner.execution.local import LocalProcessExecutor

    if args.executor == "local":
        return LocalProcessExecutor()
    from tuner.execution.ray_pool import RayExecutor

    where = f"Ray cluster at {_redact(args.ray_address)}" if args.ray_address \
        else "a local Ray instance"
    console.print(f"starting {args.workers} worker(s) on {where}...")
    from tuner import job_context

    if job_context.job_id() is not None and args.ray_address:
        # A service job on the team's cluster: screen on a share of it, and wait for a
        # whole node (behind other jobs' re-measurements) rather than time on a busy one.
        return RayExecutor(workers=args.workers, address=args.ray_address,
                           worker_cpus=job_context.worker_cpus(), node_wait_s=3600.0)
    return RayExecutor(workers=args.workers, address=args.ray_address)


def _copy_log(source: str, target: Path) -> None:
    try:
        target.write_bytes(Path(source).read_bytes())
        os.unlink(source)
    except OSError:
        pass
