"""The local executor's reading of a crashed worker's exit code, against the race it met under
the OOM killer: the broken pool's own thread reaps the dead worker, and until it has stored the
code, reading it gives None."""

import threading
import time

from tuner.execution.local import _exit_code


class _ReapedElsewhere:
    """A dead process whose code another thread stores a moment after our join returned."""

    def __init__(self, code: int, stored_after_s: float) -> None:
        self._code = None
        threading.Timer(stored_after_s, self._store, args=(code,)).start()

    def _store(self, code: int) -> None:
        self._code = code

    def join(self, timeout=None) -> None:
        return None  # our waitpid lost the race: nothing to wait for

    @property
    def exitcode(self):
        return self._code


class _StillAlive(_ReapedElsewhere):
    def __init__(self) -> None:
        self._code = None


def test_the_exit_code_stored_by_the_pool_thread_is_read_once_it_is_there():
    assert _exit_code(_ReapedElsewhere(-9, stored_after_s=0.2), timeout_s=5.0) == -9


def test_a_process_that_never_reports_gives_none_after_the_timeout():
    started = time.monotonic()
    assert _exit_code(_StillAlive(), timeout_s=0.3) is None
    assert 0.3 <= time.monotonic() - started < 2.0
