"""How noisy one re-measurement round is against the length of its runs: one run per example.

    python benchmarks/run_length.py [--examples digits_mlp audio_cnn house_prices]
                                    [--policy mixed_bfloat16] [--seconds 25] [--repeats 2]

The re-measurement (``tuner.run.remeasure``) times float32 and a finalist back to back, round
after round, on live models in one worker, and reads each round's log speedup. Here, in this
process, through the same worker functions (``run_live``: models built and traced once), float32
and ``--policy`` are timed in rounds (AB BA BA AB) whose runs train k steps, for a trial's
steps (sized as the tuner sizes them: ``--steps``, default 136) and a half and a quarter of
them, ``--seconds`` of rounds each, twice in turn. Reported per length: the rounds' standard
deviation of the log speedup, the seconds a round took, and the half-width a 4-round interval
would have. If the spread were the steps' own noise, halving a run would widen it by 1.41x;
where it widens less, shorter runs give more for the time (``Remeasurement.run_share``).

Results go to benchmarks/results/run_length.json. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
WARMUP = 5


def measure(task: str, policy: str, lengths: list[int], seconds: float, repeats: int) -> list:
    """Rows per run length, each round's log speedup as the re-measurement reads it
    (``round_log_ratios`` over the runs' timed steps)."""
    from tuner.judging.noise import round_log_ratios, t_quantile
    from tuner.trial_types import TrialResult, TrialSpec
    from tuner.worker.trial.live import run_live

    def timed(name: str, steps: int) -> list[float]:
        return TrialResult.from_dict(run_live(spec(*configs[name], steps))).timed_steps_ms

    def spec(number: int, config: str, steps: int) -> dict:
        return TrialSpec(number=number, task_path=task, config={"policy": config},
                         steps=steps, warmup_steps=WARMUP, seed=0).to_dict()

    configs = {"A": (0, "float32"), "B": (1, policy)}
    for number, config in configs.values():   # built, traced and warmed once
        run_live(spec(number, config, max(lengths)))
        run_live(spec(number, config, max(lengths)))
    rows = []
    for _ in range(repeats):
        for steps in lengths:
            ratios, started = [], time.perf_counter()
            while time.perf_counter() - started < seconds or len(ratios) < 4:
                order = "AB" if len(ratios) % 4 in (0, 3) else "BA"
                got = {name: timed(name, steps) for name in order}
                ratios += round_log_ratios([got["A"]], [got["B"]])
            spread = statistics.stdev(ratios)
            rows.append({"steps": steps, "rounds": len(ratios),
                         "round_s": round((time.perf_counter() - started) / len(ratios), 3),
                         "speedup": round(math.exp(statistics.fmean(ratios)), 3),
                         "sd_log_ratio": round(spread, 4),
                         "half_width_at_4_rounds": round(t_quantile(3) * spread / 2, 4)})
            print(f"  {Path(task).stem} k={steps:5d}: sd {spread:.3f}, "
                  f"{rows[-1]['round_s']:.2f} s a round, {len(ratios)} rounds", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", nargs="+",
                        default=["digits_mlp", "audio_cnn", "house_prices"])
    parser.add_argument("--policy", default="mixed_bfloat16")
    parser.add_argument("--steps", type=int, nargs="+", default=None,
                        help="a trial's steps per example (default: 136 each; house_prices "
                             "1132, as the tuner sized them on the 2-core CPU)")
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    from tuner.worker.process.startup import import_frameworks

    import_frameworks()
    sized = {"house_prices": 1132}
    from tuner.machine import machine_description

    results = {"machine": f"{machine_description()}, {os.cpu_count()} cores",
               "policy": args.policy,
               "taken": time.strftime("%Y-%m-%d %H:%M"), "examples": {}}
    for index, name in enumerate(args.examples):
        steps = args.steps[index] if args.steps else sized.get(name, 136)
        lengths = [steps, math.ceil(steps / 2), math.ceil(steps / 4)]
        task = str(ROOT / "examples" / f"{name}.py")
        rows = measure(task, args.policy, lengths, args.seconds, args.repeats)
        by_length = {}
        for steps_k in lengths:
            spreads = [row["sd_log_ratio"] for row in rows if row["steps"] == steps_k]
            by_length[steps_k] = statistics.fmean(spreads)
        results["examples"][name] = {
            "rows": rows,
            "widening_when_halved": round(by_length[lengths[1]] / by_length[lengths[0]], 2),
            "widening_when_quartered": round(by_length[lengths[2]] / by_length[lengths[0]], 2)}
        print(f"{name}: a round's spread x{results['examples'][name]['widening_when_halved']} "
              f"with half-length runs, x{results['examples'][name]['widening_when_quartered']} "
              "with quarter-length (white step noise: x1.41 and x2)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "run_length.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
