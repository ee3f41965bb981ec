"""The local worker program (tuner.worker.programs.serve) and its driver side: answers of the
``TrialWorker`` it serves, the worker's own exceptions, a crash with its exit code and reason, a
time limit, a worker that dies before it can speak. (A script without a main guard tuned end
to end: tests/api/test_python_api.py.)"""

import socket
import time

import pytest

from tuner.errors import TaskError, TrialInfrastructureError
from tuner.execution.local import LocalProcessExecutor
from tuner.execution.local_worker import WorkerDied, WorkerProcess, WorkerTimedOut

pytestmark = pytest.mark.system  # each worker imports TensorFlow


@pytest.fixture
def worker(tmp_path):
    process = WorkerProcess(str(tmp_path / "worker.log"))
    yield process
    process.kill()


def _task(tmp_path, name: str, code: str) -> str:
    """A task file whose import does ``code``: the worker runs it when it loads the task."""
    path = tmp_path / f"{name}.py"
    path.write_text(code + "\n")
    return str(path)


def test_a_request_is_answered_by_the_served_worker_and_its_exception_raised_here(worker,
                                                                                  tmp_path):
    assert worker.call("node", timeout_s=120) == socket.gethostname()
    broken = _task(tmp_path, "broken", "raise ValueError('not a task')")
    with pytest.raises(TaskError, match="raised ValueError: not a task"):
        worker.call("diagnose", broken, None, 1, timeout_s=60)
    with pytest.raises(AttributeError, match="no_such_method"):
        worker.call("no_such_method", timeout_s=60)
    assert worker.call("release_live", timeout_s=60) == 0   # alive after an exception


def test_a_crash_raises_its_exit_code_and_a_time_limit_kills(worker, tmp_path):
    crashing = _task(tmp_path, "crashing", "import os; os._exit(3)")
    with pytest.raises(WorkerDied, match="exit code 3") as died:
        worker.call("diagnose", crashing, None, 1, timeout_s=120)
    assert died.value.exit_code == 3
    slow = WorkerProcess(str(tmp_path / "slow.log"))
    sleeping = _task(tmp_path, "sleeping", "import time; time.sleep(60)")
    started = time.monotonic()
    with pytest.raises(WorkerTimedOut):
        slow.call("diagnose", sleeping, None, 1, timeout_s=20)
    assert time.monotonic() - started < 40 and slow.process.poll() is not None


def test_a_worker_that_dies_before_it_speaks_leaves_its_reason_in_the_log_the_error_names(
        tmp_path):
    log = tmp_path / "worker.log"
    broken = WorkerProcess(str(log), program="tuner.worker.no_such_program")
    with pytest.raises(WorkerDied) as died:
        broken.call("node", timeout_s=60)
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
