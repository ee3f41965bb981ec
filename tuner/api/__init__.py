"""Tuning from Python: ``tuner.tune(...)`` for notebooks and scripts, and its ``TuneResult``.

The same job as ``precision-tuner tune``, through the same code. ``tuner.tune`` (``tuning``)
takes every tune option as a typed keyword, builds the job's ``TuneOptions`` from them
(tuner.run.options declares each option once) and runs the job; the job from the task check to
the summary (``job``: ``run_job``, which the CLI runs too) and its live progress
(``progress``); a model, data and loss defined in Python written, with cloudpickle, to a task
file the workers load like any other (``task_writer``); the run read back (``result``). Below
the CLI, above everything else; the job's stack is imported only when a job runs.
"""

from tuner.lazy_names import lazy_names

_WHERE = {"tune": "tuner.api.tuning", "TuneResult": "tuner.api.result",
          "Speedup": "tuner.api.result", "load_result": "tuner.api.result"}
__all__ = list(_WHERE)
# Imported on first use: ``import tuner.api.result`` alone imports no job.
__getattr__, __dir__ = lazy_names(globals(), _WHERE)
