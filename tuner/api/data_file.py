"""The data file ``tune()`` writes beside a task made from Python objects (tuner.api.task_writer),
and its loading in a worker: one file whose arrays every worker of a node maps from the page
cache instead of holding its own copy.

The objects are pickled by cloudpickle with pickle protocol 5, their arrays' memory handed
out of band (``buffer_callback``): the pickle itself holds the functions and the arrays'
shapes, and each array's raw bytes follow it in the file, aligned. Loading maps the file
(copy-on-write: a page is shared with the page cache, and with every other worker that maps
it, until someone writes to it) and unpickles with those mapped regions as the arrays'
buffers, so an array is read from disk only where a worker touches it (the batches it trains
on), and costs the node one copy however many workers load it. Ray ships the same file to a
node that cannot see it (tuner.execution.task_shipping).

Layout (integers little-endian, 8 bytes)::

    MAGIC, pickle length P, buffer count N, N x (offset, length), pickle, buffers (64-aligned)
"""

from __future__ import annotations

import hashlib
import mmap
import os
import pickle
import struct
from pathlib import Path
from typing import Any

MAGIC = b"PTDATA01"
_ALIGN = 64


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


class _Hashed:
    """A binary file that hashes what is written to it: the data is hashed as it streams to
    the file, with no copy of it in memory."""

    def __init__(self, file) -> None:
        self.file, self.hash, self.size = file, hashlib.sha256(), 0

    def write(self, chunk) -> None:
        self.hash.update(chunk)
        self.size += memoryview(chunk).nbytes
        self.file.write(chunk)

    def pad_to(self, offset: int) -> None:
        if offset > self.size:
            self.write(b"\0" * (offset - self.size))


def write(path: Path, objects: Any) -> tuple[int, str]:
    """Pickle ``objects`` into ``path`` (whole or not at all: written aside, then renamed);
    its size and SHA-256. Raises what pickling raises."""
    import cloudpickle

    buffers: list[pickle.PickleBuffer] = []
    payload = cloudpickle.dumps(objects, protocol=5, buffer_callback=buffers.append)
    raws = [buffer.raw() for buffer in buffers]
    header = 24 + 16 * len(raws)
    table, offset = [], _aligned(header + len(payload))
    for raw in raws:
        table += [offset, raw.nbytes]
        offset = _aligned(offset + raw.nbytes)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        with partial.open("wb") as file:
            hashed = _Hashed(file)
            hashed.write(struct.pack(f"<8sQQ{len(table)}Q", MAGIC, len(payload), len(raws),
                                     *table))
            hashed.write(payload)
            for start, raw in zip(table[0::2], raws):
                hashed.pad_to(start)
                hashed.write(raw)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)
    return hashed.size, hashed.hash.hexdigest()


def load(path: Path) -> Any:
    """The objects in ``path``, their arrays backed by a copy-on-write map of the file."""
    with open(path, "rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    magic, size, count = struct.unpack_from("<8sQQ", mapped, 0)
    if magic != MAGIC:
        raise ValueError(f"{path} is not a data file written by tuner.tune() (it does not "
                         "begin with its mark): call tune() again")
    table = struct.unpack_from(f"<{2 * count}Q", mapped, 24)
    view = memoryview(mapped)
    start = 24 + 16 * count
    buffers = [view[offset:offset + length]
               for offset, length in zip(table[0::2], table[1::2])]
    return pickle.loads(view[start:start + size], buffers=buffers)
