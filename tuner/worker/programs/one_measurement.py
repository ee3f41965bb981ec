"""One measurement of ``precision-tuner bench``, as its own fresh process:
``python -m tuner.worker.programs.one_measurement TASK CONFIG|float32 STEPS WARMUP [SEED]``.

It trains the task's model as a trial does: the task loaded by the worker's loader
(``tuner.worker.task.task_loader``), the model built under the config's scope and compiled by
``compile_for_trial``, ``model.fit`` on the run's fixed batches with the trial's step timer
(``tuner.worker.trial.steps``), in a process started as a trial's worker is
(``tuner.worker.process.startup``), with TensorFlow's own thread settings, as the user's
training has them. ``WARMUP`` steps (the first traces the training step) are trained and not
timed; ``STEPS`` more are. It writes one line on stdout, ``PT-BENCH {...}``: the timed step
times (ms), their median, the last step's loss, the model's dtype policy, the outcome and the
device. A bad task or config ends it with one line on stderr and exit 2.
"""

from __future__ import annotations

import sys

from tuner.apply.config import PrecisionConfig
from tuner.errors import TunerError
from tuner.process_lines import BENCH, line
from tuner.trial_types import TrialOutcome, TrialResult, TrialSpec
from tuner.worker.process.startup import prepare_process
from tuner.worker.task.keras_state import reset_keras_state
from tuner.worker.task.task_loader import fixed_batches, load_task
from tuner.worker.task.task_model import compile_for_trial
from tuner.worker.trial.error_reading import classify_on
from tuner.worker.trial.steps import fit_steps, step_recorder


class Failed(Exception):
    """The model failed to train under the config; the message is one line."""


def measure(task_path: str, which: str, steps: int, warmup: int, seed: int = 0) -> dict:
    """Train ``warmup + steps`` steps of the task under ``which`` (a config file, or
    ``"float32"``); what the timed steps measured."""
    reset_keras_state(seed)
    task = load_task(task_path)
    total = warmup + steps
    batches = fixed_batches(task, total)
    config = PrecisionConfig() if which == "float32" else PrecisionConfig.load(which)
    spec = TrialSpec(number=0, task_path=task_path, config=config.to_dict(), steps=total,
                     warmup_steps=warmup, seed=seed)
    result = TrialResult(number=0, outcome=TrialOutcome.COMPLETED, warmup_steps=warmup)
    model = None
    try:
        with config.scope():
            model = task.build_model()
            optimizers = compile_for_trial(model, task, config)
            fit_steps(model, batches, total, [step_recorder(optimizers, spec, result)])
    except TunerError:
        raise
    except Exception as exc:  # noqa: BLE001 - read as a trial's failure is, layer and fix named
        raise Failed(classify_on(model, exc, stage="train")[1]) from None
    # The policy the model was built under (the config's scope applied, or not).
    return {"which": which, "policy": model.dtype_policy.name,
            "timed_steps_ms": result.timed_steps_ms, "median_ms": result.median_step_ms,
            "final_loss": result.losses[-1] if result.losses else None,
            "steps_trained": len(result.losses), "outcome": result.outcome.value,
            "first_non_finite_step": result.first_non_finite_step, "device": _device()}


def _device() -> str:
    """The accelerator the measurement ran on: the first GPU's name, else ``CPU``."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "CPU"
    details = tf.config.experimental.get_device_details(gpus[0])
    return details.get("device_name") or gpus[0].name


def main(argv: list[str]) -> int:
    task_path, which, steps, warmup = argv[0], argv[1], int(argv[2]), int(argv[3])
    seed = int(argv[4]) if len(argv) > 4 else 0
    prepare_process()   # as a trial's worker starts: the frameworks, then the devices
    try:
        figures = measure(task_path, which, steps, warmup, seed)
    except TunerError as exc:
        print(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, file=sys.stderr)
        return 2
    except Failed as exc:   # the model fails under this config: the trials' one-line reading
        print(str(exc), file=sys.stderr)
        return 1
    print(line(BENCH, figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
