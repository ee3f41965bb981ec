"""The memory a worker reads as left on its GPU (tuner.worker.device.room), from a recorded
``nvidia-smi``: the device ``CUDA_VISIBLE_DEVICES`` names first, GPU 0 without it, nothing for
a MIG slice (``nvidia-smi`` does not report a slice's free memory)."""

import pytest

from tests.support.fake_nvidia_smi import fake_nvidia_smi
from tuner.worker.device import room

MiB = 2**20


@pytest.mark.parametrize("visible, free", [(None, 1000), ("1", 1001), ("3,0", 1003),
                                           ("MIG-c6d4aaaa", None), ("-1", None), ("", None)])
def test_the_free_memory_of_the_first_visible_gpu(tmp_path, monkeypatch, visible, free):
    fake_nvidia_smi(tmp_path, 4, free_mib=1000)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert room._gpu_free_bytes() == (None if free is None else free * MiB)


def test_no_nvidia_smi_no_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert room._gpu_free_bytes() is None


def test_the_host_figures_of_a_ready_process():
    room.mark_ready()
    assert room.rss_bytes() > 0 and room.host_available_bytes() > 0
