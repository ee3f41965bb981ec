"""The benchmarks' figures as plots for the documentation site, drawn from their results files.

    python benchmarks/plots.py            # writes docs/img/benchmarks/*.png from results/*.json

Each plot shows ratios with their intervals, as every speed claim here is made:
- ``grid_vs_tuner.png``: per example, the tuner's pick and the exhaustive grid's best against
  float32 (re-measured back to back, 95% intervals), beside float32 timed against itself (the
  A/A noise);
- ``run_to_run.png``: the speedups exported by repeated tunes of one example, each with its
  interval, and the fresh-process A/B checks of the same pick;
- ``guard_overhead.png``: the precision guard's ratio of whole-``fit`` wall times per ABBA
  round (the digits MLP), with the median and its interval.

tests/project/test_docs.py draws them again from the results files and compares them with the
committed images, so a figure on the site is always its results file's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
RESULTS = HERE / "results"
OUT = HERE.parent / "docs" / "img" / "benchmarks"
_PNG = {"metadata": {"Software": None}, "dpi": 100}   # no version stamp: the same bytes again


def _error_bar(axis, y, interval, **style):
    low, mid, high = interval
    axis.errorbar([mid], [y], xerr=[[mid - low], [high - mid]], fmt="o", capsize=4, **style)


def grid_vs_tuner(results: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    examples = results["examples"]
    figure, axis = plt.subplots(figsize=(7, 1.2 + 0.9 * len(examples)))
    for row, example in enumerate(examples):
        y = len(examples) - row
        _error_bar(axis, y + 0.2, example["pick_interval"], color="tab:blue",
                   label="tuner's pick" if row == 0 else None)
        grid = example["grid"]
        low, high = grid["speedup_interval"]
        _error_bar(axis, y, (low, grid["speedup_vs_float32"], high), color="tab:green",
                   label="grid's best" if row == 0 else None)
        _error_bar(axis, y - 0.2, example["aa_interval"], color="grey",
                   label="float32 against itself (A/A)" if row == 0 else None)
    axis.axvline(1.0, color="black", linewidth=0.8)
    axis.set_yticks([len(examples) - i for i in range(len(examples))],
                    [e["example"] for e in examples])
    axis.set_xlabel("speedup vs float32 (95% interval)")
    axis.set_title(f"tuner vs exhaustive grid ({results['label']}, {results['date']})")
    axis.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, **_PNG)
    plt.close(figure)


def run_to_run(results: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.2))
    x = 0
    ticks = []
    for session in results["sessions"]:
        for run in session["runs"]:
            low, high = run["interval"]
            axis.errorbar([x], [run["speedup"]], yerr=[[run["speedup"] - low],
                                                       [high - run["speedup"]]],
                          fmt="o", capsize=3, color="tab:blue")
            ticks.append(x)
            x += 1
        for check in session["summary"]["ab_each"]:
            axis.plot([x], [check], "s", color="tab:orange")
            x += 1
        x += 1
    axis.plot([], [], "s", color="tab:orange", label="fresh-process A/B of the pick")
    axis.errorbar([], [], yerr=[], fmt="o", color="tab:blue", label="a tune's export")
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xticks([])
    axis.set_ylabel("speedup vs float32")
    axis.set_title(f"one example tuned again and again (allowance sd "
                   f"{results['recommended_sd']:g})")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, **_PNG)
    plt.close(figure)


def guard_overhead(results: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    ratios = [round_["ratio"] for round_ in results["rounds"]]
    low, high = results["interval_95"]
    figure, axis = plt.subplots(figsize=(7, 2.6))
    axis.plot(range(1, len(ratios) + 1), ratios, "o", color="tab:blue",
              label="each ABBA round")
    axis.axhline(results["median_ratio"], color="tab:blue",
                 label=f"median x{results['median_ratio']:.3f} [{low:.3f}-{high:.3f}]")
    axis.axhspan(low, high, color="tab:blue", alpha=0.15)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xlabel("round")
    axis.set_ylabel("guarded / plain fit wall time")
    axis.set_title(f"precision guard overhead ({results['model']}, {results['policy']})")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, **_PNG)
    plt.close(figure)


PLOTS = {"grid_vs_tuner.png": ("grid_vs_tuner_cpu.json", grid_vs_tuner),
         "run_to_run.png": ("run_to_run.json", run_to_run),
         "guard_overhead.png": ("guard_overhead.json", guard_overhead)}


def render(results_dir: Path = RESULTS, out: Path = OUT) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (source, draw) in PLOTS.items():
        draw(json.loads((results_dir / source).read_text()), out / name)
        written.append(out / name)
    return written


if __name__ == "__main__":
    for written in render(out=Path(sys.argv[1]) if len(sys.argv) > 1 else OUT):
        print(written)
