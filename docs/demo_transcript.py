"""Regenerate the example run on docs/getting-started.md from a real run of ``make demo``'s tune:
``python docs/demo_transcript.py`` (or ``make transcript``), on the machine whose figures the
page should show.

It runs the same command as ``make demo`` (a run directory in a temporary folder), keeps what
the page shows of its output (a policy the machine's ceiling skipped, every trial's line, then
the summary's ``best:``, ``re-measurement:`` and ``confirmation:`` lines, each wrapped as the
page wraps them) and writes them, with the date and the machine's CPU, between the page's
transcript markers. The page's transcript is therefore one the current code printed, never an
edited one; tests/e2e/test_demo_transcript.py holds the page to this script's form and the
script to what the tuner prints.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "getting-started.md"
BEGIN, END = "<!-- transcript: begin -->", "<!-- transcript: end -->"
TRIAL_LINE = re.compile(r"^  #\d+\s+\S.*\s(stable|unstable|failed|pruned|skipped)\b")
SUMMARY_HEADS = ("best:", "re-measurement:", "confirmation:")
SKIPPED = ("space: skipping",)   # a policy this machine's ceiling rules out, and why
WIDTH = 95


def demo_command(run_dir: Path, out: Path) -> list[str]:
    """``make demo``'s tune (the Makefile's recipe), into ``run_dir``."""
    return [sys.executable, "-m", "tuner", "tune", str(ROOT / "examples" / "digits_mlp.py"),
            "--space", "quick", "--run-dir", str(run_dir), "--out", str(out)]


def _items(lines: list[str], heads: tuple[str, ...]) -> list[str]:
    """The console's lines that start with one of ``heads``, each joined with the rest the
    console wrapped onto the next lines (which start unindented, where a table's rows do not)
    and wrapped at ``WIDTH``."""
    items: list[str] = []
    for index, line in enumerate(lines):
        if not line.startswith(heads):
            continue
        whole = [line.strip()]
        for follow in lines[index + 1:]:
            if not follow.strip() or follow.startswith((" ", "┏", "│")) \
                    or re.match(r"^[a-z][a-z -]*: ", follow):
                break
            whole.append(follow.strip())
        items += textwrap.wrap(" ".join(whole), WIDTH, subsequent_indent="  ",
                               break_on_hyphens=False)
    return items


def shown_lines(output: str) -> list[str]:
    """What the page shows of a tune's console output: the configs the space skipped on this
    machine, the trial lines, then the summary's headline lines."""
    lines = output.splitlines()
    trials = [line.rstrip() for line in lines if TRIAL_LINE.match(line)]
    summary = _items(lines, SUMMARY_HEADS)
    if not trials or not summary or not summary[0].startswith("best:"):
        raise ValueError("the tune's output has no trial lines or no 'best:' line: the tuner's "
                         "console changed; update docs/demo_transcript.py")
    return _items(lines, SKIPPED) + trials + summary


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def block(lines: list[str], when: str, cpu: str) -> str:
    return (f"{BEGIN}\nAn example run of `make demo` on this machine: {cpu}, {when} (generated "
            "by `docs/demo_transcript.py`; what the space skipped here, the per-trial lines, "
            "then the summary's headline, wrapped). Your figures will differ: they are your "
            "machine's.\n\n```text\n"
            + "\n".join(lines) + f"\n```\n{END}")


def replaced(page: str, new_block: str) -> str:
    start, end = page.index(BEGIN), page.index(END) + len(END)
    return page[:start] + new_block + page[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path,
                        help="read a tune's saved console output instead of running one")
    options = parser.parse_args()
    if options.output is not None:
        output = options.output.read_text()
    else:
        with tempfile.TemporaryDirectory() as folder:
            done = subprocess.run(demo_command(Path(folder) / "run",
                                               Path(folder) / "best.json"),
                                  cwd=folder, capture_output=True, text=True,
                                  env={**os.environ, "COLUMNS": "1000"})
        if done.returncode != 0:
            print(done.stdout[-2000:] + done.stderr[-2000:], file=sys.stderr)
            return done.returncode
        output = done.stdout
    when = datetime.date.today().isoformat()
    PAGE.write_text(replaced(PAGE.read_text(), block(shown_lines(output), when, cpu_name())))
    print(f"{PAGE.relative_to(ROOT)}: transcript regenerated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
