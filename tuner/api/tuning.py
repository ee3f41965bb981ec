"""``tuner.tune(...)``: the tune job, returning a ``TuneResult``. Its signature is the one
definition of every tune option (name, type, default, check, help: ``tuner.api.options``);
``precision-tuner tune`` is built from it and runs the same job (``tune_parsed``).

Either a task file, as the CLI takes it, or the task's objects themselves (``build_model``,
``train_data``, ``loss``, ...). Errors are the CLI's exceptions with its one-line messages
(``UsageError``, ``TaskError``, ...). Past 60 lines: the signature holds every option's help.
"""

import argparse
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

from tuner import interrupt
from tuner.run.option_checks import gain, positive_int, ratio, seconds, workers_count
from tuner.api.options import (GOES, JUDGE, RUNS, TRY, Option, checked, default_run_dir,
                               options_help)
from tuner.api.result import BEST_FILE, TuneResult
from tuner.api.task_writer import LOSS_NOT_GIVEN, task_objects, write_task
from tuner.errors import UsageError
from tuner.judging.decision import DEFAULT_MIN_GAIN
from tuner.judging.noise import RUN_DRIFT_SD
from tuner.judging.objective import DEFAULT_MEMORY_SLACK, Objective
from tuner.judging.sizing import DEFAULT_CAP_S
from tuner.run.confirmation_run import DEFAULT_SECONDS as CONFIRM_SECONDS
from tuner.run.options import DEFAULT_FINALISTS, DEFAULT_TIME_LIMIT


def tune(
    task: str | Path | None = None, *,
    build_model: Callable[[], Any] | None = None, train_data: Any = None,
    loss: Any = LOSS_NOT_GIVEN, optimizer: Callable[[], Any] | None = None,
    val_data: Any = None, metrics: Any = None, batch_size: int | None = None,
    # -- what to try
    space: Annotated[str | Path | None, Option(
        "search space: a built-in name (quick, default) or a YAML path [default: quick]",
        TRY)] = None,
    trials: Annotated[int | None, Option(
        "number of trials, baseline included [default: the space's `trials`]",
        TRY, positive_int)] = None,
    exhaustive: Annotated[bool, Option(
        "try every config of the space instead of a budget of trials (the grid; its size is "
        "printed first). Not with --trials", TRY)] = False,
    steps: Annotated[int | None, Option(
        "training steps per trial, fixed [default: sized by the float32 baseline: at least the "
        "space's trial.steps, more for a fast model until its step time and loss decrease are "
        "precise enough]", TRY, positive_int)] = None,
    trial_seconds: Annotated[float | None, Option(
        "how long the float32 baseline may train while it sizes the trials (a slow model gets "
        f"fewer steps than trial.steps) [default: {DEFAULT_CAP_S:g}]", TRY, seconds,
        "S")] = None,
    seed: Annotated[int | None, Option(
        "seed for weights, data order and Optuna [default: 0]", TRY)] = None,
    tolerance: Annotated[float | None, Option(
        "share of float32's loss decrease a trial must reach to count as stable [default: the "
        "space's, 0.9]", TRY, ratio)] = None,
    keep_slow_policies: Annotated[bool, Option(
        "also try policies whose 16-bit dtype runs a dense layer's training step at under half "
        "float32's speed on the trial device (float16 on most CPUs); by default they are "
        "skipped, with a line saying so. No trial is then stopped early for being slow: the "
        "kept policies are there to be judged on stability", TRY)] = False,
    # -- how the pick is made and checked
    finalists: Annotated[int, Option(
        "stable candidates re-measured back to back before naming the winner [default: "
        "%(default)s]", JUDGE, positive_int)] = DEFAULT_FINALISTS,
    min_gain: Annotated[float, Option(
        "a 16-bit config is picked only when the lower end of its speedup interval beats "
        "float32 by this much; otherwise float32 (a tie goes to the simpler config) [default: "
        "%(default)s, i.e. 3%%]", JUDGE, gain, "FRACTION")] = DEFAULT_MIN_GAIN,
    run_drift: Annotated[float | None, Option(
        "the run-to-run allowance: the standard deviation of a speedup's log between tunes, "
        "beyond what one tune's rounds show; every speedup over float32 (the bar above and the "
        "exported interval) is widened by it. 0: this run's rounds alone [default: "
        f"{RUN_DRIFT_SD:g}, measured on a 2-core CPU by benchmarks/run_to_run.py]", JUDGE, gain,
        "SD")] = None,
    objective: Annotated[Objective | None, Option(
        "what best means: speed (the fastest config whose gain is real), memory (the least "
        "training memory), or balanced (from the Pareto front of step time and memory, the "
        "fastest within --memory-slack of the smallest) [default: speed]", JUDGE)] = None,
    memory_slack: Annotated[float | None, Option(
        "balanced: how far above the front's smallest memory the pick may be [default: "
        f"{DEFAULT_MEMORY_SLACK:g}, i.e. {DEFAULT_MEMORY_SLACK:.0%}%]", JUDGE, gain,
        "FRACTION")] = None,
    confirm_steps: Annotated[int | None, Option(
        "how many more steps the pick and float32 train, side by side, before the pick is "
        "exported (validated at 4 points) [default: 10x a trial's steps, capped by "
        "--confirm-seconds]", JUDGE, positive_int, "N")] = None,
    confirm_seconds: Annotated[float | None, Option(
        "the most training time the default confirmation may take, both models together "
        f"[default: {CONFIRM_SECONDS:g}]", JUDGE, seconds, "S")] = None,
    no_confirm: Annotated[bool, Option(
        "export the pick without the confirmation run (the provenance says so)", JUDGE)] = False,
    # -- where things go
    run_dir: Annotated[Path | None, Option(
        "where the Optuna and MLflow stores go [default: runs/TASK-TIMESTAMP]", GOES,
        forwarded=False)] = None,
    out: Annotated[Path | None, Option(
        "where to write the best config (.json or .yaml) [default: %(default)s]", GOES,
        forwarded=False, cli_default=Path(BEST_FILE),
        python_default=f"RUN_DIR/{BEST_FILE}, always rewritten")] = None,
    force: Annotated[bool, Option(
        "overwrite --out without keeping the earlier export (by default it is kept beside it, "
        "named after the time it was written)", GOES, forwarded=False)] = False,
    resume: Annotated[bool, Option(
        "continue the interrupted run in --run-dir (also automatic when --run-dir holds an "
        "unfinished run)", GOES, forwarded=False)] = False,
    tracking_uri: Annotated[str | None, Option(
        "MLflow tracking server URI [default: SQLite in the run directory]", GOES,
        forwarded=False)] = None,
    # -- where trials run
    time_limit: Annotated[int, Option(
        "per-trial time limit; a trial past it is killed [default: %(default)s]", RUNS,
        positive_int, "SECONDS")] = DEFAULT_TIME_LIMIT,
    workers: Annotated[int | Literal["auto"], Option(
        "trials side by side, each worker a TensorFlow process with its share of the CPUs "
        "(more than one runs on Ray); auto: one per visible GPU, one without GPUs; the "
        "winner is always re-timed alone [default: %(default)s]", RUNS,
        workers_count)] = "auto",
    ray_address: Annotated[str | None, Option(
        "attach to an existing Ray cluster (auto, HOST:PORT or ray://...) instead of starting "
        "a local one", RUNS, metavar="ADDRESS", forwarded=False)] = None,
    executor: Annotated[Literal["auto", "ray", "local"], Option(
        "auto: the local worker process for one trial at a time on this machine, Ray for "
        "several workers, --ray-address or a service job; ray: Ray actors always; local: "
        "one plain subprocess, no Ray [default: %(default)s]", RUNS,
        forwarded=False)] = "auto",
) -> TuneResult:
    """Tune ``task`` (a task file's path), or the model ``build_model`` builds, trained on
    ``train_data`` (arrays ``(x, y)`` or x alone, or a function returning them or a dataset)
    with ``loss`` (``None``: the model's ``train_step`` computes its own, as in
    ``compile(loss=None)``); ``optimizer`` is a function returning a new optimizer [default:
    Adam(1e-3)], ``val_data`` as ``train_data``. The exported config goes to the run
    directory unless ``out`` says where. Interrupting (Ctrl-C, a notebook's stop) ends the job
    as the CLI's Ctrl-C does: records closed, resumable with the same ``run_dir``.

    Every other keyword is a ``precision-tuner tune`` option under its Python name:
    """
    objects = {"build_model": build_model, "train_data": train_data, "loss": loss,
               "optimizer": optimizer, "val_data": val_data, "metrics": metrics,
               "batch_size": batch_size}
    given = [name for name, value in objects.items()
             if value is not (LOSS_NOT_GIVEN if name == "loss" else None)]
    if task is not None and given:
        raise UsageError(f"tune(): pass a task file or the task's objects, not both. Received: "
                         f"a task file and {', '.join(given)}")
    values = checked(tune, locals())
    name = Path(task).stem if task is not None else "python_task"
    run_dir = values["run_dir"] = values["run_dir"] or default_run_dir(name)
    if values["out"] is None:  # the run directory's own copy; always rewritten
        values.update(out=run_dir / BEST_FILE, force=True)
    if task is None:
        task = write_task(run_dir.parent / f"{run_dir.name}.task" / f"{name}.py",
                          task_objects(**objects))
    try:
        return tune_parsed(argparse.Namespace(task=str(task), **values))
    except KeyboardInterrupt:
        print(f"precision-tuner: interrupted; finished trials are kept. Resume: call tune() "
              f"again with the same arguments and run_dir={str(run_dir)!r}", file=sys.stderr)
        raise


tune.__doc__ += "\n" + options_help(tune) + "\n"


def tune_parsed(args: argparse.Namespace) -> TuneResult:
    """The job for the options (``precision-tuner tune``'s parsed, or ``tune()``'s checked):
    check, fit, search, re-measure, confirm, export; the run read back."""
    from tuner.api.job import run_job  # the job's stack: not for the CLI's parser

    with interrupt.handling():
        run_job(args)
    return TuneResult(args.run_dir)
