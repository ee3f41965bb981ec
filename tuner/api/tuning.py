"""``tuner.tune(...)``: the tune job from Python, returning a ``TuneResult``. Its keywords after
the task's objects are the fields of ``TuneOptions`` (tuner.run.options, where each option's
type, default, check and help are declared), typed and defaulted as there; ``tune()`` builds
the options from them, each by its name, and runs the job (tuner.api.job), the job that
``precision-tuner tune`` runs on the options of its command line.

Either a task file, as the CLI takes it, or the task's objects themselves (``build_model``,
``train_data``, ``loss``, ...). Errors are the CLI's exceptions with its one-line messages
(``UsageError``, ``TaskError``, ...). Past 60 lines: the signature lists every option.
"""

import os
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Literal

from tuner.api.result import TuneResult
from tuner.api.task_writer import LOSS_NOT_GIVEN, task_objects, write_task
from tuner.errors import UsageError
from tuner.judging.decision import DEFAULT_MIN_GAIN
from tuner.judging.objective import Objective
from tuner.records.run_store import BEST_FILE
from tuner.run.option_checks import option_fields
from tuner.run.options import DEFAULT_FINALISTS, DEFAULT_TIME_LIMIT, TuneOptions, default_run_dir


def tune(
    task: str | Path | None = None, *,
    build_model: Callable[[], Any] | None = None, train_data: Any = None,
    loss: Any = LOSS_NOT_GIVEN, optimizer: Callable[[], Any] | None = None,
    train_step: Callable[[Any, Any, Any], Any] | None = None, val_data: Any = None,
    metrics: Any = None, batch_size: int | None = None,
    class_weight: dict[int, float] | None = None,
    # -- what to try
    space: str | Path | None = None, trials: int | None = None, exhaustive: bool = False,
    steps: int | None = None, trial_seconds: float | None = None, seed: int | None = None,
    tolerance: float | None = None, keep_slow_policies: bool = False,
    strict_float32: bool = False,
    # -- how the pick is made and checked
    finalists: int = DEFAULT_FINALISTS, min_gain: float = DEFAULT_MIN_GAIN,
    run_drift: float | None = None, objective: Objective | None = None,
    memory_slack: float | None = None, confirm_steps: int | None = None,
    confirm_seconds: float | None = None, no_confirm: bool = False,
    # -- where things go
    run_dir: Path | None = None, out: Path | None = None, force: bool = False,
    resume: bool = False, tracking_uri: str | None = None,
    # -- where trials run
    time_limit: int = DEFAULT_TIME_LIMIT, workers: int | Literal["auto"] = "auto",
    ray_address: str | None = None, executor: Literal["auto", "ray", "local"] = "auto",
    worker_memory: float | None = None,
) -> TuneResult:
    """Tune ``task`` (a task file's path), or the model ``build_model`` builds, trained on
    ``train_data`` (what ``model.fit(x=...)`` takes: arrays ``(x, y)``, x alone or a dict of
    them, a ``tf.data.Dataset``, a ``keras.utils.PyDataset`` or a generator of batches, or a
    function returning one; a dataset object or a generator is read once here, its first 256
    batches at most) with ``loss`` (``None``: the model's ``train_step`` computes its own, as in
    ``compile(loss=None)``); ``optimizer`` is a function returning a new optimizer [default:
    Adam(1e-3)] (for ``train_step``, or a dict of them by name); ``train_step(model, optimizer,
    batch)``, a custom loop's step returning its loss, trained in every trial where ``fit``
    runs Keras's (``loss`` then optional); ``val_data`` as ``train_data``, ``class_weight`` as
    ``fit`` takes it. The exported config goes to the run directory unless ``out`` says where.
    Interrupting (Ctrl-C, a notebook's stop) ends the job as the CLI's Ctrl-C does: records
    closed, resumable with the same ``run_dir``.

    Every other keyword is a ``precision-tuner tune`` option under its Python name:
    """
    objects = {"build_model": build_model, "train_data": train_data, "loss": loss,
               "optimizer": optimizer, "train_step": train_step, "val_data": val_data,
               "metrics": metrics, "batch_size": batch_size, "class_weight": class_weight}
    given = [name for name, value in objects.items()
             if value is not (LOSS_NOT_GIVEN if name == "loss" else None)]
    if task is not None and given:
        raise UsageError(f"tune(): pass a task file or the task's objects, not both. Received: "
                         f"a task file and {', '.join(given)}")
    name = Path(task).stem if task is not None else "python_task"
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(name)
    if out is None:  # the run directory's own copy; always rewritten
        out, force = run_dir / BEST_FILE, True
    return _run(TuneOptions(
        task=(Path(task) if task is not None
              else run_dir.parent / f"{run_dir.name}.task" / f"{name}.py"),
        # A path given as a Path is the option's text (its check refuses what is neither).
        space=os.fspath(space) if isinstance(space, os.PathLike) else space, trials=trials,
        exhaustive=exhaustive, steps=steps, trial_seconds=trial_seconds, seed=seed,
        tolerance=tolerance,
        keep_slow_policies=keep_slow_policies, strict_float32=strict_float32,
        finalists=finalists, min_gain=min_gain,
        run_drift=run_drift, objective=objective, memory_slack=memory_slack,
        confirm_steps=confirm_steps, confirm_seconds=confirm_seconds, no_confirm=no_confirm,
        run_dir=run_dir, out=out, force=force, resume=resume, tracking_uri=tracking_uri,
        time_limit=time_limit, workers=workers, ray_address=ray_address, executor=executor,
        worker_memory=worker_memory),
        objects=objects if task is None else None)


def _run(options: TuneOptions, objects: dict[str, Any] | None) -> TuneResult:
    """The job on ``options``, checked as they were built; first, where the task is Python
    objects, the task file the workers load them from (``options.task``)."""
    if objects is not None:
        write_task(options.task, task_objects(**objects))
    from tuner.api.job import run_job  # the job's stack: not for `import tuner`

    try:
        return run_job(options)
    except KeyboardInterrupt:
        print(f"precision-tuner: interrupted; finished trials are kept. Resume: call tune() "
              f"again with the same arguments and run_dir={str(options.run_dir)!r}",
              file=sys.stderr)
        raise


def _options_help() -> str:
    """The options as ``help(tuner.tune)`` lists them: name, default, help."""
    lines = []
    for option in option_fields(TuneOptions):
        default = option.option.python_default or str(option.default)
        text = option.option.help.replace("%%", "%").replace("%(default)s", default)
        lines += textwrap.wrap(f"{option.name} ({option.flag}): {text}", width=92,
                               initial_indent="    ", subsequent_indent="        ")
    return "\n".join(lines)


if tune.__doc__ is not None:   # None under ``python -OO``, which drops docstrings
    tune.__doc__ += "\n" + _options_help() + "\n"
