"""What the guard reads after each step, as plain numbers: the step's own loss (from Keras's
running-mean loss tracker where it has one), and whether that loss is far above its recent
level, judged against the run's own step-to-step noise (a robust z-score of the log loss), not
a fixed factor. No TensorFlow here beyond reading scalars the callback hands over.
"""

from __future__ import annotations

import math
from collections import deque
from statistics import median


class LossSeries:
    """Per-step losses from a running mean: a tracker's ``total``/``count`` differences, or the
    logged value itself where the ``train_step`` logs a per-step loss (no tracker that counts)."""

    def __init__(self) -> None:
        self._total = 0.0
        self._count = 0.0

    def reset(self) -> None:
        self._total, self._count = 0.0, 0.0

    def step_loss(self, total: float | None, count: float | None,
                  logged: float | None) -> float | None:
        if total is None or count is None or count <= self._count:
            if count is not None and count < self._count:  # the tracker was reset (new epoch)
                self._total, self._count = 0.0, 0.0
                return self.step_loss(total, count, logged)
            return logged
        loss = (total - self._total) / (count - self._count) if math.isfinite(total) else total
        self._total, self._count = total, count
        return loss


class SpikeWatch:
    """Is a loss far above its recent level? Compared in logs with the median of the last
    ``window`` steps, in units of their robust spread (1.4826 x the median absolute deviation),
    after ``min_steps`` steps; ``min_ratio`` keeps a nearly constant loss from tripping on a
    tiny move."""

    def __init__(self, sigmas: float = 12.0, window: int = 200, min_steps: int = 30,
                 min_ratio: float = 2.0) -> None:
        if sigmas <= 0 or window < min_steps or min_steps < 5 or min_ratio <= 1:
            raise ValueError(f"spike watch needs sigmas > 0, window >= min_steps >= 5 and "
                             f"min_ratio > 1. Received: sigmas={sigmas}, window={window}, "
                             f"min_steps={min_steps}, min_ratio={min_ratio}")
        self.sigmas, self.min_steps = sigmas, min_steps
        self.min_log_jump = math.log(min_ratio)
        self._logs: deque[float] = deque(maxlen=window)

    def threshold(self) -> float | None:
        """The loss above which a step is a spike now (None while too few steps are known)."""
        if len(self._logs) < self.min_steps:
            return None
        values = list(self._logs)
        centre = median(values)
        spread = 1.4826 * median(abs(v - centre) for v in values)
        return math.exp(centre + max(self.sigmas * spread, self.min_log_jump))

    def is_spike(self, loss: float) -> bool:
        """Judge ``loss`` against the steps before it, then remember it (a spike is not kept,
        so one bad step does not raise the bar for the next)."""
        if not (loss > 0 and math.isfinite(loss)):
            return False  # non-finite losses are their own check; zero has no log
        bar = self.threshold()
        if bar is not None and loss > bar:
            return True
        self._logs.append(math.log(loss))
        return False


class Spacing:
    """When a check on the kept batch is due: every ``every`` steps and at each epoch's end,
    and never sooner than its last cost allows (it takes at most ``budget`` of the time between
    two checks: a tiny model's epochs last less than a check). The first check's cost does not
    count: it pays for Keras's eager call paths once. ``every=None``: never."""

    def __init__(self, every: int | None, budget: float) -> None:
        self.every, self.budget = every, budget
        self._runs = 0
        self._step = 0
        self._ended = 0.0
        self._seconds = 0.0   # what the last check took

    def due(self, step: int, at_epoch_end: bool, now: float) -> bool:
        if self.every is None or step == self._step:
            return False
        if now - self._ended < self._seconds / self.budget:
            return False
        return at_epoch_end or step - self._step >= self.every

    def ran(self, step: int, started: float, ended: float) -> None:
        self._seconds = ended - started if self._runs else 0.0
        self._runs += 1
        self._step, self._ended = step, ended
