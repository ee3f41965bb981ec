"""What a confirmation found (tuner.run.confirmation_run runs it): its checkpoints, its verdict
on the pick's validation and speed, and the lines and table the summary prints. Plain data; no
TensorFlow."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from tuner.judging.noise import SpeedupEstimate
from tuner.judging.verdict import LEVEL_ALLOWANCE


@dataclass
class Checkpoint:
    step: int                        # steps each model has trained in all
    float32: dict[str, Any]          # tuner.worker.trial.validation results
    pick: dict[str, Any]
    # The training losses of the steps since the last checkpoint: what is compared when the
    # model cannot be evaluated (``model.evaluate`` fails, or its test_step reports no loss).
    float32_losses: list[float] = field(default_factory=list)
    pick_losses: list[float] = field(default_factory=list)
    # The stretch's timed steps (ms), warm-up excluded: the speed check's paired round.
    float32_steps_ms: list[float] = field(default_factory=list)
    pick_steps_ms: list[float] = field(default_factory=list)
    # Each loss of a model that returns several (a GAN's), over the same stretch.
    float32_terms: dict[str, list[float]] = field(default_factory=dict)
    pick_terms: dict[str, list[float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        def brief(validation: dict[str, Any]) -> dict[str, Any]:
            return {key: validation.get(key) for key in ("loss", "metrics", "error",
                                                          "val_metric")
                    if validation.get(key) is not None}

        return {"step": self.step, "float32": brief(self.float32), "pick": brief(self.pick)}


@dataclass
class Confirmation:
    trial: int                       # the confirmed config's trial number
    config: str                      # its description
    passed: bool
    reason: str                      # why it was rejected ("" when it passed)
    steps: int = 0                   # steps trained past the search, per model
    why_steps: str = ""
    checkpoints: list[Checkpoint] = field(default_factory=list)
    noise: float | None = None       # float32's validation noise at the end (+-, 2 s.e.)
    allowance: float = LEVEL_ALLOWANCE
    seconds: float = 0.0
    fallback: str = ""               # what was compared instead of validation, and why
    speed: SpeedupEstimate | None = None  # vs float32, over the stretches (None: too short)
    quality: bool = True             # False: a speed check alone (--no-confirm)

    def to_dict(self) -> dict[str, Any]:
        last = self.checkpoints[-1] if self.checkpoints else None
        return {"trial": self.trial, "config": self.config,
                "verdict": "passed" if self.passed else "rejected", "reason": self.reason,
                "steps": self.steps, "why_steps": self.why_steps,
                "final_step": last.step if last else None,
                "float32_val_loss": last.float32.get("loss") if last else None,
                "pick_val_loss": last.pick.get("loss") if last else None,
                "noise": self.noise, "allowance": self.allowance,
                "checkpoints": [c.to_dict() for c in self.checkpoints],
                "compared_on": (self.fallback or "validation") if self.quality else
                "speed only (--no-confirm)",
                "speed": self.speed.to_dict() if self.speed else None,
                "seconds": round(self.seconds, 3)}

    def table(self) -> list[str]:
        """``step  float32 val  pick val`` lines for the summary (training losses of each
        stretch, marked, where the model cannot be evaluated)."""
        # Without a validation loss, the task's val_metric where it has one, else training.
        metric = bool(self.checkpoints) and "loss" not in self.checkpoints[-1].float32 and \
            "val_metric" in self.checkpoints[-1].float32
        what = "val_metric" if metric else "train loss" if self.fallback else "val loss"
        pick_heading = f"#{self.trial} {what}"
        lines = [f"  {'step':>6}  {'float32 ' + what:>18}  {pick_heading:>16}"]
        for point in self.checkpoints:
            base, mine = \
                (_figure(point.float32.get("val_metric")), _figure(point.pick.get("val_metric"))) \
                if metric else (_mean(point.float32_losses), _mean(point.pick_losses)) \
                if self.fallback else (_loss(point.float32), _loss(point.pick))
            lines.append(f"  {point.step:>6}  {base:>18}  {mine:>16}")
        return lines

    def speed_text(self) -> str:
        if self.speed is None:
            return "its speed could not be re-checked (stretches without timed steps)"
        allowance = self.speed.describe_allowance()
        return (f"{self.speed.describe()} vs float32 over {self.speed.rounds} fresh stretches "
                "timed back to back" + (f" ({allowance})" if allowance else ""))

    def line(self) -> str:
        last = self.checkpoints[-1] if self.checkpoints else None
        if not self.passed or last is None:
            what = "confirmation" if self.quality else "speed check"
            return f"rejected #{self.trial} ({self.config}) in the {what}: {self.reason}"
        if not self.quality:
            return (f"speed check of #{self.trial} ({self.config}), not validated "
                    f"(--no-confirm): {self.speed_text()}")
        if self.fallback and last.float32_terms:
            figures = ", ".join(f"{name} {_mean(last.pick_terms.get(name, []))} vs float32's "
                                f"{_mean(values)}" for name, values in last.float32_terms.items())
            figures = f"{figures} over the steps to {last.step} ({self.fallback})"
        elif self.fallback:
            figures = (f"training loss {_mean(last.pick_losses)} vs float32's "
                       f"{_mean(last.float32_losses)} over the steps to {last.step} "
                       f"({self.fallback})")
        else:
            figures = (f"validation loss {_loss(last.pick)} vs float32's {_loss(last.float32)} "
                       f"at step {last.step}")
        if last.float32.get("val_metric") is not None:
            figures += (f"; val_metric {_figure(last.pick.get('val_metric'))} vs float32's "
                        f"{_figure(last.float32['val_metric'])}")
        return (f"confirmed #{self.trial} ({self.config}) over {self.steps} more steps "
                f"({self.why_steps}): {figures} (noise +-{self.noise or 0:.2g}, allowance "
                f"{self.allowance:.0%}); speed {self.speed_text()}")


def _mean(losses: list[float]) -> str:
    return f"{statistics.fmean(losses):.4g}" if losses else "-"


def _loss(validation: dict[str, Any]) -> str:
    return _figure(validation.get("loss"))


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
