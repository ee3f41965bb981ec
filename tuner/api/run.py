"""``tuner.tune(...)``: the tune job, returning a ``TuneResult``; ``precision-tuner tune`` is a
thin layer over the same entry (``tune_parsed``, the parsed options).

Either a task file, as the CLI takes it, or the task's objects themselves (``build_model``,
``train_data``, ``loss``, ...). Every other keyword is a ``precision-tuner tune`` option under
its Python name (``--min-gain`` is ``min_gain``), parsed by the CLI's own parser; errors are
the CLI's exceptions with its one-line messages (``UsageError``, ``TaskError``, ...).
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path
from typing import Any

from tuner.api.result import BEST_FILE, TuneResult
from tuner.api.task_writer import LOSS_NOT_GIVEN, task_objects, write_task
from tuner.api.tune_job import run_tune
from tuner.api.options import parse_tune_keywords
from tuner import interrupt
from tuner.errors import UsageError


def tune(task: str | Path | None = None, *, build_model=None, train_data=None,
         loss=LOSS_NOT_GIVEN, optimizer=None, val_data=None, metrics=None,
         batch_size: int | None = None, **options: Any) -> TuneResult:
    """Tune ``task`` (a task file's path), or the model ``build_model`` builds, trained on
    ``train_data`` (arrays ``(x, y)`` or x alone, or a function returning them or a dataset)
    with ``loss`` (``None``: the model's ``train_step`` computes its own, as in
    ``compile(loss=None)``);
    ``optimizer`` is a function returning a new optimizer [default: Adam(1e-3)], ``val_data``
    as ``train_data``. ``options``: the CLI's, e.g. ``space="quick"``, ``trials=6``,
    ``executor="local"``, ``run_dir=...``; the exported config goes to the run directory
    unless ``out`` says where. Interrupting (Ctrl-C, a notebook's stop) ends the job as the
    CLI's Ctrl-C does: records closed, resumable with the same ``run_dir``."""
    given = [name for name, value in (("build_model", build_model), ("train_data", train_data),
                                      ("loss", loss), ("optimizer", optimizer),
                                      ("val_data", val_data), ("metrics", metrics),
                                      ("batch_size", batch_size))
             if value is not (LOSS_NOT_GIVEN if name == "loss" else None)]
    if task is not None and given:
        raise UsageError(f"tune(): pass a task file or the task's objects, not both. Received: "
                         f"a task file and {', '.join(given)}")
    name = Path(task).stem if task is not None else "python_task"
    run_dir = Path(options.get("run_dir") or Path("runs") / (
        f"{name}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}"))
    options["run_dir"] = run_dir
    if options.get("out") is None:  # the run directory's own copy; always rewritten
        options.update(out=run_dir / BEST_FILE, force=True)
    if task is None:
        objects = task_objects(build_model, train_data, loss, optimizer, val_data, metrics,
                               batch_size)
        task = write_task(run_dir.parent / f"{run_dir.name}.task" / f"{name}.py", objects)
    try:
        return tune_parsed(parse_tune_keywords(str(task), options))
    except KeyboardInterrupt:
        print(f"precision-tuner: interrupted; finished trials are kept. Resume: call tune() "
              f"again with the same arguments and run_dir={str(run_dir)!r}", file=sys.stderr)
        raise


def tune_parsed(args) -> TuneResult:
    """The job for parsed options (``precision-tuner tune``'s, or ``tune()``'s keywords through
    the same parser): check, fit, search, re-measure, confirm, export; the run read back."""
    with interrupt.handling():
        run_tune(args)
    return TuneResult(args.run_dir)
