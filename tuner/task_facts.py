"""``TaskFacts``: what the worker's task check found about the task's model and this device,
as plain data across the process boundary (``to_dict``/``from_dict``), read by name on the
driver's side (the job's plan fitted to it, the console, the records, the export's provenance).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TaskFacts:
    """The task check's findings (tuner.worker.check.task_check).

    ``style``: sequential, functional or subclassed; ``batches``: the run's batch pool;
    ``float32_matches``: the layers each float32 group and pattern selects, and every layer's
    path (``all_layers``); ``optimizer``: what the task's optimizers can take (their epsilon);
    ``diagnostics``: the per-layer diagnostics where asked for (None once the job has taken
    them); ``ceiling``: each precision's speed on this device where measured (None where not);
    ``tf32``: whether float32's products run in TF32 on this device (TensorFlow's default on
    Ampere and newer GPUs);
    ``probe_s``, ``diagnostics_s``, ``ceiling_s``: the seconds each took, apart.
    """

    tensorflow: str = "?"
    keras: str = "?"
    model: str = ""
    style: str = ""
    batches: int = 0
    batch_size: int | None = None
    parameters: int = 0
    float32_matches: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] | None = None
    probe_s: float = 0.0
    diagnostics: dict[str, Any] | None = None
    diagnostics_s: float = 0.0
    ceiling: dict[str, Any] | None = None
    ceiling_s: float = 0.0
    tf32: dict[str, Any] | None = None   # tuner.worker.device.tf32.facts(): on, possible, applies

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskFacts:
        """The facts as the worker sent them; a name this side does not know is refused (the
        two sides are one version of the package)."""
        unknown = set(data) - {each.name for each in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"task check facts with unknown names {sorted(unknown)}: the "
                             "worker and the driver run different precision-tuner versions")
        return cls(**data)
