"""A stop request (SIGINT) is remembered: an interrupt swallowed where it landed is raised again
at the next check between runs."""

import os
import signal

import pytest

from tuner import interrupt


def test_a_swallowed_interrupt_is_raised_again_at_the_next_check():
    previous = signal.getsignal(signal.SIGINT)
    try:
        interrupt.install()
        interrupt.raise_if_requested()  # nothing asked yet
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            pass  # a library call that caught it and went on
        with pytest.raises(KeyboardInterrupt):
            interrupt.raise_if_requested()
    finally:
        signal.signal(signal.SIGINT, previous)
        interrupt._requested.clear()


def test_the_callers_handler_is_back_after_the_job():
    """tuner.tune() in a notebook: the kernel's own SIGINT handler is restored when the job
    ends, normally or by an interrupt; off the main thread nothing is installed."""
    import threading

    def callers_handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, callers_handler)
    try:
        with interrupt.handling():
            assert signal.getsignal(signal.SIGINT) is interrupt._on_sigint
        assert signal.getsignal(signal.SIGINT) is callers_handler
        with pytest.raises(KeyboardInterrupt):
            with interrupt.handling():
                os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is callers_handler
        assert not interrupt._requested.is_set()
        seen = []
        thread = threading.Thread(target=lambda: seen.append(
            interrupt.handling().__enter__() or signal.getsignal(signal.SIGINT)))
        thread.start()
        thread.join()
        assert seen == [callers_handler]
    finally:
        signal.signal(signal.SIGINT, previous)
