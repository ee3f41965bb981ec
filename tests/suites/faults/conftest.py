"""Fault-injection bookkeeping: every test that injects a fault takes the `fault` fixture and
accounts for each run directory it made (``fault.account(run_dir)``, see ``accounting``); the
session ends with one line computed from those accounts:

    faults injected: N, survived: S, trials lost: L, skipped: K

N counts the fault tests that ran, S those that passed with every trial accounted for, L the
trials lost over all of them. A test that fails before it accounted for its run counts one
lost trial (nothing shows that it lost none). A test skipped because this machine cannot
inject its fault (no cgroup memory controller, no ``chattr``) injected nothing: it counts in
K only, neither survived nor lost."""

from dataclasses import dataclass, field

import pytest

from tests.suites.faults.accounting import Accounting, account


@dataclass
class Fault:
    name: str
    accounts: list[Accounting] = field(default_factory=list)
    passed: bool = False
    skipped: bool = False      # the machine could not inject this fault

    def account(self, run_dir, mlflow_uri=None) -> Accounting:
        """Account for one run directory of this fault; returns the accounting."""
        accounting = account(run_dir, mlflow_uri)
        self.accounts.append(accounting)
        return accounting

    @property
    def lost(self) -> int:
        if self.skipped:
            return 0
        if not self.accounts:
            return 1
        return sum(len(a.lost) for a in self.accounts)

    @property
    def survived(self) -> bool:
        return self.passed and self.lost == 0


LEDGER: list[Fault] = []


@pytest.fixture
def fault(request):
    record = Fault(request.node.name)
    LEDGER.append(record)
    request.node.fault_record = record
    yield record


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    record = getattr(item, "fault_record", None)
    if record is not None and report.skipped:
        record.skipped = True
    elif record is not None and report.when == "call":
        record.passed = report.passed


def summary_line(ledger: list[Fault]) -> str:
    ran = [f for f in ledger if not f.skipped]
    return (f"faults injected: {len(ran)}, survived: {sum(f.survived for f in ran)}, "
            f"trials lost: {sum(f.lost for f in ran)}, skipped: {len(ledger) - len(ran)}")


def pytest_terminal_summary(terminalreporter):
    if not LEDGER:
        return
    for record in LEDGER:
        if record.skipped:
            terminalreporter.write_line(f"fault skipped (not injectable here): {record.name}")
        elif not record.survived:
            details = "; ".join(a.describe() for a in record.accounts) or "no run accounted"
            terminalreporter.write_line(f"fault not survived: {record.name}: {details}")
    started = sum(len(a.started) for f in LEDGER for a in f.accounts)
    finished = sum(len(a.finished) for f in LEDGER for a in f.accounts)
    ended = sum(len(a.ended) for f in LEDGER for a in f.accounts)
    stated = sum(len(a.stated) for f in LEDGER for a in f.accounts)
    terminalreporter.write_line(f"fault accounting: {started} trials started, {finished} "
                                f"finished and recorded ({stated} stated missing from MLflow), "
                                f"{ended} ended unfinished and recorded")
    terminalreporter.write_line(summary_line(LEDGER))
