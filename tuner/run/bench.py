"""``precision-tuner bench``: float32 against an exported config, each measurement in a fresh
process, the independent check of a speedup on the machine it runs on (the one the model will
train on, say, rather than the one that tuned it).

A round is two processes back to back, float32 (A) and the config (B), in ABBA order over the
rounds (AB, BA, AB, ...) so that neither side always runs first. Each process
(``tuner.worker.programs.one_measurement``) trains the task as a trial does and times ``steps``
steps after ``warmup``; each round gives one paired log ratio of the two medians, and the
speedup is their geometric mean with the project's Student-t interval over rounds
(``tuner.judging.noise``: ``round_log_ratios``, ``speedup_from_log_ratios``). It is a tie when
the interval holds 1.0, else faster or slower. No run-to-run allowance is added: the rounds are
this bench's own processes, spread over its whole duration.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable

from tuner.apply.config import PrecisionConfig
from tuner.errors import TaskError, UsageError
from tuner.judging.noise import SpeedupEstimate, round_log_ratios, speedup_from_log_ratios
from tuner.process_lines import BENCH, read_line
from tuner.run.task_file import check_task_file

FLOAT32 = "float32"


def _measure(task: Path, which: str, steps: int, warmup: int, seed: int) -> dict:
    """One fresh process; its figures, or a one-line TaskError with its last line of stderr."""
    root = str(Path(__file__).resolve().parents[2])   # this tuner, installed or not
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "tuner.worker.programs.one_measurement",
                           str(task), which, str(steps), str(warmup), str(seed)],
                          capture_output=True, text=True, env=env)
    for text in done.stdout.splitlines():
        kind, figures = read_line(text)
        if kind == BENCH:
            return figures
    last = ([line for line in done.stderr.splitlines() if line.strip()] or ["no output"])[-1]
    side = "float32" if which == FLOAT32 else "config"
    raise TaskError(f"the {side} measurement of {task.name} failed (exit {done.returncode}): "
                    f"{last.strip()}")


def _check(task: str | Path, config_path: Path, rounds: int, steps: int,
           warmup: int) -> tuple[Path, PrecisionConfig]:
    for name, value, least in (("--steps", steps, 1), ("--rounds", rounds, 2),
                               ("--warmup", warmup, 1)):
        if value < least:
            raise UsageError(f"{name} must be at least {least}. Received: {name} {value}")
    task_path = check_task_file(task)
    return task_path, PrecisionConfig.load(config_path)


def bench(task: str | Path, config_path: Path, rounds: int = 4, steps: int = 30,
          warmup: int = 5, seed: int = 0, json_path: Path | None = None,
          progress: Callable[[str], None] | None = None) -> dict:
    """Bench ``config_path`` against float32 on ``task``; the record (also written to
    ``json_path``). ``progress`` gets one line per round (default: stderr)."""
    task_path, config = _check(task, Path(config_path), rounds, steps, warmup)
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    which = {"A": FLOAT32, "B": str(Path(config_path).resolve())}
    measured = []
    say(f"bench: {rounds} rounds of two fresh processes (A float32, B the config), "
        "ABBA order")
    for index in range(rounds):
        order = "AB" if index % 2 == 0 else "BA"
        figures = {side: _measure(task_path, which[side], steps, warmup, seed) for side in order}
        measured.append({"round": index + 1, "order": order, "float32": figures["A"],
                         "config": figures["B"]})
        say(f"bench round {index + 1}/{rounds} ({order}): float32 {_ms(figures['A'])}, "
            f"config {_ms(figures['B'])}")
    record = _record(task_path, Path(config_path), config, measured, steps, warmup, seed)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(record, indent=2) + "\n")
    return record


def _ms(figures: dict) -> str:
    median = figures.get("median_ms")
    return f"{median:.2f} ms/step" if median is not None else "no timed steps"


def _record(task: Path, config_path: Path, config: PrecisionConfig, measured: list[dict],
            steps: int, warmup: int, seed: int) -> dict:
    ratios = round_log_ratios([m["float32"]["timed_steps_ms"] for m in measured],
                              [m["config"]["timed_steps_ms"] for m in measured])
    if not ratios:
        raise TaskError(f"no round of the bench of {task.name} timed steps on both sides: "
                        "every measurement stopped before its timed steps (a non-finite loss). "
                        "Check the config with `precision-tuner train --against float32`.")
    estimate = speedup_from_log_ratios(ratios)
    rounds = [{"round": m["round"], "order": m["order"],
               "float32_ms": m["float32"]["median_ms"], "config_ms": m["config"]["median_ms"],
               "ratio": _ratio(m["float32"]["median_ms"], m["config"]["median_ms"]),
               "float32_final_loss": m["float32"]["final_loss"],
               "config_final_loss": m["config"]["final_loss"],
               "config_outcome": m["config"]["outcome"]} for m in measured]
    return {"task": str(task), "config": str(config_path), "config_describe": config.describe(),
            "steps": steps, "warmup": warmup, "seed": seed,
            "machine": {"node": platform.node(), "processor": platform.machine(),
                        "device": measured[0]["config"].get("device", "")},
            "policies": {"float32": measured[0]["float32"].get("policy"),
                         "config": measured[0]["config"].get("policy")},
            "speedup": estimate.to_dict(), "verdict": verdict(estimate),
            "float32_ms": _median_of(rounds, "float32_ms"),
            "config_ms": _median_of(rounds, "config_ms"),
            "float32_final_loss": _median_of(rounds, "float32_final_loss"),
            "config_final_loss": _median_of(rounds, "config_final_loss"), "rounds": rounds}


def _ratio(base: float | None, mine: float | None) -> float | None:
    return base / mine if base and mine else None


def _median_of(rounds: list[dict], key: str) -> float | None:
    values = [r[key] for r in rounds if r[key] is not None and math.isfinite(r[key])]
    return statistics.median(values) if values else None


def verdict(estimate: SpeedupEstimate) -> str:
    """``faster`` or ``slower`` when the interval is clear of 1.0; ``tie`` when it holds it."""
    if estimate.low > 1.0:
        return "faster"
    if estimate.high < 1.0:
        return "slower"
    return "tie"


def summary(record: dict) -> str:
    """The one line that answers: is the config faster than float32 here?"""
    estimate = SpeedupEstimate.from_dict(record["speedup"])
    judged = {"faster": "faster than float32",
              "slower": "slower than float32",
              "tie": "a tie with float32 (the interval holds 1.00: within noise)"}
    return (f"speedup {estimate.describe()} over {estimate.rounds} rounds "
            f"({estimate.confidence:.0%} interval): {judged[record['verdict']]}")


def report(record: dict) -> str:
    """The per-round table, the medians and the summary line, as printed by the command."""
    lines = [f"bench {Path(record['task']).name}: float32 against {record['config_describe']} "
             f"({record['steps']} timed steps after {record['warmup']} warm-up, "
             f"{record['machine']['device'] or 'CPU'})",
             "round  order  float32 ms  config ms   ratio  float32 loss  config loss"]
    for r in record["rounds"]:
        lines.append(f"{r['round']:5d}  {r['order']:>5s}  {_cell(r['float32_ms'], 10)}  "
                     f"{_cell(r['config_ms'], 9)}  {_cell(r['ratio'], 6, 3)}  "
                     f"{_cell(r['float32_final_loss'], 12, 4)}  "
                     f"{_cell(r['config_final_loss'], 11, 4)}"
                     + ("" if r["config_outcome"] == "completed" else f"  ({r['config_outcome']})"))
    lines.append(f"median  float32 {_cell(record['float32_ms'], 0)} ms/step, config "
                 f"{_cell(record['config_ms'], 0)} ms/step")
    lines.append(summary(record))
    return "\n".join(lines)


def _cell(value: float | None, width: int, digits: int = 2) -> str:
    return f"{'-':>{width}s}" if value is None else f"{value:{width}.{digits}f}"
