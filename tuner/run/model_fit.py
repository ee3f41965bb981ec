"""The plan fitted to the task's model and this device, from what the worker's task check
found (``tuner.task_facts.TaskFacts``): the policies the device's ceiling rules out left out,
the space fitted to the model's layers and optimizers, the diagnostics kept; with the lines
the console shows for each. The job (tuner.api.job) runs the check and prints the lines; the
rules are the plan's (tuner.run.plan).
"""

from __future__ import annotations

from typing import Any

from tuner.records.diagnostics_report import console_lines
from tuner.records.timing import describe_ceiling
from tuner.run.plan import RunPlan
from tuner.task_facts import TaskFacts


def tf32_line(tf32: dict[str, Any], strict: bool) -> str:
    """What "float32" is on this device, said where it is not IEEE float32 throughout (a GPU
    with TF32 units): the baseline's speed and the guard's float32 passes are then TF32's."""
    if not tf32.get("supported"):
        return ""
    if strict:
        return ("float32: IEEE float32 in every trial (--strict-float32: TF32 off, although "
                "this GPU has TF32 units)")
    return ("float32: its matrix products and convolutions run in TF32 on this GPU "
            "(TensorFlow's default: float32's range, 10 bits of mantissa), the baseline's "
            "speed included; --strict-float32 holds them to IEEE float32")


def fit_to_model(plan: RunPlan, facts: TaskFacts
                 ) -> tuple[RunPlan, dict[str, Any], list[str]]:
    """``plan`` fitted to ``facts``; the diagnostics (taken out of ``facts``: the plan keeps
    them) and the console's lines, in order."""
    diagnostics, facts.diagnostics = facts.diagnostics or {}, None
    lines = [f"task ok: {facts.style} model {facts.model!r}, batch size {facts.batch_size}, "
             f"TensorFlow {facts.tensorflow}"]
    if facts.ceiling is not None:
        lines.append(f"ceiling: {describe_ceiling(facts.ceiling)}")
    tf32 = tf32_line(facts.tf32 or {}, plan.strict_float32)
    if tf32:
        lines.append(tf32)
    plan, skipped = plan.within_ceiling(facts.ceiling)
    plan, fitted = plan.fitted_to(facts.float32_matches, facts.optimizer)
    lines += [f"space: {note}" for note in skipped + fitted]
    lines += [f"diagnostics: {line}" for line in console_lines(diagnostics)]
    lines.append(f"diagnostics: every finding in {plan.run_dir / 'diagnostics.json'} and the "
                 "MLflow parent run's diagnostics.md")
    return plan.with_diagnostics(diagnostics), diagnostics, lines
