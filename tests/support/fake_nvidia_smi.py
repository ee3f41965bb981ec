"""An ``nvidia-smi`` of our own, listing GPUs that are not there: what device discovery
(tuner.execution.gpus) and the commands that place work on GPUs read, on a machine without
one (TensorFlow still runs on the CPU)."""

from __future__ import annotations

import stat
from pathlib import Path


def fake_nvidia_smi(folder: Path, count: int, name: str = "NVIDIA H100 80GB HBM3") -> Path:
    """Write an ``nvidia-smi`` into ``folder`` whose ``-L`` lists ``count`` GPUs named
    ``name``; returns ``folder``, to put first on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    lines = "\n".join(f"GPU {i}: {name} (UUID: GPU-{i:04d}aaaa)" for i in range(count))
    script.write_text(f"#!/bin/sh\ncat <<'END'\n{lines}\nEND\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder
