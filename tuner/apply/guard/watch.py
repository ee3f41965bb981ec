"""What the guard reads after each step, as plain numbers: the step's own loss (from Keras's
running-mean loss tracker where it has one), and whether that loss is far above its recent
level, judged against the run's own step-to-step noise (a robust z-score of the log loss), not
a fixed factor; when a check on the kept batch is due (``Spacing``); the "two checks running"
rule the checks share (``InARow``); and whether a repaired run does at least as well as the run
it replaced (``Harm``). No TensorFlow here beyond reading scalars the callback hands over.
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
        self.weight: float | None = None    # the last step's share of the tracker's count

    def reset(self, total: float = 0.0, count: float = 0.0) -> None:
        """The tracker now holds ``total`` and ``count`` (zero: reset)."""
        self._total, self._count = total, count

    def step_loss(self, total: float | None, count: float | None,
                  logged: float | None) -> float | None:
        self.weight = None
        if total is None or count is None or count <= self._count:
            if count is not None and count < self._count:  # the tracker was reset (new epoch)
                self._total, self._count = 0.0, 0.0
                return self.step_loss(total, count, logged)
            return logged
        loss = (total - self._total) / (count - self._count) if math.isfinite(total) else total
        self.weight = count - self._count
        self._total, self._count = total, count
        return loss


class SpikeWatch:
    """Is a loss far above its recent level? Compared in logs with the median of the last
    ``window`` steps, in units of their robust spread (1.4826 x the median absolute deviation),
    after ``min_steps`` steps; ``min_ratio`` keeps a nearly constant loss from tripping on a
    tiny move. The bar is worked out again every ``REFRESH`` steps (two medians of 200 losses
    are a twentieth of a millisecond: a twentieth of a small model's step, every step)."""

    REFRESH = 8

    def __init__(self, sigmas: float = 12.0, window: int = 200, min_steps: int = 30,
                 min_ratio: float = 2.0) -> None:
        if sigmas <= 0 or window < min_steps or min_steps < 5 or min_ratio <= 1:
            raise ValueError(f"spike watch needs sigmas > 0, window >= min_steps >= 5 and "
                             f"min_ratio > 1. Received: sigmas={sigmas}, window={window}, "
                             f"min_steps={min_steps}, min_ratio={min_ratio}")
        self.sigmas, self.min_steps = sigmas, min_steps
        self.min_log_jump = math.log(min_ratio)
        self._logs: deque[float] = deque(maxlen=window)
        self._bar: float | None = None
        self._since = 0   # losses remembered since the bar was worked out

    def threshold(self) -> float | None:
        """The loss above which a step is a spike now (None while too few steps are known)."""
        if len(self._logs) < self.min_steps:
            return None
        if self._bar is None or self._since >= self.REFRESH:
            values = list(self._logs)
            centre = median(values)
            spread = 1.4826 * median(abs(v - centre) for v in values)
            self._bar = math.exp(centre + max(self.sigmas * spread, self.min_log_jump))
            self._since = 0
        return self._bar

    def is_spike(self, loss: float) -> bool:
        """Judge ``loss`` against the steps before it, then remember it (a spike is not kept,
        so one bad step does not raise the bar for the next)."""
        if not (loss > 0 and math.isfinite(loss)):
            return False  # non-finite losses are their own check; zero has no log
        bar = self.threshold()
        if bar is not None and loss > bar:
            return True
        self._logs.append(math.log(loss))
        self._since += 1
        return False


class Spacing:
    """When a check on the kept batch is due: every ``every`` steps and at each epoch's end,
    and never sooner than its last cost allows (it takes at most ``budget`` of the time between
    two checks: a tiny model's epochs last less than a check). The first check's cost does not
    count: it pays for Keras's eager call paths once. ``every=None``: never; ``budget=None``:
    by steps alone."""

    def __init__(self, every: int | None, budget: float | None) -> None:
        self.every, self.budget = every, budget
        self._runs = 0
        self._step = 0
        self._ended = 0.0
        self._seconds = 0.0   # what the last check took

    def due(self, step: int, at_epoch_end: bool, now: float) -> bool:
        if self.every is None or step == self._step:
            return False
        if self.budget is not None and now - self._ended < self._seconds / self.budget:
            return False
        return at_epoch_end or step - self._step >= self.every

    def ran(self, step: int, started: float, ended: float) -> None:
        self._seconds = ended - started if self._runs else 0.0
        self._runs += 1
        self._step, self._ended = step, ended


class InARow:
    """The rule two checks share: a finding counts once it was seen at ``needed`` checks
    running (one check can be a batch's luck). ``seen`` takes what this check found (keys: a
    layer, or one key for the whole model) and returns the keys seen ``needed`` times in a row;
    those start counting again."""

    def __init__(self, needed: int = 2) -> None:
        self.needed = needed
        self.counts: dict[str, int] = {}

    def seen(self, keys) -> list[str]:
        self.counts = {key: self.counts.get(key, 0) + 1 for key in keys}
        lasting = [key for key, count in self.counts.items() if count >= self.needed]
        for key in lasting:
            del self.counts[key]
        return lasting

    def forget(self) -> None:
        self.counts = {}


class Harm:
    """Does a repaired run do at least as well as the run it replaced? Judged on the repaired
    run's first ``steps`` step losses against the replaced run's at the same positions (where a
    restore took the weights back, the replaced run trained those steps too) or, where it did
    not, against the replaced run's last ``steps`` before the repair: worse when its median is
    more than ``allowed`` times the replaced run's."""

    def __init__(self, replaced: dict[int, float], start: int, ended: int, steps: int = 16,
                 allowed: float = 1.25) -> None:
        self.start, self.steps, self.allowed = start, steps, allowed
        same = [replaced[p] for p in range(start + 1, start + steps + 1) if p in replaced]
        last = [replaced[p] for p in sorted(replaced) if p <= ended][-steps:]
        self.reference = same if len(same) == steps else last
        self.repaired: list[float] = []

    @property
    def done(self) -> bool:
        return len(self.repaired) >= self.steps

    @property
    def judgeable(self) -> bool:
        """A reference of finite losses, enough of them (a replaced run that was already
        non-finite cannot be done worse than)."""
        return len(self.reference) >= self.steps // 2 and all(
            math.isfinite(value) for value in self.reference)

    def add(self, loss: float) -> str | None:
        """The repaired run's next loss; what was seen where the repaired run does worse, once
        ``steps`` are in."""
        self.repaired.append(loss)
        if len(self.repaired) < self.steps:
            return None
        now, then = median(self.repaired), median(self.reference)
        if math.isfinite(now) and now <= self.allowed * then:
            return None
        return (f"the repaired run's median loss over {self.steps} steps is {now:.4g}, the run "
                f"it replaced {then:.4g} ({now / then if then > 0 else math.inf:.3g}x; "
                f"allowed {self.allowed:g}x)")
