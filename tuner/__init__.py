"""precision-tuner: find the fastest stable 16-bit precision setup for a Keras model.

Public API::

    from tuner import PrecisionConfig
    cfg = PrecisionConfig.load("best_precision.json")
    with cfg.scope():
        model = build_model()
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=...)  # as tuned
        model.fit(..., callbacks=[cfg.guard()])

    import tuner
    result = tuner.tune("my_task.py", space="quick")       # or build_model=..., train_data=...
    result.best, result.speedup, result.trials              # a PrecisionConfig, its interval,
                                                            # one DataFrame row per trial

Its names are imported on first use (tuner.lazy_names): ``import tuner`` alone imports
nothing else.
"""

from __future__ import annotations

from tuner.lazy_names import lazy_names

__version__ = "0.1.0"

_WHERE = {
    "PrecisionConfig": "tuner.apply.config", "LossScale": "tuner.apply.config",
    "Epsilon": "tuner.apply.config", "Float32Placement": "tuner.apply.config",
    "SearchSpace": "tuner.search.space", "load_space": "tuner.search.space_files",
    "TunerError": "tuner.errors", "UsageError": "tuner.errors", "ConfigError": "tuner.errors",
    "SearchSpaceError": "tuner.errors", "TaskError": "tuner.errors",
    "tune": "tuner.api.tuning", "TuneResult": "tuner.api.result", "Speedup": "tuner.api.result",
    "load_result": "tuner.api.result", "Objective": "tuner.judging.objective",
    "PrecisionGuard": "tuner.apply.guard.callback", "GuardError": "tuner.errors",
    "LoopGuard": "tuner.apply.guard.loop",
    "GuardEvent": "tuner.apply.guard.events",
}
__all__ = [*_WHERE, "__version__"]
__getattr__, __dir__ = lazy_names(globals(), _WHERE)
