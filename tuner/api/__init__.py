"""Tuning from Python: ``tuner.tune(...)`` for notebooks and scripts, and its ``TuneResult``.

The same job as ``precision-tuner tune``, through the same code. ``tuner.tune``'s typed
signature is the one definition of every tune option (``tuning``; read by ``options``, which builds
the CLI's parser from it and holds a Python caller's values to the same checks and one-line
errors); the job from the task check to the summary (``job``) and its live progress
(``progress``); a model, data and loss defined in Python written, with cloudpickle, to a task
file the workers load like any other (``task_writer``); the run read back (``result``). Below
the CLI, above everything else; the job's stack is imported only when a job runs.
"""

from tuner.lazy_names import lazy_names

_WHERE = {"tune": "tuner.api.tuning", "TuneResult": "tuner.api.result",
          "Speedup": "tuner.api.result", "load_result": "tuner.api.result"}
__all__ = list(_WHERE)
# Imported on first use: ``import tuner.api.options`` alone imports no job.
__getattr__, __dir__ = lazy_names(globals(), _WHERE)
