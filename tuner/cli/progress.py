"""The terminal's live view of a tuning job: a rich progress bar and one line per trial."""

from __future__ import annotations


class LiveProgress:
    """A rich progress bar: trials done, best speedup so far, the current trial."""

    def __init__(self, console, total: int, completed: int = 0) -> None:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        self.console = console
        self.progress = Progress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.description}"),
                                 console=console, transient=True)
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
        from rich.markup import escape

        median = row.judgement.median_step_ms
        self.console.print(escape(
            f"  #{row.number:<3} {row.config.describe():<50} {row.judgement.verdict.value:<12} "
            + (f"{median:9.2f} ms/step" if median else " " * 17)
            + (f"  {row.judgement.reason}" if row.judgement.reason else "")))
        self.progress.update(self.task, advance=1, description=self.best)

    def phase(self, text: str) -> None:
        self.progress.update(self.task, description=f"{self.best} · {text}")
        self.console.print(f"  {text}")
