"""Which executor a tune runs on (tuner.execution.choice): the local worker process for one
trial at a time on this machine, Ray for trials side by side, a cluster or a service job; and
``--workers auto``, one worker per visible GPU, with the device list faked by an
``nvidia-smi`` of our own on PATH."""

from __future__ import annotations

import os

import pytest

from tests.support.fake_nvidia_smi import fake_nvidia_smi
from tuner.errors import UsageError
from tuner.execution.choice import choose, visible_gpus


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """``fake_gpus(n)``: an ``nvidia-smi -L`` listing n GPUs, first on PATH."""
    def install(count: int) -> None:
        folder = fake_nvidia_smi(tmp_path, count)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return install


@pytest.mark.cli  # runs a fake nvidia-smi
def test_gpus_are_counted_from_nvidia_smi_and_narrowed_by_cuda_visible_devices(
        fake_gpus, monkeypatch):
    fake_gpus(8)
    assert visible_gpus() == 8
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    assert visible_gpus() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-0005aaaa")
    assert visible_gpus() == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert visible_gpus() == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == 0


def test_without_nvidia_smi_there_is_no_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert visible_gpus() == 0


@pytest.mark.cli  # runs a fake nvidia-smi
def test_no_flags_on_a_machine_without_gpus_is_the_local_worker(fake_gpus):
    fake_gpus(0)
    choice = choose("auto", "auto", None, service_job=False)
    assert (choice.kind, choice.workers) == ("local", 1)
    assert "no Ray to start" in choice.why and "local worker process" in choice.line()


@pytest.mark.cli  # runs a fake nvidia-smi
def test_one_gpu_is_one_worker_on_the_local_worker(fake_gpus):
    fake_gpus(1)
    assert (choose("auto", "auto", None, False).kind, choose("auto", "auto", None, False).workers
            ) == ("local", 1)


@pytest.mark.cli  # runs a fake nvidia-smi
def test_eight_gpus_are_eight_workers_side_by_side_on_ray(fake_gpus):
    fake_gpus(8)
    choice = choose("auto", "auto", None, service_job=False)
    assert (choice.kind, choice.workers) == ("ray", 8)
    assert choice.why == "8 GPUs: a worker on each, side by side"
    assert choice.line().startswith("8 workers on Ray")


@pytest.mark.parametrize("executor, workers, address, service, expected", [
    ("auto", 2, None, False, ("ray", 2, "--workers 2: trials side by side")),
    ("auto", 1, None, False, ("local", 1, "one trial at a time on this machine: no Ray to start")),
    ("auto", "auto", "10.0.0.1:6379", False, ("ray", None, "--ray-address: trials on the cluster")),
    ("auto", 3, "10.0.0.1:6379", False, ("ray", 3, "--ray-address: trials on the cluster")),
    ("auto", "auto", None, True, ("ray", 1, "a service job: trials on its Ray cluster")),
    ("ray", "auto", None, False, ("ray", 1, "--executor ray")),
    ("local", "auto", None, False, ("local", 1, "--executor local")),
    ("local", 1, None, False, ("local", 1, "--executor local")),
])
def test_each_flag_combination_names_its_executor_and_why(executor, workers, address, service,
                                                          expected):
    choice = choose(executor, workers, address, service, gpus=0)
    assert (choice.kind, choice.workers, choice.why) == expected
    assert choice.to_dict() == {"kind": expected[0], "workers": expected[1], "why": expected[2]}


@pytest.mark.parametrize("workers, address, said", [
    (2, None, "Received: --executor local --workers 2."),
    ("auto", "10.0.0.1:6379", "Received: --executor local --ray-address 10.0.0.1:6379."),
])
def test_the_local_executor_refuses_what_needs_ray(workers, address, said):
    with pytest.raises(UsageError) as raised:
        choose("local", workers, address, False, gpus=0)
    assert said in str(raised.value) and "--executor auto or ray" in str(raised.value)
