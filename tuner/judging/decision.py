"""Where the winner is decided: the simplest config whose gain over float32 is real.

A config other than plain float32 wins only when the *lower* end of its speedup interval clears
``1 + min_gain``: a gain inside the machine's noise is a tie, and a tie goes to the simpler
config. Among configs that clear the bar and whose intervals overlap the leader's, the simplest
wins — float32 before 16-bit, default epsilons before changed ones, fewer float32 placements
before more, and under float16 Keras's own default, a dynamic loss scale, before none or a fixed
one. A float16 config without a loss scale is a finalist only with evidence that it needs none
(``no_loss_scale_evidence``). Pure Python: the inputs are plain configs and ``SpeedupEstimate``s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from tuner.apply.config import PrecisionConfig
from tuner.judging.noise import NORMAL_QUANTILE, SpeedupEstimate

DEFAULT_MIN_GAIN = 0.03

# Simpler first. bfloat16 needs no loss scale, so it is the simpler 16-bit choice.
_POLICY_ORDER = ("float32", "mixed_bfloat16", "mixed_float16", "bfloat16", "float16")
# Where compute is float16, Keras's own default (compile wraps the optimizer in a dynamic loss
# scale) is the simple choice; none must earn its place with evidence (no_loss_scale_evidence):
# LossScaleKind.complexity.


def complexity(config: PrecisionConfig) -> tuple[int, int, int, int, int]:
    """A sort key: smaller is simpler (what a user would rather apply, all else equal)."""
    changed_epsilons = sum(value is not None for value in
                           (config.epsilon.backend, config.epsilon.optimizer))
    placements = len(config.float32.groups) + len(config.float32.layers)
    return (_POLICY_ORDER.index(config.policy), changed_epsilons, placements,
            config.loss_scale.kind.complexity, config.weight_update.complexity)


FLOAT16_MIN_NORMAL = 2.0**-14


def no_loss_scale_evidence(gradient_p01: float | None) -> tuple[bool, str]:
    """May a float16 config without a loss scale be picked, and the evidence either way, from
    the diagnostics' smallest 1% of non-zero weight gradients (float32, at scale 1): below
    float16's smallest normal number they lose precision or flush to zero without a scale."""
    if gradient_p01 is None:
        return False, "no diagnostics of the gradients: a float16 pick keeps a loss scale"
    if gradient_p01 < FLOAT16_MIN_NORMAL:
        return False, (f"the smallest 1% of gradients (from {gradient_p01:.2g}) are subnormal "
                       "in float16 without a loss scale")
    return True, (f"the smallest 1% of gradients (from {gradient_p01:.2g}) stay normal in "
                  "float16 without a loss scale")


@dataclass(frozen=True)
class Candidate:
    number: int                      # trial number
    config: PrecisionConfig
    estimate: SpeedupEstimate        # vs float32, re-measured


@dataclass(frozen=True)
class Decision:
    winner: int                      # trial number (the baseline's when float32 wins)
    estimate: SpeedupEstimate        # the winner's speedup vs float32 with its interval
    tie: bool                        # a faster-looking config lost to a simpler one (noise)
    explanation: str                 # one line for the summary


def decide(baseline: int, candidates: Sequence[Candidate], *,
           min_gain: float = DEFAULT_MIN_GAIN, baseline_rounds: int = 0,
           run_drift: float = 0.0) -> Decision:
    """Pick the winner among re-measured candidates (the float32 baseline not among them).
    ``run_drift``: the run-to-run allowance (``tuner.judging.noise.RUN_DRIFT_SD``) each
    speedup over float32 is widened by before the bar; finalists are compared on their rounds."""
    bar = 1.0 + min_gain
    clear = [c for c in candidates if c.estimate.across_runs(run_drift).clears(bar)]
    if not clear:
        return _float32_wins(baseline, candidates, bar, baseline_rounds, run_drift)
    leader = max(clear, key=lambda c: c.estimate.ratio)
    contenders = [c for c in clear if c.estimate.overlaps(leader.estimate)]
    winner = min(contenders, key=lambda c: (complexity(c.config), -c.estimate.ratio))
    against_float32 = winner.estimate.across_runs(run_drift)
    if winner is leader:
        return Decision(winner.number, against_float32, False,
                        f"{against_float32.describe()} vs float32{_allowance(against_float32)}: "
                        f"clears the {min_gain:.0%} minimum gain beyond noise")
    return Decision(winner.number, against_float32, True,
                    f"tie within noise: #{leader.number} ({leader.estimate.describe()}) is not "
                    f"clearly faster than the simpler #{winner.number} "
                    f"({winner.estimate.describe()}, in the same rounds)")


def _allowance(estimate: SpeedupEstimate) -> str:
    text = estimate.describe_allowance()
    return f" ({text})" if text else ""


def _float32_wins(baseline: int, candidates: Sequence[Candidate], bar: float,
                  rounds: int, run_drift: float) -> Decision:
    identity = SpeedupEstimate.identity(rounds)
    if not candidates:
        return Decision(baseline, identity, False, "no other stable config to compare")
    best = max(candidates, key=lambda c: c.estimate.ratio)
    if best.estimate.high < 1.0:
        return Decision(baseline, identity, False,
                        f"every finalist is slower than float32 (best: #{best.number} at "
                        f"{best.estimate.describe()} vs float32)")
    widened = best.estimate.across_runs(run_drift)
    return Decision(baseline, identity, True,
                    f"tie within noise: no config beats float32 beyond noise (best: "
                    f"#{best.number} at {widened.describe()} vs float32{_allowance(widened)}; "
                    f"a pick needs the interval's lower end above {bar:.2f}x)")


def settled(baseline: int, now: Sequence[Candidate], at_cap: dict[int, SpeedupEstimate], *,
            min_gain: float, cap: int, run_drift: float = 0.0) -> str:
    """Why more re-measurement rounds cannot change the pick, or "". ``at_cap``: each
    candidate's interval at the round cap, as narrow as it could get with the estimate where it
    is (``tuner.judging.noise.projected_speedup``). Two conditions:

    - at today's estimates, those intervals give today's decision;
    - the pick's side of the bar holds even at the end of today's interval least in its
      favour: a 16-bit pick still clears 1 + ``min_gain`` from its interval's low end, and for
      float32 no candidate would clear it from its interval's high end. (Stopping on a lucky
      early estimate that the bar then cuts through is what this rules out.)

    Against the bar, the cap's intervals carry the run-to-run allowance (``run_drift``) too:
    no number of rounds narrows that part.
    """
    today = decide(baseline, now, min_gain=min_gain, run_drift=run_drift)
    later = [Candidate(c.number, c.config, at_cap[c.number]) for c in now]
    if decide(baseline, later, min_gain=min_gain, run_drift=run_drift).winner != today.winner:
        return ""
    bar = 1.0 + min_gain

    def narrowed(end: float, number: int) -> float:   # ``end`` less the cap's half-width
        widened = at_cap[number].across_runs(run_drift)
        return end * widened.ratio / widened.high

    if today.winner == baseline:
        if any(narrowed(c.estimate.high, c.number) > bar for c in now):
            return ""
        return (f"a settled pick: float32; with {cap} rounds no finalist would clear "
                f"float32 + {min_gain:.0%} even from its interval's high end")
    if narrowed(today.estimate.rounds_interval[0], today.winner) <= bar:
        return ""
    return (f"a settled pick: #{today.winner} ({today.estimate.describe()}); {cap} rounds "
            f"would pick it too at these estimates, and it clears float32 + {min_gain:.0%} "
            "even from its interval's low end")


def none_can_clear(candidates: Sequence[Candidate], *, min_gain: float, run_drift: float,
                   rounds: int) -> str:
    """Why no candidate can be picked whatever more rounds show, or "". A pick needs its
    interval, widened for the run-to-run drift, to clear 1 + ``min_gain`` from its low end
    (``decide``). Even if a candidate's true speedup were the top of its interval now and the
    rounds narrowed to nothing, the drift alone (``run_drift`` at 95%) would keep that low end
    at or under the bar. Stopping here can only answer float32: a lucky early round can make a
    gain look real, never make a real one impossible (the t interval pays for few rounds)."""
    if not candidates:
        return ""
    bar = 1.0 + min_gain
    drift = math.exp(NORMAL_QUANTILE * run_drift)
    best = max(candidates, key=lambda c: c.estimate.high)
    if best.estimate.high / drift > bar:
        return ""
    return (f"no finalist can clear float32 + {min_gain:.0%} even at its interval's top end "
            f"(best: #{best.number} at {best.estimate.describe()}, "
            f"{best.estimate.high / drift:.2f}x less a run's drift) after {rounds} rounds")
