"""The NVIDIA devices this machine gives its processes, from ``nvidia-smi -L`` (no TensorFlow,
no CUDA imported here), named as ``CUDA_VISIBLE_DEVICES`` names them.

``nvidia-smi -L`` lists each GPU (``GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5d5b...)``) and,
under a GPU split by MIG, each of its slices (``  MIG 3g.40gb Device 0: (UUID: MIG-c6d4...)``).
A split GPU is no device of its own to a CUDA process: its slices are, each selected by its
MIG UUID. ``CUDA_VISIBLE_DEVICES``, set by the user or by Ray for an actor, narrows the list to
the devices it names (indices, ``GPU-`` or ``MIG-`` UUIDs or their unique prefixes), in its
order; empty or starting with ``-1``: none.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

_GPU = re.compile(r"^GPU (\d+):.*\(UUID: (GPU-[^)\s]+)\)")
_MIG = re.compile(r"^\s+MIG .*\(UUID: (MIG-[^)\s]+)\)")


@dataclass(frozen=True)
class Device:
    """One device a CUDA process can be given: ``name`` as CUDA_VISIBLE_DEVICES would select
    it (a GPU's index, or a slice's MIG UUID), and every name that selects it."""

    name: str
    aliases: tuple[str, ...] = field(default=())

    def named_by(self, item: str) -> bool:
        if item == self.name or item in self.aliases:
            return True
        return item.startswith(("GPU-", "MIG-")) and any(
            alias.startswith(item) for alias in (self.name, *self.aliases))


def devices_of(listing: str) -> list[Device]:
    """The devices ``nvidia-smi -L``'s ``listing`` shows, in its order."""
    gpus: list[tuple[str, str, list[str]]] = []   # index, UUID, its MIG slices' UUIDs
    for line in listing.splitlines():
        gpu, mig = _GPU.match(line), _MIG.match(line)
        if gpu:
            gpus.append((gpu.group(1), gpu.group(2), []))
        elif mig and gpus:
            gpus[-1][2].append(mig.group(1))
    devices = []
    for index, uuid, slices in gpus:
        if slices:   # a split GPU: its slices, selectable through its UUID too
            devices += [Device(slice_uuid, (uuid,)) for slice_uuid in slices]
        else:
            devices.append(Device(index, (uuid,)))
    return devices


def narrowed(devices: list[Device], visible: str | None) -> list[str]:
    """The names of the ``devices`` a process with ``CUDA_VISIBLE_DEVICES=visible`` sees."""
    if visible is None:
        return [device.name for device in devices]
    wanted = [item.strip() for item in visible.split(",") if item.strip()]
    if not wanted or wanted[0].startswith("-"):
        return []
    seen: list[str] = []
    for item in wanted:
        for device in devices:
            if device.named_by(item) and device.name not in seen:
                seen.append(device.name)
    return seen


def visible_gpu_ids() -> list[str]:
    """This machine's devices as its processes see them (``narrowed`` by this process's
    ``CUDA_VISIBLE_DEVICES``); none without ``nvidia-smi``."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    return narrowed(devices_of(listed.stdout), os.environ.get("CUDA_VISIBLE_DEVICES"))
