"""Fault-injection bookkeeping: every test that injects a fault uses the `fault` fixture and
reports how many recorded trials it lost; the run ends with one summary line."""

import pytest

TALLY = {"injected": 0, "survived": 0, "lost": 0}


@pytest.fixture
def fault(request):
    record = {"lost": None}
    TALLY["injected"] += 1
    request.node.fault_record = record
    yield record


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    record = getattr(item, "fault_record", None)
    if record is not None and report.when == "call":
        if record["lost"] is None:  # the test died before it could count: count as lost
            record["lost"] = 1
        TALLY["lost"] += record["lost"]
        if report.passed:
            TALLY["survived"] += 1


def pytest_terminal_summary(terminalreporter):
    if TALLY["injected"]:
        terminalreporter.write_line(
            f"faults injected: {TALLY['injected']}, survived: {TALLY['survived']}, "
            f"trials lost: {TALLY['lost']}")
