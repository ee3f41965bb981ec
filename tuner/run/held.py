"""The proposals a search did not train, and why: one line per reason in the summary.

The scheduler (tuner.run.trial_loop) asks ``tuner.judging.worth_training.hold_for`` before it
trains a proposal. A proposal held as dominated or emulated is told to Optuna as not trained
and recorded here; a deferred one waits here, its Optuna trial still open, until the search is
over (``release``), when the scheduler asks again with ``final``: then it is trained, or held
for good. Plain data: configs, trial numbers, lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tuner.judging.decision import complexity
from tuner.judging.verdict import Verdict
from tuner.judging.worth_training import Hold, HoldKind, fast_twin, width_name
from tuner.run.plan import SLOW_TRIAL_BOUND

_NAMED = 3   # configs named in a line; the rest counted


@dataclass
class HeldConfigs:
    emulated: dict[str, float] = field(default_factory=dict)   # dtype -> its ceiling speed
    device: str = ""
    finalists: int = 3
    held: list[tuple[Any, Hold]] = field(default_factory=list)   # (proposal, hold)
    deferred: list[Any] = field(default_factory=list)            # proposals waiting
    released: list[Any] = field(default_factory=list)            # ... back after the search
    trained_after: list[tuple[int, str]] = field(default_factory=list)  # (number, dtype)
    _released_once: bool = False

    @property
    def waiting_keys(self) -> set[str]:
        return {p.key for p in self.deferred + self.released}

    def hold(self, proposal, hold: Hold) -> None:
        if hold.kind is HoldKind.DEFERRED:
            self.deferred.append(proposal)
        else:
            self.held.append((proposal, hold))

    def release(self) -> bool:
        """The search is over: the deferred proposals come back, simplest first (once). True
        when there were any."""
        if self._released_once or not self.deferred:
            return False
        self._released_once = True
        self.released = sorted(self.deferred, key=lambda p: complexity(p.config))
        self.deferred = []
        return True

    def released_line(self) -> str:
        """What the progress display says when the deferred proposals come back."""
        return (f"search over: {len(self.released)} deferred config(s) of an emulated dtype "
                "come back, each trained only where the fast dtype found nothing stable of its "
                "widths")

    def next_released(self):
        return self.released.pop(0) if self.released else None

    def reason(self, hold: Hold) -> str:
        """Why one config is not trained (Optuna's ``not_trained`` attribute)."""
        by = ", ".join(f"#{n}" for n in hold.by)
        if hold.kind is HoldKind.EMULATED:
            return f"the device emulates its dtype; stable of the same widths: {by}"
        return (f"under objective memory it ranks behind {len(hold.by)} stable configs that "
                f"need no more memory and are simpler ({by})")

    def lines(self) -> list[str]:
        """One line per reason, naming the configs (the first few) and the trials that
        settled them."""
        lines = []
        for dtype, speed in self.emulated.items():
            held = [(p, h) for p, h in self.held
                    if h.kind is HoldKind.EMULATED and p.config.compute_dtype == dtype]
            if held:
                by = sorted({n for _, h in held for n in h.by})
                widths = sorted({width_name(p.config.policy) for p, _ in held})
                lines.append(
                    f"{dtype} not tried: {_named([p for p, _ in held])}: {dtype} runs a "
                    f"dense layer's training step at {speed:.2g}x float32's speed on "
                    f"{self.device or 'this device'} (emulated), and {fast_twin(dtype)} found "
                    f"a stable config of the same widths ({' and '.join(widths)}: "
                    f"{', '.join(f'#{n}' for n in by)}), which needs as little memory; "
                    "--keep-slow-policies tries them anyway")
            tried = [n for n, d in self.trained_after if d == dtype]
            if tried:
                lines.append(f"{dtype} tried after {fast_twin(dtype)} ("
                             f"{', '.join(f'#{n}' for n in tried)}): {fast_twin(dtype)} found no "
                             "stable config of those widths, and the device emulates "
                             f"{dtype} ({speed:.2g}x float32's speed)")
        dominated = [(p, h) for p, h in self.held if h.kind is HoldKind.DOMINATED]
        if dominated:
            by = sorted({n for _, h in dominated for n in h.by})
            lines.append(
                f"not trained under objective memory: {_named([p for p, _ in dominated])}: "
                f"each would rank behind at least {self.finalists} stable configs already "
                "found that need no more training memory by construction and are simpler "
                f"({', '.join(f'#{n}' for n in by)}), so it could be neither the pick nor a "
                "finalist")
        return lines


def stopped_lines(rows, steps: int) -> list[str]:
    """The trials (``TrialRow``s) stopped before ``steps``, one line per reason: the early
    stop (under speed, and under balanced against a config that dominates them, a config
    clearly slower than the bar cannot win) and the time bound (a trial far slower than
    float32 is judged on the steps it trained in that time)."""
    lines = []
    bounded = [r for r in rows if r.judgement.judged_steps]
    if bounded:
        counts = sorted({r.judgement.judged_steps for r in bounded})
        span = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        lines.append(f"time-bounded: {_numbered(bounded)}: each trained past "
                     f"{bounded[0].result.time_bounded_s:.3g} s, {SLOW_TRIAL_BOUND:g}x float32's "
                     f"training, so it was judged on its first {span} steps (not {steps}) "
                     "against float32's first as many")
    stopped = [r for r in rows if r.judgement.verdict is Verdict.STOPPED_SLOW]
    if stopped:
        lines.append(f"stopped early as too slow to win: {_numbered(stopped)}: each was clearly "
                     "slower than the bar it had to beat (the early-stop limit, its own line in "
                     "the table); its stability is unknown, and it was not needed")
    return lines


def _numbered(rows) -> str:
    return ", ".join(f"#{r.number} ({r.config.describe()})" for r in rows[:_NAMED]) + \
        (f" and {len(rows) - _NAMED} more" if len(rows) > _NAMED else "")


def _named(proposals: list) -> str:
    names = [p.config.describe() for p in proposals[:_NAMED]]
    more = len(proposals) - len(names)
    count = f"{len(proposals)} config{'s' if len(proposals) != 1 else ''}"
    return f"{count} ({'; '.join(names)}{f'; and {more} more' if more else ''})"
