"""The local worker program (tuner.worker.programs.serve) and its driver side: answers, the
worker's own exceptions, a crash with its exit code and reason, a time limit, a worker that dies
before it can speak. (A script without a main guard tuned end to end:
tests/test_python_api.py.)"""

import operator
import os
import time

import pytest

from tuner.errors import TrialInfrastructureError
from tuner.execution.local import LocalProcessExecutor
from tuner.execution.local_worker import WorkerDied, WorkerProcess, WorkerTimedOut

pytestmark = pytest.mark.slow  # each worker imports TensorFlow


@pytest.fixture
def worker(tmp_path):
    process = WorkerProcess(str(tmp_path / "worker.log"))
    yield process
    process.kill()


def test_a_request_is_answered_in_another_process_and_its_exception_raised_here(worker):
    assert worker.call(os.getpid, timeout_s=120) not in (os.getpid(), None)
    assert worker.call(operator.add, 2, 3, timeout_s=60) == 5
    with pytest.raises(ZeroDivisionError):
        worker.call(operator.truediv, 1, 0, timeout_s=60)
    assert worker.call(operator.mul, 4, 5, timeout_s=60) == 20   # alive after an exception


def test_a_crash_raises_its_exit_code_and_a_time_limit_kills(worker, tmp_path):
    with pytest.raises(WorkerDied, match="exit code 3") as died:
        worker.call(os._exit, 3, timeout_s=120)
    assert died.value.exit_code == 3
    slow = WorkerProcess(str(tmp_path / "slow.log"))
    started = time.monotonic()
    with pytest.raises(WorkerTimedOut):
        slow.call(time.sleep, 60, timeout_s=20)
    assert time.monotonic() - started < 40 and slow.process.poll() is not None


def test_a_worker_that_dies_before_it_speaks_leaves_its_reason_in_the_log_the_error_names(
        tmp_path):
    log = tmp_path / "worker.log"
    broken = WorkerProcess(str(log), program="tuner.worker.no_such_program")
    with pytest.raises(WorkerDied) as died:
        broken.call(os.getpid, timeout_s=60)
    assert died.value.exit_code == 1
    assert "No module named tuner.worker.no_such_program" in log.read_text()
    assert "No module named tuner.worker.no_such_program" in str(died.value)

    executor = LocalProcessExecutor(str(log))
    executor._worker = WorkerProcess(str(log), program="tuner.worker.no_such_program")
    with pytest.raises(TrialInfrastructureError) as raised:
        executor.diagnose("task.py")
    message = str(raised.value)
    assert "crashed during diagnostics (exit code 1: " in message and str(log) in message
    assert "no_such_program" in message
