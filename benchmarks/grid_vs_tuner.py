"""The tuner against the obvious alternative, trying everything: one run per example.

    python benchmarks/grid_vs_tuner.py [--examples digits_mlp audio_cnn text_transformer]
                                       [--space benchmarks/spaces/bench.yaml] [--rounds 3]

For each example, through the real CLI (`precision-tuner tune`, default Ray executor):
  1. the exhaustive grid (`--exhaustive --keep-slow-policies`): every config of the space, also
     those of the policies the device's ceiling would skip, to find the true fastest stable
     config the way a user without the tuner would;
  2. the tuner with the space's default budget (its `trials`);
then, in one fresh worker, the tuner's pick, the grid's best and float32 re-measured back to back
in interleaved rounds. Reported per example:
  - regret: tuner pick step time / grid best step time (re-measured; 1.0 when the two are the
    same config), target <= 1.05;
  - cost ratio: tuner wall time / grid wall time, target <= 0.35;
  - speedup of the pick over float32 (re-measured);
  - overhead ratio: tuner wall time / time inside training steps, target <= 1.3. The first
    step of every trial traces the training step; it is counted as overhead (trace_s), not as
    training;
  - outside share of the example's `--space quick` tune (what `make demo` runs): (wall -
    training - tracing) / wall, target <= 0.30, with the tuner's own breakdown of where the
    time went and its number of traces against the distinct configs it timed.
Wall times are what a user waits for: the whole CLI process, TensorFlow and Ray start included.

Results go to benchmarks/results/grid_vs_tuner_<label>.json, and docs/BENCHMARKS.md is rebuilt
from every results file. Run it on an otherwise idle machine (nothing else heavy beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "BENCHMARKS.md"
TARGETS = {"regret": 1.05, "cost_ratio": 0.30, "overhead_ratio": 1.3, "outside_share": 0.30}
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16",
             "f16c")


# -- the machine -----------------------------------------------------------------------------
def machine() -> dict:
    from tuner.machine import machine_description

    info = {"cpu": machine_description(), "cpu_flags": [],
            "cores": os.cpu_count(), "python": platform.python_version(), "gpu": None}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                info["cpu_flags"] = [f for f in CPU_FLAGS if f in flags]
                break
    except OSError:
        pass
    if shutil.which("nvidia-smi"):
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        info["gpu"] = listed.stdout.strip() or None
    return info


# -- one tuning job through the CLI ------------------------------------------------------------
def tune(task: Path, space: str, run_dir: Path, *extra: str) -> dict:
    """Run `precision-tuner tune`; return its wall time, result and the run's own figures."""
    from mlflow import MlflowClient

    from tuner.records.timing import TimeBreakdown

    command = [sys.executable, "-m", "tuner", "tune", str(task), "--space", space,
               "--run-dir", str(run_dir), "--out", str(run_dir.parent / f"{run_dir.name}.json"),
               *extra]
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=4 * 3600)
    wall_s = time.perf_counter() - started
    if completed.returncode != 0:
        sys.exit(f"benchmark: {' '.join(command)} failed:\n{completed.stdout[-3000:]}"
                 f"{completed.stderr[-3000:]}")
    best = json.loads((run_dir / "best_precision.json").read_text())
    trials = json.loads((run_dir / "trials.json").read_text())
    run = json.loads((run_dir / "run.json").read_text())
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    metrics = client.get_run(run["parent_run_id"]).data.metrics
    timing = json.loads((run_dir / "timing.json").read_text())
    workers = timing["workers"].values()
    # The line the summary printed (the console wraps it), rebuilt from timing.json.
    breakdown = TimeBreakdown.from_dict(timing).describe(timing["wall_s"])
    return {"wall_s": round(wall_s, 2), "tuner_wall_s": round(metrics["wall_s"], 2),
            # The share of the job's own wall time spent neither training nor tracing.
            "outside_share": round(1 - (metrics["train_s"] + metrics.get("trace_s", 0.0))
                                   / metrics["wall_s"], 4),
            "traces": sum(w["traces"] for w in workers),
            "distinct_configs": len({json.dumps(strip(t["config"]), sort_keys=True)
                                     for t in trials}),
            "timing": timing, "breakdown": breakdown,
            "train_s": round(metrics["train_s"], 2),
            "trace_s": round(metrics.get("trace_s", 0.0), 2), "trials": len(trials),
            "stable_trials": sum(t["verdict"] == "stable" for t in trials),
            "best": best, "speedup_vs_float32": best["provenance"]["speedup_vs_float32"],
            "speedup_interval": best["provenance"].get("speedup_interval"),
            "tie_within_noise": best["provenance"].get("tie_within_noise")}


# -- back to back ----------------------------------------------------------------------------
def remeasure(task: Path, configs: dict[str, dict], steps: int, warmup: int,
              rounds: int) -> tuple[dict[str, float], dict[str, list[list[float]]]]:
    """Median step time (ms) of each config, timed in interleaved rounds in one fresh worker,
    and each config's timed steps per round (for intervals).

    Labels that name the same config share one measurement (it is timed once per round). A
    control slot times float32 a second time, as if it were another config: the returned
    ``float32_control`` over ``float32`` is the A/A ratio, the noise floor to read regret by.
    """
    from tuner.apply.config import PrecisionConfig
    from tuner.execution.local import LocalProcessExecutor
    from tuner.trial_types import TrialSpec

    slots = {json.dumps(config, sort_keys=True): config for config in configs.values()}
    slots["control"] = PrecisionConfig().to_dict()
    keys = list(slots)
    timings: dict[str, list[float]] = {key: [] for key in keys}
    per_round: dict[str, list[list[float]]] = {key: [] for key in keys}
    with LocalProcessExecutor() as executor:
        # One untimed pass first, so no config pays for the worker's first TensorFlow start.
        executor.run(TrialSpec(0, str(task), slots[keys[0]], warmup + 3, warmup), 900)
        for round_number in range(rounds):
            order = keys if round_number % 2 == 0 else keys[::-1]
            for number, key in enumerate(order, start=1):
                result = executor.run(TrialSpec(number, str(task), slots[key], steps, warmup),
                                      900)
                if result.outcome.value != "completed":
                    sys.exit(f"benchmark: re-measuring {key} failed: {result.failure_message}")
                timings[key].extend(result.timed_steps_ms)
                per_round[key].append(list(result.timed_steps_ms))
    medians = {label: statistics.median(timings[json.dumps(config, sort_keys=True)])
               for label, config in configs.items()}
    rounds_of = {label: per_round[json.dumps(config, sort_keys=True)]
                 for label, config in configs.items()}
    rounds_of["float32_control"] = per_round["control"]
    return {**medians, "float32_control": statistics.median(timings["control"])}, rounds_of


def interval(rounds_of: dict[str, list[list[float]]], label: str) -> list[float]:
    """float32 / ``label`` with its 95% interval over the rounds (tuner.judging.noise's rule)."""
    from tuner.judging.noise import paired_speedup

    estimate = paired_speedup(rounds_of["float32"], rounds_of[label])
    return [round(estimate.low, 4), round(estimate.ratio, 4), round(estimate.high, 4)]


def noise_only(label: str, rounds: int) -> None:
    """Add the A/A ratio to an existing results file, without re-running the searches."""
    from tuner.apply.config import PrecisionConfig
    from tuner.search.space_files import load_space

    path = RESULTS / f"grid_vs_tuner_{label}.json"
    data = json.loads(path.read_text())
    budget = load_space(data["space"]).budget
    for row in data["examples"]:
        task = ROOT / "examples" / f"{row['example']}.py"
        print(f"[{row['example']}] A/A: float32 against itself ({rounds} rounds)...", flush=True)
        ms, _ = remeasure(task, {"float32": PrecisionConfig().to_dict()}, budget.steps,
                          budget.warmup_steps, rounds)
        row["aa_ratio"] = round(ms["float32_control"] / ms["float32"], 4)
        row["aa_measured_separately"] = True
    path.write_text(json.dumps(data, indent=1) + "\n")


def strip(config: dict) -> dict:
    return {k: v for k, v in config.items() if k != "provenance"}


def describe(config: dict) -> str:
    from tuner.apply.config import PrecisionConfig

    return PrecisionConfig.from_dict(strip(config)).describe()


def bench_example(name: str, space: str, rounds: int, work: Path) -> dict:
    from tuner.apply.config import PrecisionConfig
    from tuner.search.space_files import load_space

    task = ROOT / "examples" / f"{name}.py"
    budget = load_space(space).budget
    print(f"[{name}] exhaustive grid...", flush=True)
    # The obvious alternative tries everything, also what the device's ceiling rules out.
    grid = tune(task, space, work / f"{name}-grid", "--exhaustive", "--keep-slow-policies")
    print(f"[{name}] grid: {grid['trials']} trials in {grid['wall_s']:.0f} s; best "
          f"{describe(grid['best'])}", flush=True)
    print(f"[{name}] tuner (default budget)...", flush=True)
    tuned = tune(task, space, work / f"{name}-tuner")
    print(f"[{name}] tuner: {tuned['trials']} trials in {tuned['wall_s']:.0f} s; pick "
          f"{describe(tuned['best'])}", flush=True)
    print(f"[{name}] tuner {tuned['breakdown']}", flush=True)
    print(f"[{name}] tuner: {tuned['outside_share']:.0%} of its wall time outside training "
          f"and tracing; {tuned['traces']} traces for {tuned['distinct_configs']} distinct "
          "configs", flush=True)
    pick, best = strip(tuned["best"]), strip(grid["best"])
    same = pick == best
    configs = {"float32": PrecisionConfig().to_dict(), "pick": pick, "grid_best": best}
    print(f"[{name}] re-measuring float32, the pick and the grid's best back to back "
          f"({rounds} rounds)...", flush=True)
    # As many steps per run as the tuner's sized baseline trained.
    steps = json.loads((work / f"{name}-tuner" / "run.json").read_text())["steps"]
    ms, rounds_of = remeasure(task, configs, steps, budget.warmup_steps, rounds)
    return {
        "quick": quick_tune(name, work),
        "remeasure_steps": steps,
        "example": name,
        "grid": {k: v for k, v in grid.items() if k != "best"} | {"best": describe(best)},
        "tuner": {k: v for k, v in tuned.items() if k != "best"} | {"pick": describe(pick)},
        "same_config": same,
        "remeasured_ms": {k: round(v, 4) for k, v in ms.items()},
        "regret": 1.0 if same else round(ms["pick"] / ms["grid_best"], 4),
        "aa_ratio": round(ms["float32_control"] / ms["float32"], 4),
        "aa_interval": interval(rounds_of, "float32_control"),
        "pick_interval": interval(rounds_of, "pick"),
        "cost_ratio": round(tuned["wall_s"] / grid["wall_s"], 4),
        "speedup_vs_float32": round(ms["float32"] / ms["pick"], 4),
        "grid_best_speedup_vs_float32": round(ms["float32"] / ms["grid_best"], 4),
        "overhead_ratio": round(tuned["wall_s"] / tuned["train_s"], 4),
    }


def quick_tune(name: str, work: Path) -> dict:
    """The example's `--space quick` tune (what `make demo` runs): its own breakdown."""
    print(f"[{name}] quick tune (the demo's space)...", flush=True)
    quick = tune(ROOT / "examples" / f"{name}.py", "quick", work / f"{name}-quick")
    print(f"[{name}] quick: {quick['wall_s']:.0f} s, {quick['outside_share']:.0%} outside "
          f"training and tracing; {quick['traces']} traces for {quick['distinct_configs']} "
          f"configs\n[{name}] quick {quick['breakdown']}", flush=True)
    return {k: v for k, v in quick.items() if k != "best"} | {
        "pick": describe(strip(quick["best"])), "date": time.strftime("%Y-%m-%d %H:%M")}


def quick_only(label: str) -> None:
    """Re-run only the quick tunes and replace their rows in an existing results file."""
    path = RESULTS / f"grid_vs_tuner_{label}.json"
    data = json.loads(path.read_text())
    with tempfile.TemporaryDirectory(prefix="precision-tuner-bench-") as tmp:
        for row in data["examples"]:
            row["quick"] = quick_tune(row["example"], Path(tmp))
    path.write_text(json.dumps(data, indent=1) + "\n")


# -- the report ------------------------------------------------------------------------------
def verdict(value: float, target: float) -> str:
    return "met" if value <= target else "missed"


def _ratio_with_interval(ratio: float, bounds: list[float] | None) -> str:
    """``bounds`` is [low, estimate, high] (the geometric mean over rounds, which the interval
    is built around); without it, the ratio of the pooled medians."""
    if not bounds:
        return f"{ratio:.2f}x"
    return f"{bounds[1]:.2f}x [{bounds[0]:.2f}-{bounds[2]:.2f}]"


def _aa(row: dict) -> str:
    if "aa_ratio" not in row:
        return "-"
    return _ratio_with_interval(row["aa_ratio"], row.get("aa_interval"))


def _tuner_interval(tuner: dict) -> str:
    """What the tuner itself printed for its pick: the speedup and its interval, or a tie."""
    bounds = tuner.get("speedup_interval")
    if bounds is None:
        return "- (not recorded)"
    text = f"{tuner['speedup_vs_float32']:.2f}x [{bounds[0]:.2f}-{bounds[1]:.2f}]"
    return text + (", tie" if tuner.get("tie_within_noise") else "")


def _ray_section() -> list[str]:
    """What Ray parallelism buys, from benchmarks/results/ray_parallel.json."""
    path = RESULTS / "ray_parallel.json"
    if not path.exists():
        return []
    ray = json.loads(path.read_text())
    return [
        "## Ray parallelism", "",
        f"`python benchmarks/ray_parallel.py` (`{path.relative_to(ROOT)}`, {ray['machine']}): "
        f"a study of {ray['trials']} trials of `{ray['task']}` took "
        f"{ray['wall_2_workers_vs_1']:.2f}x the wall time with 2 workers as with 1, so no "
        "gain on 2 cores: each worker gets one thread, and the re-measurement runs alone. Two "
        "trials timed side by side instead of alone ran "
        f"{ray['side_by_side_vs_exclusive']:.2f}x slower, with a "
        f"{ray['spread_side_by_side_pct']:.1f}% spread. That is why finalists are re-measured "
        "on a worker that has the node to itself, and why parallel trials pay only with more "
        "cores or more nodes ([parallel trials and clusters](how-to/clusters.md)).", ""]


def _startup_section() -> list[str]:
    """A tune's fixed cost against its floor, from benchmarks/results/startup_*.json."""
    lines = []
    for path in sorted(RESULTS.glob("startup_*.json")):
        data = json.loads(path.read_text())
        targets, m = data["targets"], data["machine"]
        if not lines:
            lines += ["## Start-up against its floor", "",
                      "`python benchmarks/startup.py`: per example, a `--space quick` tune with "
                      "no flag (the executor the default picks) against the floor any tool "
                      "pays: a fresh process that imports TensorFlow, builds and compiles the "
                      "task's model and runs one compiled step (median of fresh runs). Targets: "
                      f"before the first trial <= {targets['floor_ratio']}x the floor, the "
                      f"share of the wall time outside training and tracing <= "
                      f"{targets['outside_share']}.", ""]
        lines += [f"{data['label']}: {m['cpu']}, {m['cores']} cores; {data['date']}; "
                  f"`{path.relative_to(ROOT)}`.", "",
                  "| example | executor | floor | before the first trial | ratio | wall | "
                  "outside share | shutdown |", "|---|---|---|---|---|---|---|---|"]
        for r in data["examples"]:
            executor = (r.get("executor") or {}).get("kind", "?")
            lines.append(
                f"| {r['example']} | {executor} | {r['floor_median_s']:.1f} s | "
                f"{r['before_first_trial_s']:.1f} s | {r['floor_ratio']:.2f} "
                f"({verdict(r['floor_ratio'], targets['floor_ratio'])}) | {r['wall_s']:.0f} s | "
                f"{r['outside_share']:.2f} "
                f"({verdict(r['outside_share'], targets['outside_share'])}) | "
                f"{r['shutdown_s']:.1f} s |")
        lines.append("")
    return lines


def write_doc() -> None:
    """docs/BENCHMARKS.md from every results file, so other machines' rows can be added."""
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(render_doc())


def render_doc() -> str:
    """The text of docs/BENCHMARKS.md (tests/judging/test_benchmark_results.py compares the
    page)."""
    lines = [
        "# Benchmarks",
        "",
        "<!-- Written by `python benchmarks/grid_vs_tuner.py --doc-only` from "
        "benchmarks/results/ and docs/_parts/benchmarks-reading.md: edit those, not this "
        "page. -->",
        "",
        "What was measured, on which machine, when, and from which results file. Each figure is "
        "a ratio measured in one run on the machine named, so that machine's noise is in it: "
        "on your own machine, `precision-tuner bench TASK --config FILE` times a config "
        "against float32.",
        "",
        "## The tuner against an exhaustive grid",
        "",
        "`python benchmarks/grid_vs_tuner.py`: per example, every config of "
        "`benchmarks/spaces/bench.yaml` (the grid) and the tuner's default budget of that space, "
        "both through the real CLI with the default Ray executor; then the tuner's pick, the "
        "grid's best and float32 re-measured back to back in one fresh worker.",
        "",
        f"Targets: regret <= {TARGETS['regret']}, cost ratio <= {TARGETS['cost_ratio']}, "
        f"overhead ratio <= {TARGETS['overhead_ratio']}; on each example's quick tune (the "
        f"demo's space), the share of the wall time outside training and tracing <= "
        f"{TARGETS['outside_share']}.",
        "",
    ]
    for path in sorted(RESULTS.glob("grid_vs_tuner_*.json")):
        data = json.loads(path.read_text())
        m = data["machine"]
        lines += [f"### {data['label']}: {m['cpu']}, {m['cores']} cores"
                  + (f", {m['gpu']}" if m.get("gpu") else ", no GPU"), "",
                  f"CPU flags: {', '.join(m['cpu_flags']) or 'none of interest'}; TensorFlow "
                  f"{data['tensorflow']}; space `{data['space']}`; {data['date']}; "
                  f"`{path.relative_to(ROOT)}`.", "",
                  "| example | grid: configs, wall | grid best | tuner: trials, wall | tuner pick "
                  "| regret | A/A noise | tuner's own interval | pick vs float32 | cost ratio "
                  "| overhead ratio |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in data["examples"]:
            cells = [
                r["example"],
                f"{r['grid']['trials']}, {r['grid']['wall_s']:.0f} s",
                r["grid"]["best"],
                f"{r['tuner']['trials']}, {r['tuner']['wall_s']:.0f} s",
                r["tuner"]["pick"] + (" (same)" if r["same_config"] else ""),
                f"{r['regret']:.3f} ({verdict(r['regret'], TARGETS['regret'])})",
                _aa(r),
                _tuner_interval(r["tuner"]),
                _ratio_with_interval(r["speedup_vs_float32"], r.get("pick_interval")),
                f"{r['cost_ratio']:.2f} ({verdict(r['cost_ratio'], TARGETS['cost_ratio'])})",
                f"{r['overhead_ratio']:.2f} "
                f"({verdict(r['overhead_ratio'], TARGETS['overhead_ratio'])})",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        quick_rows = [r for r in data["examples"] if "quick" in r]
        if quick_rows:
            quick_dates = sorted({r['quick'].get('date', data['date']) for r in quick_rows})
            lines += ["Each example's `--space quick` tune (what `make demo` runs), as the "
                      "tuner broke its wall time down (run at "
                      f"{', '.join(quick_dates)}"
                      "; `--quick-only` re-runs just these):", "",
                      "| example | wall | training | tracing | outside share | traces / "
                      "configs timed | pick | where the time went |",
                      "|---|---|---|---|---|---|---|---|"]
            for r in quick_rows:
                q = r["quick"]
                share = q["outside_share"]
                lines.append(
                    f"| {r['example']} | {q['tuner_wall_s']:.1f} s | {q['train_s']:.1f} s | "
                    f"{q['trace_s']:.1f} s | {share:.2f} "
                    f"({verdict(share, TARGETS['outside_share'])}) | {q['traces']} / "
                    f"{q['distinct_configs']} | {q['pick']} | "
                    f"{q['breakdown'].removeprefix('where the time went: ')} |")
            lines.append("")
    if not (RESULTS / "grid_vs_tuner_gpu.json").exists():
        lines += ["### GPU", "",
                  "No GPU results file yet. On a GPU machine, `pip install \".[gpu]\"` and "
                  "`python benchmarks/grid_vs_tuner.py` write "
                  "`benchmarks/results/grid_vs_tuner_gpu.json`, and its rows appear here. Which "
                  "GPUs can gain is on [which hardware benefits](concepts/hardware.md).", ""]
    reading = ROOT / "docs" / "_parts" / "benchmarks-reading.md"
    if reading.exists():
        lines += [reading.read_text().rstrip(), ""]
    lines += _startup_section()
    lines += _ray_section()
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", nargs="+",
                        default=["digits_mlp", "audio_cnn", "text_transformer"])
    parser.add_argument("--space", default=str(Path("benchmarks/spaces/bench.yaml")))
    parser.add_argument("--rounds", type=int, default=3, help="back-to-back re-measure rounds")
    parser.add_argument("--label", help="results name [default: cpu, or gpu with a GPU]")
    parser.add_argument("--doc-only", action="store_true",
                        help="only rebuild docs/BENCHMARKS.md from the results files")
    parser.add_argument("--noise-only", action="store_true",
                        help="only add the A/A ratio (float32 against itself) to the --label "
                             "results file, then rebuild the doc")
    parser.add_argument("--quick-only", action="store_true",
                        help="only re-run each example's quick tune and replace its row in the "
                             "--label results file, then rebuild the doc")
    args = parser.parse_args()
    if args.quick_only:
        quick_only(args.label or ("gpu" if machine()["gpu"] else "cpu"))
        args.doc_only = True
    if args.noise_only:
        noise_only(args.label or ("gpu" if machine()["gpu"] else "cpu"), args.rounds)
        args.doc_only = True
    if args.doc_only:
        write_doc()
        print(f"wrote {DOC.relative_to(ROOT)}")
        return 0
    info = machine()
    label = args.label or ("gpu" if info["gpu"] else "cpu")
    rows = []
    with tempfile.TemporaryDirectory(prefix="precision-tuner-bench-") as tmp:
        for name in args.examples:
            rows.append(bench_example(name, args.space, args.rounds, Path(tmp)))
            print(json.dumps(rows[-1], indent=1), flush=True)
    data = {"label": label, "date": time.strftime("%Y-%m-%d"), "machine": info,
            "tensorflow": _tensorflow_version(), "space": args.space, "rounds": args.rounds,
            "targets": TARGETS, "examples": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"grid_vs_tuner_{label}.json"
    out.write_text(json.dumps(data, indent=1) + "\n")
    write_doc()
    print(f"wrote {out.relative_to(ROOT)} and {DOC.relative_to(ROOT)}")
    return 0


def _tensorflow_version() -> str:
    completed = subprocess.run([sys.executable, "-c", "import tensorflow as tf; "
                                "print(tf.__version__)"], capture_output=True, text=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return completed.stdout.strip() or "?"


if __name__ == "__main__":
    sys.exit(main())
