"""Tuning from Python: ``tuner.tune(...)`` for notebooks and scripts, and its ``TuneResult``.

The same job as ``precision-tuner tune``, through the same code: keyword arguments are the CLI's
own options (parsed by the CLI's parser, so names, defaults, checks and one-line errors are
one definition), and a model, data and loss defined in Python are written, with cloudpickle, to
a task file the workers load like any other.
"""

from tuner.lazy_names import lazy_names

_WHERE = {"tune": "tuner.api.run", "TuneResult": "tuner.api.result",
          "Speedup": "tuner.api.result", "load_result": "tuner.api.result"}
__all__ = list(_WHERE)
# Imported on first use: the CLI imports tuner.api.options without the whole job.
__getattr__, __dir__ = lazy_names(globals(), _WHERE)
