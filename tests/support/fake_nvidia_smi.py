"""An ``nvidia-smi`` of our own, listing GPUs that are not there: what device discovery
(tuner.execution.gpus) and the commands that place work on GPUs read, on a machine without
one (TensorFlow still runs on the CPU)."""

from __future__ import annotations

import stat
from pathlib import Path


def fake_nvidia_smi(folder: Path, count: int, name: str = "NVIDIA H100 80GB HBM3",
                    free_mib: int = 81000) -> Path:
    """Write an ``nvidia-smi`` into ``folder`` whose ``-L`` lists ``count`` GPUs named
    ``name``, and whose ``--query-gpu=memory.free ... -i ID`` answers ``free_mib`` plus the
    GPU's index (for ``-i`` given an index); returns ``folder``, to put first on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    lines = "\n".join(f"GPU {i}: {name} (UUID: GPU-{i:04d}aaaa)" for i in range(count))
    script.write_text(f"""#!/bin/sh
case "$1" in
  --query-gpu=memory.free) echo $(({free_mib} + ${{4:-0}})); exit 0;;
esac
cat <<'END'
{lines}
END
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder
