"""precision-tuner: find the fastest stable 16-bit precision setup for a Keras model.

Public API::

    from tuner import PrecisionConfig
    cfg = PrecisionConfig.load("best_precision.json")
    with cfg.scope():
        model = build_model()
        model.compile(optimizer=cfg.wrap_optimizer(keras.optimizers.Adam(1e-3)), loss=...,
                      **cfg.compile_kwargs())
        model.fit(...)

    import tuner
    result = tuner.tune("my_task.py", space="quick")       # or build_model=..., train_data=...
    result.best, result.speedup, result.trials              # a PrecisionConfig, its interval,
                                                            # one DataFrame row per trial
"""

from tuner.api import Speedup, TuneResult, load_result, tune
from tuner.apply.config import Epsilon, Float32Placement, LossScale, PrecisionConfig
from tuner.errors import (ConfigError, SearchSpaceError, TaskError, TunerError, UsageError)
from tuner.search.space import SearchSpace
from tuner.search.space_files import load_space

__version__ = "0.1.0"

__all__ = ["PrecisionConfig", "LossScale", "Epsilon", "Float32Placement", "SearchSpace",
           "load_space", "TunerError", "UsageError", "ConfigError", "SearchSpaceError",
           "TaskError", "tune", "TuneResult", "Speedup", "load_result", "__version__"]
