"""What MLflow shows of a trial: its params (``config_params``), validation metrics, run name,
the float32 layers placed, and the parent run's summary table as HTML."""

from __future__ import annotations

import math
from typing import Any

from tuner.apply.config import PrecisionConfig

# MLflow's charts draw a series sampled to 320 of its steps (the UI's ``maxResults`` for a
# sampled metric history): more points than that per series are not seen there, and each
# costs the records' thread (2,000 per-step metrics: 0.1 s of SQLAlchemy in MLflow's store).
CHART_POINTS = 320


def chart_steps(values: list[float | None], limit: int = CHART_POINTS) -> list[int]:
    """The steps of a per-step series to log as MLflow metrics: every step where there are at
    most ``limit``; else, in each of ``limit // 2`` even stretches, its first step and its
    highest value (a non-finite one before any), so a spike, a slow step or a NaN still shows,
    and the series' last step. The whole series is in the trial's ``steps.json`` artifact and
    in trials.jsonl."""
    present = [step for step, value in enumerate(values) if value is not None]
    if len(present) <= limit:
        return present
    size = math.ceil(len(present) / (limit // 2))
    kept: list[int] = []
    for start in range(0, len(present), size):
        stretch = present[start:start + size]
        peak = max(stretch, key=lambda step: _height(values[step]))
        kept.extend(sorted({stretch[0], peak}))
    if kept[-1] != present[-1]:
        kept.append(present[-1])
    return kept


def _height(value: float | None) -> tuple[bool, float]:
    finite = value is not None and math.isfinite(value)
    return not finite, value if finite else 0.0


def config_params(config: PrecisionConfig) -> dict[str, str]:
    """Every config field as a flat MLflow param (``loss_scale.kind`` -> ``dynamic``)."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        elif isinstance(value, list):
            flat[prefix] = ",".join(map(str, value)) or "-"
        else:
            flat[prefix] = "-" if value is None else str(value)

    data = config.to_dict()
    data.pop("provenance", None)
    walk("", data)
    return flat


def validation_metrics(validation: dict[str, Any] | None) -> dict[str, float]:
    """``val_loss`` and ``val_<metric>`` of a trial's evaluation (tuner.worker.trial.validation)."""
    if not validation or "loss" not in validation:
        return {}
    metrics = {"val_loss": validation["loss"]}
    metrics.update({f"val_{name}": value for name, value in validation["metrics"].items()})
    return metrics


def placement_text(placed: dict[str, Any]) -> str:
    """``softmax: dense_2, attn/softmax; block_*: block_1`` (or ``-`` when nothing is placed)."""
    parts = [f"{name}: {', '.join(paths) or 'no layer'}"
             for kind in ("groups", "layers") for name, paths in placed.get(kind, {}).items()]
    return "; ".join(parts) or "-"

SUMMARY_TABLE = "summary.html"


def trial_run_name(*, number: int, config: PrecisionConfig, verdict: str,
                   speedup: float | None, median_ms: float | None) -> str:
    """``#4 stable 1.42x 12.3 ms · mixed_bfloat16 · f32: softmax``: the figures first, where the
    runs table's narrow name column still shows them."""
    figures = [verdict]
    if speedup is not None:
        figures.append(f"{speedup:.2f}x")
    if median_ms is not None:
        figures.append(f"{median_ms:.3g} ms")
    return f"#{number} {' '.join(figures)} · {config.describe()}"[:250]


def table_html(table: dict[str, list]) -> str:
    """A self-contained HTML table (MLflow's artifact view renders HTML files)."""
    import html

    columns = list(table)
    count = max((len(values) for values in table.values()), default=0)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(table[c][i]))}</td>" for c in columns)
        + "</tr>" for i in range(count))
    return ("<!doctype html><meta charset='utf-8'><style>table{border-collapse:collapse;"
            "font:13px sans-serif}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
            f"</style><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>\n")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
