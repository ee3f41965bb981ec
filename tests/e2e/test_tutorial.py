"""The tutorial (docs/tutorial.md) as a new user follows it, in an empty directory: its files
saved as it says, then every command of its ```bash blocks run in the order they appear
(tune, the MLflow UI started and stopped with Ctrl-C, the training script, the longer check
against float32, the timing on this machine), and the tune run a second time in the same
folder, as the tutorial says to whenever the model changes.

The commands are read from the page, so a command the page changes is the command tested.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.snippets import blocks_of

pytestmark = pytest.mark.slow

TUTORIAL = ROOT / "docs" / "tutorial.md"
# The run directory the page shows in its `ui` command, and the one the summary prints.
SHOWN_RUN_DIR = re.compile(r"runs/my_task-\d{8}-\d{6}")
PRINTED_UI = re.compile(r"precision-tuner ui --run-dir (\S+)")
KEPT = re.compile(r"the earlier best_precision\.json is kept as (best_precision\.[\d-]+\.json)")


def bash_commands(page: Path) -> list[str]:
    """Every command line of the page's ```bash blocks, in order (comments dropped)."""
    commands, inside = [], False
    for line in page.read_text().splitlines():
        if line.strip().startswith("```"):
            inside = line.strip() == "```bash" if not inside else False
            continue
        command = line.split("#", 1)[0].strip()
        if inside and command:
            commands.append(command)
    return commands


def _env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PYTHONPATH": str(ROOT), "PATH": bin_dir + os.pathsep
            + os.environ["PATH"], "PYTHONUNBUFFERED": "1"}


def _run(command: str, cwd: Path, timeout: int = 600) -> str:
    done = subprocess.run(command, shell=True, cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{output[-4000:]}"
    return output


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ui_started_and_stopped(command: str, cwd: Path) -> None:
    """The `ui` command as the page gives it (on a free port), answering, then Ctrl-C."""
    port = _free_port()
    process = subprocess.Popen(f"{command} --port {port}", shell=True, cwd=cwd, env=_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        deadline, answered = time.monotonic() + 120, False
        while time.monotonic() < deadline and not answered and process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
                    answered = page.status == 200
            except OSError:
                time.sleep(0.5)
        assert answered, f"`{command}` never answered:\n{process.stdout.read()[-3000:]}" \
            if process.poll() is not None else f"`{command}` never answered within 120 s"
        os.killpg(process.pid, signal.SIGINT)   # Ctrl-C, as the page says
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    with pytest.raises(OSError):   # nothing left listening
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_the_tutorial_runs_in_order_in_an_empty_directory(tmp_path):
    for block in blocks_of(TUTORIAL):   # the files the page says to save (my_task.py, train.py)
        if block.kind == "run" and block.run_as != "snippet.py":
            (tmp_path / block.run_as).write_text(block.text)
    commands = bash_commands(TUTORIAL)
    assert [command.split()[:2] for command in commands] == [
        ["precision-tuner", "tune"], ["precision-tuner", "ui"], ["python", "train.py"],
        ["precision-tuner", "train"], ["precision-tuner", "bench"]], commands
    printed: dict[str, str] = {}
    for command in commands:
        if command.startswith("precision-tuner ui"):
            shown = SHOWN_RUN_DIR.search(command).group(0)
            _ui_started_and_stopped(command.replace(shown, printed["run_dir"]), tmp_path)
            continue
        output = _run(command, tmp_path)
        if command.startswith("precision-tuner tune"):
            printed["run_dir"] = PRINTED_UI.search(output).group(1)
            first = (tmp_path / "best_precision.json").read_text()
            again = _run(command, tmp_path)   # the same step again: no flag needed
            kept = KEPT.search(again)
            assert kept, again[-3000:]
            assert (tmp_path / kept.group(1)).read_text() == first
            second_run = PRINTED_UI.search(again).group(1)
            assert second_run != printed["run_dir"]
            assert (tmp_path / "best_precision.json").read_text() \
                == (tmp_path / second_run / "best_precision.json").read_text()
        elif command.startswith("precision-tuner train"):
            assert "verdict" in output.lower(), output[-3000:]
        elif command.startswith("precision-tuner bench"):
            assert re.search(r"speedup \d+\.\d+x \[\d+\.\d+-\d+\.\d+\]", output), output[-3000:]
