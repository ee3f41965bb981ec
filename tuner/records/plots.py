"""PNG plots of a tuning job for the MLflow UI (matplotlib, headless).

- speed_vs_stability.png: median step time against the share of float32's loss decrease, for
  every trial that trained; stable and rejected marked, the pick highlighted.
- loss_curves.png: per-step loss of the float32 baseline, the pick and the rejected trials.
- loss_scale.png: the loss scale over steps of the float16 trials that used one.
- diagnostics.png: per-layer float16 risk as a heatmap (when diagnostics ran).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.judging.objective import Point, pareto_front

if TYPE_CHECKING:
    from tuner.records.results import TuneSummary


def _figure(figsize: tuple[float, float], rows: int | None = None):
    """A figure and its axes (with ``rows``: a column of that many panels, as a 2-D array),
    outside pyplot: no backend is chosen and no global state is touched, so a notebook that
    calls tuner.tune() keeps its own backend (``matplotlib.use("Agg")`` here had switched it),
    and pyplot's import (half a second on a laptop CPU) is not paid."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=figsize)
    return figure, figure.subplots() if rows is None else figure.subplots(rows, 1, squeeze=False)


def speed_vs_stability(summary: "TuneSummary", path: Path) -> Path | None:
    points = [r for r in summary.rows if r.judgement.median_step_ms]
    if not points:
        return None
    figure, axes = _figure((8, 5))
    for row in points:
        ratio = row.judgement.loss_decrease_ratio
        stable = row.judgement.stable
        y = ratio if ratio is not None else 0.0
        axes.scatter(row.judgement.median_step_ms, y, s=60,
                     marker="o" if stable else "x", color="tab:green" if stable else "tab:red")
        axes.annotate(f"#{row.number}", (row.judgement.median_step_ms, y), fontsize=8,
                      xytext=(4, 4), textcoords="offset points")
    if summary.best is not None and summary.best.judgement.median_step_ms:
        best = summary.best
        axes.scatter(best.judgement.median_step_ms, best.judgement.loss_decrease_ratio or 1.0,
                     s=260, facecolors="none", edgecolors="gold", linewidths=2.5,
                     label=f"pick: #{best.number} {best.config.describe()}")
    axes.axhline(summary.rows[0].judgement.loss_decrease_ratio or 1.0, color="grey",
                 linestyle=":", linewidth=1)
    axes.scatter([], [], marker="o", color="tab:green", label="stable")
    axes.scatter([], [], marker="x", color="tab:red", label="rejected (ratio 0 = not measured)")
    axes.set_xlabel("median step time after warm-up (ms) — lower is faster")
    axes.set_ylabel("share of float32's loss decrease")
    axes.ticklabel_format(axis="y", useOffset=False)   # 0.99990, not "+1" over -0.00010
    _title(axes, "speed vs stability, every trial\n(search-phase medians; the pick was "
                   "chosen on back-to-back re-measurements)", fontsize=10)
    axes.legend(fontsize=8, loc="best")
    return _save(figure, path)


def speed_vs_memory(summary: "TuneSummary", path: Path) -> Path | None:
    """Step time against training memory for the stable trials, the Pareto front joined."""
    points = [Point(r.number, r.config, r.judgement.median_step_ms,
                    int(r.result.training_memory["total_bytes"]))
              for r in summary.rows if r.judgement.stable and r.judgement.median_step_ms
              and r.result.training_memory]
    if len(points) < 2:
        return None
    figure, axes = _figure((8, 5))
    for point in points:
        axes.scatter(point.step_ms, point.memory_bytes / 1e6, s=50, color="tab:blue")
        axes.annotate(f"#{point.number}", (point.step_ms, point.memory_bytes / 1e6), fontsize=8,
                      xytext=(4, 4), textcoords="offset points")
    front = sorted(pareto_front(points), key=lambda p: p.step_ms)
    axes.plot([p.step_ms for p in front], [p.memory_bytes / 1e6 for p in front], color="tab:orange",
              marker="o", label="Pareto front (nothing beats these on both)")
    best = summary.best
    if best is not None and best.judgement.median_step_ms and best.result.training_memory:
        axes.scatter(best.judgement.median_step_ms,
                     best.result.training_memory["total_bytes"] / 1e6, s=260,
                     facecolors="none", edgecolors="gold", linewidths=2.5,
                     label=f"pick: #{best.number} {best.config.describe()}")
    axes.set_xlabel("median step time after warm-up (ms) — lower is faster")
    axes.set_ylabel("training memory (MB): weights, gradients, optimizer, activations")
    _title(axes, "speed vs memory, stable trials (search-phase medians)", fontsize=10)
    axes.legend(fontsize=8, loc="best")
    return _save(figure, path)


def loss_curves(summary: "TuneSummary", path: Path) -> Path | None:
    """The baseline's, the pick's and the rejected trials' training losses; one panel per loss
    where the model returns several (a GAN's d_loss and g_loss, each judged on its own)."""
    base = summary.baseline.result.loss_terms if summary.baseline else {}
    names = list(base) or [None]
    figure, panels = _figure((8, 3 + 2 * len(names)), rows=len(names))
    shown = 0
    for name, axes in zip(names, panels[:, 0]):
        for row in summary.rows:
            role = ("float32 baseline" if row is summary.baseline else
                    "pick" if row is summary.best else
                    "rejected" if row.judgement.verdict.value in ("unstable", "failed") else None)
            values = row.result.losses if name is None else row.result.loss_terms.get(name, [])
            finite = [v if math.isfinite(v) else float("nan") for v in values]
            if role is None or not finite:
                continue
            axes.plot(range(len(finite)), finite, linewidth=2 if role != "rejected" else 1,
                      linestyle="-" if role != "rejected" else "--",
                      label=f"#{row.number} {role}: {row.config.describe()}")
            shown += 1
        if name is not None:
            axes.set_ylabel(name)
            axes.legend(fontsize=7, loc="best")
    if not shown:
        return None
    panels[-1, 0].set_xlabel("training step")
    return _finish(figure, panels[0, 0], path, "training step" if len(names) == 1 else "",
                   names[0] or "loss", "loss curves (same seed, same batches)")


def loss_scale(summary: "TuneSummary", path: Path) -> Path | None:
    """Each float16 trial's loss scale by step; each optimizer's where it has several."""
    lines = [(f"#{row.number} {row.config.describe()}" + (f" · {name}" if name else ""), scales)
             for row in summary.rows
             for name, scales in ([(o["name"], o["loss_scales"]) for o in row.result.optimizers]
                                  or [("", row.result.loss_scales)])
             if any(s is not None for s in scales)]
    if not lines:
        return None
    figure, axes = _figure((8, 4))
    for label, scales in lines:
        axes.plot(range(len(scales)), [s if s is not None else float("nan") for s in scales],
                  label=label)
    axes.set_yscale("log", base=2)
    axes.yaxis.set_major_formatter(_powers_of_two())
    return _finish(figure, axes, path, "training step", "loss scale",
                   "loss scale over steps (float16 trials)")


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _powers_of_two():
    """Tick labels 2¹⁴ in plain text: matplotlib's own (mathtext, $2^{14}$) parse each new
    label with a grammar, a tenth of a second a plot."""
    from matplotlib.ticker import FuncFormatter

    def label(value, _position) -> str:
        if value <= 0:
            return ""
        exponent = math.log2(value)
        if abs(exponent - round(exponent)) > 1e-9:
            return ""
        return "2" + str(int(round(exponent))).translate(_SUPERSCRIPT)

    return FuncFormatter(label)


def confirmation(summary: "TuneSummary", path: Path) -> Path | None:
    """Validation loss by steps trained: float32 and each confirmed config
    (tuner.run.confirmation_run)."""
    if not summary.confirmations:
        return None
    figure, axes = _figure((8, 4.5))
    shown_float32 = False
    for item in summary.confirmations:
        steps = [point.step for point in item.checkpoints]
        if not steps or not item.quality:   # a speed check alone validates nothing
            continue
        if not shown_float32:
            axes.plot(steps, [point.float32.get("loss", math.nan) for point in item.checkpoints],
                      "o-", color="black", linewidth=2, label="float32")
            shown_float32 = True
        verdict = "confirmed" if item.passed else "rejected"
        axes.plot(steps, [point.pick.get("loss", math.nan) for point in item.checkpoints],
                  "s--" if not item.passed else "s-",
                  label=f"#{item.trial} {item.config} ({verdict})")
    if not shown_float32:
        return None
    return _finish(figure, axes, path, "steps trained in all", "validation loss",
                   "confirmation: validation loss over a longer training")


def diagnostics_heatmap(diagnostics: dict[str, Any], path: Path) -> Path | None:
    layers = diagnostics.get("layers") or []
    if not layers:
        return None
    layers = sorted(layers, key=lambda layer: -layer["risk"])[:40]
    columns = [("activation", "overflow_fraction", "act >f16 max"),
               ("activation", "subnormal_fraction", "act <f16 normal"),
               ("gradient", "overflow_fraction", "grad >f16 max"),
               ("gradient", "underflow_fraction", "grad <f16 min"),
               ("weight_gradient", "underflow_fraction", "w-grad <f16 min")]
    values = [[(layer.get(part) or {}).get(key, 0.0) for part, key, _ in columns]
              for layer in layers]
    figure, axes = _figure((8, max(3, 0.3 * len(layers) + 1.5)))
    image = axes.imshow(values, aspect="auto", cmap="Reds", vmin=0, vmax=1)
    axes.set_xticks(range(len(columns)), [label for _, _, label in columns], rotation=20,
                    fontsize=8)
    axes.set_yticks(range(len(layers)), [layer["layer"] for layer in layers], fontsize=7)
    _title(axes, "per-layer float16 risk (share of values), riskiest first")
    figure.colorbar(image, ax=axes, fraction=0.04)
    return _save(figure, path, fixed=False)


def _title(axes, text: str, **options) -> None:
    """The title at the top of the axes, where matplotlib puts it by default (no axis labels
    are on top here): given ``y``, matplotlib skips measuring every tick label to place it
    (a sixth of a plot's time)."""
    axes.set_title(text, y=1.0, **options)


def _finish(figure, axes, path: Path, xlabel: str, ylabel: str, title: str) -> Path:
    """A line plot's labels and legend, then saved."""
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    _title(axes, title)
    axes.legend(fontsize=7, loc="best")
    return _save(figure, path)


# Margins in inches (left, right, bottom, top) of a one-panel plot whose labels this module
# writes: tick labels and an axis label on the left and below, a title of up to two lines on
# top. Fixed, they spare the layout pass ``tight_layout`` draws the figure for (a third of a
# plot's time, 0.25 s of a tune's records); a figure with labels of any length (layer names, a
# column of panels) is still laid out tight.
_MARGINS_IN = (0.85, 0.25, 0.6, 0.6)


def _save(figure, path: Path, fixed: bool = True) -> Path:
    if fixed and len(figure.axes) == 1:
        width, height = figure.get_size_inches()
        left, right, bottom, top = _MARGINS_IN
        left = max(left, _left_margin(figure.axes[0]))
        figure.subplots_adjust(left=left / width, right=1 - right / width,
                               bottom=bottom / height, top=1 - top / height)
    else:
        figure.tight_layout()
    # A PNG through matplotlib's Agg canvas, pyplot unused; zlib's fastest level (its default
    # took a fifth of the plots' time, for files a third smaller).
    figure.savefig(path, dpi=110, pil_kwargs={"compress_level": 1})
    return path


def _left_margin(axes) -> float:
    """Inches the y tick labels and the y label beside them take, from the labels as they will
    be drawn (no drawing): ``-0.00010`` needs more than the fixed margin, and the axis label
    was cut off."""
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties

    labels = axes.yaxis.get_major_formatter().format_ticks(axes.get_yticks())
    points = FontProperties(size=rcParams["ytick.labelsize"]).get_size_in_points()
    widest = max((len(label) for label in labels), default=0)
    return widest * 0.62 * points / 72 + 0.45   # a digit is 0.62 em; tick, pads, axis label


def warm_up() -> None:
    """Draw a small figure with what the plots use (a log axis, a title, a legend, a PNG):
    matplotlib's import and its fonts cost 0.3-0.6 s the first time in a process, paid at the
    end of every tune unless a thread meanwhile pays it where the driver only waits
    (tuner.api.job, while the worker starts)."""
    import io

    figure, axes = _figure((2, 2))
    axes.plot([1, 2], [1, 1024], label="warm")
    axes.set_yscale("log", base=2)
    axes.yaxis.set_major_formatter(_powers_of_two())
    in_memory: Any = io.BytesIO()     # savefig writes to a file object as well as to a path
    _finish(figure, axes, in_memory, "x", "y", "warm-up")


def make_all(summary: "TuneSummary", diagnostics: dict[str, Any] | None,
             folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    made = [speed_vs_stability(summary, folder / "speed_vs_stability.png"),
            speed_vs_memory(summary, folder / "speed_vs_memory.png"),
            loss_curves(summary, folder / "loss_curves.png"),
            loss_scale(summary, folder / "loss_scale.png"),
            confirmation(summary, folder / "confirmation.png")]
    if diagnostics:
        made.append(diagnostics_heatmap(diagnostics, folder / "diagnostics.png"))
    return [path for path in made if path is not None]
