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
