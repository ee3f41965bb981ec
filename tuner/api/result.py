"""What a tuning run leaves, read back from its run directory: ``TuneResult``.

Plain data: the exported config, its speedup with the interval, the decision, and one row per
trial (a pandas DataFrame). ``load_result(run_dir)`` reads a finished run, or an interrupted
one (no pick yet: ``best`` is None, ``trials`` has what finished).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.apply.config import PURE_POLICIES, PrecisionConfig
from tuner.errors import UsageError
from tuner.records.run_store import BEST_FILE, RunStore


@dataclass(frozen=True)
class Speedup:
    """A speedup against float32 with its interval (``low``..``high``, ``confidence``)."""

    value: float
    low: float
    high: float
    confidence: float = 0.95

    def __str__(self) -> str:
        return f"{self.value:.2f}x [{self.low:.2f}-{self.high:.2f}]"


def _reach(result: dict[str, Any], share: str) -> float | None:
    reach = result.get("precision_reach") or {}
    return reach.get(share) if reach.get("dtype") not in (None, "float32") else None


def _row(record: dict[str, Any]) -> dict[str, Any]:
    """One trial as flat columns: its config, verdict and figures."""
    config = PrecisionConfig.from_dict(record["config"])
    result = record.get("result") or {}
    interval = record.get("speedup_interval") or {}
    validation = result.get("validation") or {}
    return {
        "trial": record["number"], "config": config.describe(), "policy": config.policy,
        "loss_scale": config.loss_scale.kind.value if config.compute_dtype == "float16" else None,
        "weight_update": config.weight_update.value if config.policy in PURE_POLICIES else None,
        "float32_layers": ", ".join(config.float32.groups + config.float32.layers) or None,
        "verdict": record["verdict"], "reason": record.get("reason") or "",
        "median_ms": record.get("median_step_ms"), "remeasured_ms": record.get("remeasured_ms"),
        "speedup": interval.get("ratio"), "speedup_low": interval.get("low"),
        "speedup_high": interval.get("high"),
        "memory_bytes": (result.get("training_memory") or {}).get("total_bytes"),
        # The shares of parameters and activations computed in the 16-bit dtype (float32: None)
        "reach_parameters": _reach(result, "parameter_share"),
        "reach_activations": _reach(result, "activation_share"),
        "loss_decrease_ratio": record.get("loss_decrease_ratio"),
        "val_loss": validation.get("loss"), "repair": bool(record.get("repair")),
    }


@dataclass(frozen=True)
class TuneResult:
    run_dir: Path

    @property
    def best(self) -> PrecisionConfig | None:
        """The exported config, ready for ``scope()`` (None for a run that did not finish)."""
        path = self.run_dir / BEST_FILE
        return PrecisionConfig.load(path) if path.is_file() else None

    @property
    def speedup(self) -> Speedup | None:
        best = self.best
        if best is None or "speedup_vs_float32" not in best.provenance:
            return None
        low, high = best.provenance["speedup_interval"]
        return Speedup(best.provenance["speedup_vs_float32"], low, high,
                       best.provenance.get("confidence", 0.95))

    @property
    def decision(self) -> str:
        """The sentence the summary prints for the pick ("" before the run finished)."""
        best = self.best
        return best.provenance.get("decision", "") if best is not None else ""

    @property
    def trials(self):
        """One row per trial that ran (pandas DataFrame)."""
        import pandas as pd

        return pd.DataFrame([_row(r) for r in RunStore(self.run_dir).read_trials()])

    def save(self, path: str | Path) -> Path:
        """Write the exported config to ``path`` (.json or .yaml, as ``export`` does)."""
        best = self.best
        if best is None:
            raise UsageError(f"the run in {str(self.run_dir)!r} has not finished: it has no "
                             "exported config to save. Resume it with tuner.tune(..., "
                             "resume=True) first.")
        return best.save(path, overwrite=True)

    def _repr_html_(self) -> str:
        best = self.best
        head = (f"<p><b>best:</b> {best.describe()} &mdash; {self.speedup} vs float32; "
                f"{self.decision}</p>" if best is not None else
                f"<p>unfinished run in {self.run_dir}</p>")
        return head + self.trials.to_html(index=False, na_rep="-")

    def __repr__(self) -> str:
        best = self.best
        pick = f"{best.describe()}, {self.speedup} vs float32" if best is not None else "unfinished"
        return f"TuneResult({pick}; run_dir={str(self.run_dir)!r})"


def load_result(run_dir: str | Path) -> TuneResult:
    """A finished or interrupted run, read back from its run directory."""
    run_dir = Path(run_dir)
    if not RunStore(run_dir).exists:
        raise UsageError(f"{str(run_dir)!r} holds no precision-tuner run (no run.json). Pass "
                         "the run directory of a tune.")
    return TuneResult(run_dir)

