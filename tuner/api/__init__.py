"""Tuning from Python: ``tuner.tune(...)`` for notebooks and scripts, and its ``TuneResult``.

The same job as ``precision-tuner tune``, through the same code: keyword arguments are the CLI's
own options (parsed by the CLI's parser, so names, defaults, checks and one-line errors are
one definition), and a model, data and loss defined in Python are written, with cloudpickle, to
a task file the workers load like any other.
"""

from tuner.api.result import Speedup, TuneResult, load_result
from tuner.api.run import tune

__all__ = ["tune", "TuneResult", "Speedup", "load_result"]
