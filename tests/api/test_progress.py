"""The live progress displays (tuner.api.progress): trials added after the search (deferred
configs of an emulated dtype, tuner.run.held) grow the total the bar counts to."""

from rich.console import Console

from tuner.api.progress import LiveProgress, NotebookProgress, _Bar


def test_trials_added_beyond_the_budget_grow_the_bars_total():
    live = LiveProgress(Console(file=None, quiet=True), total=5)
    with live:
        live.more(2)
        assert live.progress.tasks[0].total == 7
    notebook = NotebookProgress(Console(quiet=True), total=5, completed=1)
    notebook.more(3)
    assert _Bar(notebook).total == 8 and "trials 1/8" in repr(_Bar(notebook))
