"""examples/notebook.ipynb in a real Jupyter kernel (jupyter_client, as a notebook front end
drives it): the live progress updates one display in place, interrupting the kernel stops the
job as Ctrl-C does (records closed, the kernel usable, its own handler back), and running the
tune cell again resumes the run and finishes it; the pick then applies and trains."""

import json
import time

import nbformat
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow
NOTEBOOK = ROOT / "examples" / "notebook.ipynb"


def _cells(run_dir, trials):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    cells = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    parameters = next(i for i, cell in enumerate(notebook.cells)
                      if "parameters" in cell.metadata.get("tags", []))
    assert notebook.cells[parameters].source == cells[0]
    # 16-bit trials even where the suite's ceiling, measured under its own load, would skip
    # them (then only float32 runs, and there is no "#1" to interrupt at).
    cells[0] = (f'EXECUTOR = "local"\nRUN_DIR = {str(run_dir)!r}\nTRIALS = {trials}\n'
                'KEEP_SLOW = True')
    return cells


def _text(message) -> str:
    content = message["content"]
    if message["msg_type"] == "stream":
        return content["text"]
    if message["msg_type"] in ("display_data", "update_display_data", "execute_result"):
        return content["data"].get("text/plain", "")
    if message["msg_type"] == "error":
        return f"{content['ename']}: {content['evalue']}"
    return ""


def _execute(manager, client, code, timeout=600, interrupt_when=None):
    """Run ``code``; return (the reply's status, ename, iopub messages). ``interrupt_when``:
    a text that, once in the output, makes the test interrupt the kernel (a user's stop)."""
    msg_id = client.execute(code)
    messages, output, interrupted = [], "", False
    deadline = time.monotonic() + timeout
    while True:
        message = client.get_iopub_msg(timeout=max(1, deadline - time.monotonic()))
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(message)
        output += _text(message)
        if interrupt_when and not interrupted and interrupt_when in output:
            manager.interrupt_kernel()
            interrupted = True
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            break
    reply = client.get_shell_msg(timeout=60)
    while reply["parent_header"].get("msg_id") != msg_id:   # an earlier request's reply
        reply = client.get_shell_msg(timeout=60)
    return reply["content"]["status"], reply["content"].get("ename"), messages, output


def test_the_notebook_tunes_with_live_progress_stops_on_interrupt_and_resumes(tmp_path):
    from jupyter_client.manager import start_new_kernel

    run_dir = tmp_path / "run"
    setup, data, model, tune_cell, trials_cell, apply_cell = _cells(run_dir, trials=5)
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        for code in (setup, data, model):
            status, ename, _, output = _execute(manager, client, code)
            assert status == "ok", output

        # Interrupted once the first 16-bit trial is reported ("  #1 ..."): as Ctrl-C does.
        status, ename, messages, output = _execute(manager, client, tune_cell,
                                                   interrupt_when="  #1 ")
        assert (status, ename) == ("error", "KeyboardInterrupt"), output[-3000:]
        assert "Resume: call tune() again with the same arguments" in output
        run = json.loads((run_dir / "run.json").read_text())
        assert run["status"] == "interrupted"
        finished = (run_dir / "trials.jsonl").read_text().splitlines()
        assert 2 <= len(finished) < 5
        # The progress is one display, updated in place as trials finish.
        shown = [m for m in messages if m["msg_type"] == "display_data"
                 and "trials 0/5" in m["content"]["data"].get("text/plain", "")]
        assert len(shown) == 1
        display_id = shown[0]["content"]["transient"]["display_id"]
        updates = [m["content"]["data"]["text/plain"] for m in messages
                   if m["msg_type"] == "update_display_data"
                   and m["content"]["transient"]["display_id"] == display_id]
        assert any("trials 1/5" in text for text in updates), updates
        assert "<progress" in shown[0]["content"]["data"]["text/html"]
        assert updates[-1].endswith("stopped")

        # The kernel's own SIGINT handler is back, and the kernel runs the next cell.
        status, _, _, output = _execute(
            manager, client, "import signal; print(signal.getsignal(signal.SIGINT))")
        assert status == "ok" and "_on_sigint" not in output, output

        status, ename, messages, output = _execute(manager, client, tune_cell)
        assert status == "ok", output[-3000:]
        assert f"resuming {run_dir}: {len(finished)} of 5 trials already finished" in output
        assert "best config written to" in output
        resumed = output
        status, _, _, output = _execute(manager, client, trials_cell)
        assert status == "ok", output
        rows = (run_dir / "trials.jsonl").read_text().splitlines()
        # All 5 trials, or every config the space holds here: where float16 is emulated (as
        # on CPUs with AMX), the skip rule leaves the quick space three.
        assert len(rows) == 5 or (len(rows) >= len(finished)
                                  and "the search space was exhausted" in resumed), resumed
        status, _, _, output = _execute(manager, client,
                                        "print(len(result.trials), result.best.describe())")
        assert status == "ok" and output.split()[0] == str(len(rows)), output
        status, _, _, output = _execute(manager, client, apply_cell)
        assert status == "ok" and "one epoch, loss" in output, output
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
