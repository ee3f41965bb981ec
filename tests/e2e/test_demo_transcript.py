"""The example run on docs/getting-started.md is generated, not edited: the page holds
docs/demo_transcript.py's block between its markers, and the script still finds, in what the
tuner prints today, every line the page shows (a change to the console that the script no
longer reads fails here, not silently on the page)."""

import pytest

from tests.conftest import ROOT
from tests.support.modules import load_file

pytestmark = pytest.mark.slow


def _script():
    return load_file(ROOT / "docs" / "demo_transcript.py")


def test_the_page_holds_the_scripts_block():
    script = _script()
    page = script.PAGE.read_text()
    start, end = page.index(script.BEGIN), page.index(script.END)
    shown = page[start:end].split("```text\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert page.count(script.BEGIN) == page.count(script.END) == 1
    assert page[start:end + len(script.END)] == script.block(shown, *_date_and_cpu(page, script))
    trials = [index for index, line in enumerate(shown) if script.TRIAL_LINE.match(line)]
    assert trials == list(range(trials[0], trials[-1] + 1))   # together, then the summary
    assert shown[trials[-1] + 1].startswith("best:")
    assert all(len(line) <= script.WIDTH for line in shown if not script.TRIAL_LINE.match(line))


def _date_and_cpu(page: str, script) -> tuple[str, str]:
    """The date and CPU the page's block names (what ``block`` was given)."""
    head = page[page.index(script.BEGIN):].split("\n")[1]
    cpu, when = head.split("on this machine: ", 1)[1].split(" (generated")[0].rsplit(", ", 1)
    return when, cpu


def test_the_script_reads_what_the_tuner_prints(tuned):
    _, _, output = tuned
    lines = _script().shown_lines(output)
    trials = [index for index, line in enumerate(lines) if line.startswith("  #")]
    assert len(trials) >= 3 and lines[trials[0]].split()[1] == "float32"
    assert lines[trials[-1] + 1].startswith("best: ")
