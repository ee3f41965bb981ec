"""``precision-tuner``: the parser (``build_parser``; ``tune``'s from ``TuneOptions``, in
tuner.cli.tune_parser) and the dispatch (``_run``: each command's function, named). Exit 0 on
success, 2 on bad input."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tuner.cli import gpu_check, jobs, submit
from tuner.cli.submit import FORWARDED
from tuner.cli.tune_parser import add_tune_parser, options_from
from tuner.dependency_versions import refuse_if_unsupported
from tuner.errors import TunerError, UsageError
from tuner.run.option_checks import count, positive_int

# Each command imports what it runs when it runs (tune: the whole job; service: Ray), so that
# `precision-tuner submit` and the job commands start in a fraction of a second.

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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every other bad input
        self.exit(2, f"{self.prog}: error: {message}. See `{self.prog} --help`.\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="precision-tuner", description=_DESCRIPTION, epilog=_EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    tune = add_tune_parser(commands)
    _add_other_commands(commands)
    _add_service_commands(commands, tune)
    return parser


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
    ui.add_argument("--port", type=positive_int, default=5000)

    diagnose = commands.add_parser(
        "diagnose", help="per-layer float16/bfloat16 range diagnostics of a task",
        description="Run a few instrumented float32 steps and show, per layer, how close "
                    "activations and gradients come to float16's limits.")
    diagnose.add_argument("task", metavar="TASK.py")
    diagnose.add_argument("--steps", type=positive_int, default=3,
                          help="instrumented steps [default: %(default)s]")
    diagnose.add_argument("--json", type=Path, metavar="FILE",
                          help="also write the full diagnostics as JSON")
    diagnose.add_argument("--all", action="store_true", help="show every layer and every "
                          "finding, not the 25 riskiest layers and one line per layer")

    commands.add_parser("spaces", help="list the built-in search spaces")

    train = _task_and_config(commands.add_parser(
        "train", help="train a task to the end under a config, with the precision guard",
        description="Train the task's model to the end under CONFIG with the precision guard "
                    "(restores and repairs a failing 16-bit training); with --against float32 "
                    "also in float32, side by side. Writes train.json in --run-dir."))
    train.add_argument("--epochs", type=positive_int, default=30,
                       help="epochs [default: %(default)s]")
    train.add_argument("--against", choices=("float32",),
                       help="also train in float32, compare the losses and judge: exit 1 when "
                            "the config ends worse than float32 beyond the allowance")
    train.add_argument("--no-guard", action="store_true",
                       help="train the config without the precision guard (to see what it "
                            "saves)")
    train.add_argument("--run-dir", type=Path, default=Path("runs/train"),
                       help="where train.json and guarded_config.json go [default: %(default)s]")
    train.add_argument("--tracking-uri", metavar="URI",
                       help="an MLflow tracking server [default: RUN_DIR/mlflow.db]")
    _add_bench_parser(commands)
    gpu_check.add_parser(commands)


def _task_and_config(command: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A command on a task file under an exported config (train, bench)."""
    command.add_argument("task", metavar="TASK.py")
    command.add_argument("--config", type=Path, required=True, metavar="FILE",
                         help="an exported config (best_precision.json)")
    return command


def _add_bench_parser(commands) -> None:
    bench = _task_and_config(commands.add_parser(
        "bench", help="time a config against float32 in fresh processes: a speedup with "
                      "its interval",
        description="Time the task's training in float32 and under the --config FILE, each "
                    "measurement in a fresh process, in ABBA rounds, and print the speedup "
                    "(float32's step time over the config's) with its 95% interval: faster, "
                    "slower, or a tie when the interval holds 1.0. Run it on the machine the "
                    "model will train on to check a tuned speedup there."))
    bench.add_argument("--rounds", type=positive_int, default=4,
                       help="rounds of one float32 and one config process each, at least 2 "
                            "[default: %(default)s]")
    bench.add_argument("--steps", type=positive_int, default=30,
                       help="timed training steps per process [default: %(default)s]")
    bench.add_argument("--warmup", type=positive_int, default=5,
                       help="untimed steps first (the first traces the step) "
                            "[default: %(default)s]")
    bench.add_argument("--json", type=Path, metavar="FILE",
                       help="also write the figures, per round, as JSON")


_SERVICE_EPILOG = """\
The service is a Ray cluster (its job server takes the jobs) plus an MLflow tracking
server (every job's trials). Jobs beyond --max-running wait queued, in the order they came,
holding no process; queued and running jobs are queued again by the next `service start`
after `service stop` or a crash. Loopback by default; bound elsewhere (--host), both ends
require the token written to DIR/auth_token (with Ray 2.52 or newer).
"""


def _add_service_commands(commands, tune: argparse.ArgumentParser) -> None:
    """service start|stop|status, and the job commands (submit, jobs, status, logs, stop,
    fetch), which all take --service ADDRESS (or PRECISION_TUNER_SERVICE)."""
    _add_service_parser(commands)
    _add_job_parsers(commands, tune)


def _add_service_parser(commands) -> None:
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
    start.add_argument("--ray-port", type=positive_int, default=6379,
                       help="Ray's GCS port (worker nodes join here) [default: %(default)s]")
    start.add_argument("--dashboard-port", "--jobs-port", type=positive_int, default=8265,
                       dest="dashboard_port",
                       help="Ray's dashboard and job server [default: %(default)s]")
    start.add_argument("--mlflow-port", type=positive_int, default=5000,
                       help="MLflow tracking server and UI [default: %(default)s]")
    start.add_argument("--num-cpus", type=positive_int,
                       help="CPUs the head offers to trials [default: all]")
    start.add_argument("--warm-workers", type=count, default=None, metavar="N",
                       help="warm TensorFlow workers kept per node for jobs to borrow, "
                            "and two spare drivers for jobs to run in [default: one worker "
                            "per CPU; 0: neither, each job starts its own]")
    start.add_argument("--auth", action="store_true",
                       help="require the token on loopback too")
    start.add_argument("--max-running", type=positive_int, metavar="N",
                       help="jobs run at once; the rest wait queued, in submission order "
                            "[default: one per warm worker of the head (per CPU without a "
                            "pool); 1 on a node with GPUs]")
    start.add_argument("--max-job-mib", type=positive_int, metavar="MIB",
                       help="largest job (task, data and space file) a submit may send "
                            "[default: 512]")
    start.add_argument("--max-queued-per-user", type=positive_int, metavar="N",
                       help="jobs one submitter may have waiting at once [default: 32]")
    for action in ("stop", "status"):
        parser = actions.add_parser(action, help=f"{action} the service in --dir")
        parser.add_argument("--dir", type=Path, default=Path("service"),
                            help="the service's directory [default: %(default)s]")


def _job_command(commands, name: str, help_text: str, job: bool = True) -> argparse.ArgumentParser:
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


def _add_job_parsers(commands, tune: argparse.ArgumentParser) -> None:
    def job_command(name: str, help_text: str, job: bool = True) -> argparse.ArgumentParser:
        return _job_command(commands, name, help_text, job)

    submit = job_command("submit", "submit a task to a tuning service as a Ray job",
                         job=False)
    submit.add_argument("task", metavar="TASK.py", help="task file (shipped with the job)")

    for action in tune._actions:  # the same tune flags, same checks, same help
        if action.dest in FORWARDED:
            submit._add_action(action)
    submit.add_argument("--resume", dest="resume_job", metavar="JOB",
                        help="continue a stopped or killed job from its recorded trials, with "
                             "its own flags")
    submit.add_argument("--worker-cpus", type=positive_int, default=1,
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


def _version() -> str:
    from tuner import __version__

    return __version__


# The commands that train or serve with Keras, TensorFlow, Optuna, Ray or MLflow: each refuses,
# in one line, a package outside the range precision-tuner declares (tuner.dependency_versions).
_TRAINING_COMMANDS = {"tune", "train", "bench", "diagnose", "ui", "service"}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command in _TRAINING_COMMANDS:  # they import Keras and TensorFlow: in range?
            refuse_if_unsupported()
        return _run(args)
    except UsageError as exc:
        print(f"precision-tuner: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except TunerError as exc:
        print(f"precision-tuner: failed: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("precision-tuner: interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    """The function of the command ``args.command`` names. Each stack is imported by the
    command that needs it: tune's job, the service's server side, the small commands'
    executors; submit and the job commands import none of them."""
    if args.command == "tune":
        return _tune(args)
    if args.command == "service":
        from tuner.cli import service_commands

        return service_commands.run(args)
    job_commands = {"submit": submit.submit, "jobs": jobs.list_jobs, "status": jobs.status,
                    "logs": jobs.logs, "stop": jobs.stop, "fetch": jobs.fetch}
    if args.command in job_commands:
        return job_commands[args.command](args)
    from tuner.cli import commands

    small_commands = {"export": commands.export, "ui": commands.ui, "spaces": commands.spaces,
                      "diagnose": commands.diagnose, "train": commands.train,
                      "bench": commands.bench, "gpu-check": gpu_check.run}
    return small_commands[args.command](args)


def _tune(args: argparse.Namespace) -> int:
    """``precision-tuner tune``: the job ``tuner.tune()`` runs, on the options of the command
    line; interrupted, it says how to resume."""
    options = options_from(args)
    from tuner.api.job import run_job  # the job's stack: not for the other commands

    try:
        run_job(options)
    except KeyboardInterrupt:
        print(f"precision-tuner: interrupted; resume with: precision-tuner tune {args.task} "
              f"--run-dir {options.run_dir}", file=sys.stderr)
        return 130
    return 0
