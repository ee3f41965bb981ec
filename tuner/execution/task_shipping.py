"""What a Ray worker needs of a task to load it on a node that may not have the driver's files:
the task file's code and, for a task written by ``tuner.tune()`` from Python objects, the data
file it loads from beside itself (tuner.api.task_writer). Each is put in Ray's object store once
per job; a trial's spec carries their digest and references (``shipment``), and a worker
fetches what its node lacks (tuner.worker.task.task_loader.receive_task).
"""

from __future__ import annotations

import ast
import hashlib
import re
from pathlib import Path

# The generated task file's line naming its data file: written by tuner.api.task_writer, read
# here, so that the driver finds the file without importing the task.
DATA_NAME = "_DATA_NAME"
_DATA_LINE = re.compile(rf"^{DATA_NAME} = ('[^'/\\\n]+'|\"[^\"/\\\n]+\")$", re.MULTILINE)


def data_line(name: str) -> str:
    """The task file's line naming its data file ``name`` (a file beside it)."""
    return f"{DATA_NAME} = {name!r}"


def data_file_of(task_path: Path, source: str) -> Path | None:
    """The data file the task ``source`` (at ``task_path``) loads from beside itself, or None
    (a hand-written task file)."""
    found = _DATA_LINE.search(source)
    return task_path.parent / ast.literal_eval(found.group(1)) if found else None


def shipment(task_path: str, with_data: bool = True) -> dict:
    """The task's code in Ray's object store, its digest, and where the task has a data file
    and ``with_data``, the file's bytes put there too: ``{"digest", "ref"[, "data_name",
    "data_ref"]}``, each reference in a list so that Ray passes it unresolved. The digest is
    the code's: a generated task file names its data's SHA-256, so new data is a new digest.
    Without ``with_data`` (a Ray instance on this machine only) workers read the data file
    where the driver wrote it."""
    import ray

    source = Path(task_path).read_text()
    shipped = {"digest": hashlib.sha256(source.encode()).hexdigest()[:16],
               "ref": [ray.put(source)]}
    data = data_file_of(Path(task_path), source)
    if data is not None and with_data:   # from the file's pages: no copy of it in the driver
        import numpy as np

        mapped = np.memmap(data, dtype=np.uint8, mode="r").view(np.ndarray)
        shipped.update(data_name=data.name, data_ref=[ray.put(mapped)])
    return shipped
