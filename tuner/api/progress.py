"""The live view of a tuning job: a progress bar (rich's in a terminal, a display updated in
place in a notebook) and one line per trial."""

from __future__ import annotations

import time


class LiveProgress:
    """A rich progress bar: trials done, best speedup so far, the current trial."""

    def __init__(self, console, total: int, completed: int = 0) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = console
        self.progress = Progress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.description}"),
                                 console=console, transient=True)
        self.total = total
        self.task = self.progress.add_task("starting", total=total, completed=completed)
        self.best = "best: -"

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc_info):
        self.progress.__exit__(*exc_info)

    def trial_started(self, number: int, description: str) -> None:
        from rich.markup import escape

        self.progress.update(self.task,
                             description=escape(f"{self.best} · now #{number} {description}"))

    def trial_finished(self, row, best, speedup) -> None:
        if best is not None and speedup is not None:
            self.best = f"best: {speedup:.2f}x"
        self.console.print(_trial_line(row), markup=False)
        self.progress.update(self.task, advance=1, description=self.best)

    def phase(self, text: str) -> None:
        self.progress.update(self.task, description=f"{self.best} · {text}")
        self.console.print(f"  {text}")

    def more(self, count: int) -> None:
        self.total += count
        self.progress.update(self.task, total=self.total)


class NotebookProgress:
    """The same view in a Jupyter notebook: one display updated in place (an HTML progress bar
    and the same text), with no widget library needed; the per-trial lines print below it."""

    def __init__(self, console, total: int, completed: int = 0) -> None:
        self.console = console
        self.total, self.completed = total, completed
        self.best, self.description = "best: -", "starting"
        self.started = time.monotonic()
        self.handle = None

    def __enter__(self):
        from IPython.display import display

        self.handle = display(_Bar(self), display_id=True)
        return self

    def __exit__(self, *exc_info):
        self.description = self.best if exc_info[0] is None else f"{self.best} · stopped"
        self._show()

    def _show(self) -> None:
        if self.handle is not None:
            self.handle.update(_Bar(self))

    def trial_started(self, number: int, description: str) -> None:
        self.description = f"{self.best} · now #{number} {description}"
        self._show()

    def trial_finished(self, row, best, speedup) -> None:
        if best is not None and speedup is not None:
            self.best = f"best: {speedup:.2f}x"
        self.console.print(_trial_line(row), markup=False)
        self.completed += 1
        self.description = self.best
        self._show()

    def phase(self, text: str) -> None:
        self.description = f"{self.best} · {text}"
        self.console.print(f"  {text}", markup=False)
        self._show()

    def more(self, count: int) -> None:
        self.total += count
        self._show()


class _Bar:
    """What the notebook's display shows: an HTML bar, with a text form for plain front ends."""

    def __init__(self, progress: NotebookProgress) -> None:
        elapsed = int(time.monotonic() - progress.started)
        self.done, self.total = progress.completed, progress.total
        self.text = (f"trials {self.done}/{self.total} {elapsed // 60}:{elapsed % 60:02d} "
                     f"{progress.description}")

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        import html

        return (f'<progress value="{self.done}" max="{self.total}" style="width:30em"></progress>'
                f" <code>{html.escape(self.text)}</code>")


def _trial_line(row) -> str:
    median = row.judgement.median_step_ms
    return (f"  #{row.number:<3} {row.config.describe():<50} {row.judgement.verdict.value:<12} "
            + (f"{median:9.2f} ms/step" if median else " " * 17)
            + (f"  {row.judgement.reason}" if row.judgement.reason else ""))


def live_progress(console, total: int, completed: int = 0):
    """The live view for where the job runs: a notebook's display, else rich's bar."""
    if getattr(console, "is_jupyter", False):
        return NotebookProgress(console, total, completed)
    return LiveProgress(console, total, completed)
