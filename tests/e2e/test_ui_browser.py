"""The MLflow UI in a real browser: ``precision-tuner ui`` on a finished run, driven through
Debian's headless Chromium and ChromeDriver (no browser download).

Screenshots land in ``runs/screenshots/`` (or ``$PT_SCREENSHOT_DIR``); the one the MLflow page
shows (``docs/img/mlflow_trials.png``) is written there too, by the same test, so that it is
always the UI as it is today. Without chromium and
chromedriver the tests that drive a browser skip, unless ``PT_REQUIRE_BROWSER=1`` (set by
``.ci/run``) makes that a failure; the test of the links ``ui`` prints runs either way.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.system

SCREENSHOTS = Path(os.environ.get("PT_SCREENSHOT_DIR", ROOT / "runs" / "screenshots"))
CHROME_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1600,1000")
PAGE_TIMEOUT_S = 60
# Screenshots a documentation page shows: rewritten by every run of their test.
DOC_IMAGES = ROOT / "docs" / "img"
IN_THE_DOCS = ("mlflow_trials.png",)


def _require_browser() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    missing = [name for name, path in (("chromium", chromium), ("chromedriver", chromedriver))
               if path is None]
    try:
        import selenium  # noqa: F401 - only whether it is installed
    except ImportError:
        missing.append("selenium (pip install -e '.[dev]')")
    if missing:
        message = (f"browser test needs {', '.join(missing)}; on Debian: apt-get install "
                   "chromium chromium-driver")
        if os.environ.get("PT_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return chromium, chromedriver


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_http(url: str, process: subprocess.Popen, output: list[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"precision-tuner ui exited with {process.returncode}:\n"
                        + "".join(output)[-3000:])
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail("the MLflow UI did not answer within 120 s:\n" + "".join(output)[-3000:])


@pytest.fixture(scope="module")
def ui(tuned):
    """``precision-tuner ui`` on the shared finished run: (base URL, printed links, run dir).
    It needs no browser: the test of the printed links runs without one."""
    run_dir = tuned[0]
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tuner", "ui", "--run-dir", str(run_dir), "--port", str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)  # its own process group: the server's workers die with it
    output: list[str] = []
    threading.Thread(target=lambda: output.extend(process.stdout), daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_http(base + "/", process, output)
        links = {}
        for line in "".join(output).splitlines():
            label, sep, url = line.strip().partition(": http")
            if sep:
                links[label] = "http" + url
        yield base, links, run_dir
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = _require_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(options=options, service=Service(chromedriver))
    try:
        yield driver
    finally:
        driver.quit()


def _wait_for_text(driver, texts: list[str]) -> str:
    """Wait until the page shows every one of ``texts``; return the page text."""
    from selenium.webdriver.support.ui import WebDriverWait

    def body(d):
        text = d.find_element("tag name", "body").text
        return text if all(t in text for t in texts) else False

    try:
        return WebDriverWait(driver, PAGE_TIMEOUT_S, poll_frequency=0.5).until(body)
    except Exception:  # noqa: BLE001 - Selenium's timeout or a page gone: both say the same
        shown = driver.find_element("tag name", "body").text
        missing = [t for t in texts if t not in shown]
        pytest.fail(f"the page at {driver.current_url} never showed {missing}; it showed:\n"
                    + shown[:3000])


def _close_side_panel(driver) -> None:
    """MLflow 3 opens an assistant panel beside the table; close it for a wider screenshot."""
    for button in driver.find_elements("xpath", "//button[@aria-label='Close']"):
        if button.is_displayed():
            button.click()
            time.sleep(1)  # let the table re-flow into the freed width
            return


def _screenshot(driver, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    assert driver.save_screenshot(str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, "blank screenshot?"
    if name in IN_THE_DOCS:  # replaced whole: the site build beside this never reads half
        staged = DOC_IMAGES / f".{name}.{os.getpid()}"
        staged.write_bytes(data)
        os.replace(staged, DOC_IMAGES / name)
    return path


def _runs(run_dir: Path):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments()
                     if e.name.startswith("precision-tuner/")]
    return client, client.search_runs([experiment.experiment_id])


def test_ui_prints_deep_links_to_trials_and_best_config(ui):
    _, links, run_dir = ui
    _, runs = _runs(run_dir)
    parent = next(r for r in runs if r.data.tags["precision_tuner.kind"] == "tuning_job")
    assert "remeasured_speedup_vs_float32" in links["trials, fastest first"]
    assert links["best config and plots"].endswith(f"/runs/{parent.info.run_id}/artifacts")


def test_trial_runs_are_listed_in_the_browser(ui, browser):
    base, links, run_dir = ui
    _, runs = _runs(run_dir)
    trial_names = [r.info.run_name for r in runs
                   if r.data.tags["precision_tuner.kind"] == "trial"]
    assert len(trial_names) == 6
    browser.get(links["trials, fastest first"])
    text = _wait_for_text(browser, trial_names + ["7 matching runs"])
    _close_side_panel(browser)
    # Sorted by the re-measured speedup, fastest first: the order on screen follows the metric,
    # and the trials that were not re-measured come after the ones that were.
    speedups = {r.info.run_name: r.data.metrics.get("remeasured_speedup_vs_float32",
                                                    float("-inf"))
                for r in runs if r.data.tags["precision_tuner.kind"] == "trial"}
    on_screen = sorted(trial_names, key=text.index)
    assert [speedups[n] for n in on_screen] == sorted(speedups.values(), reverse=True)
    _screenshot(browser, "mlflow_trials.png")
    assert "](../img/mlflow_trials.png)" in (ROOT / "docs/how-to/mlflow.md").read_text()


def test_best_config_artifact_is_listed_and_opens(ui, browser):
    import json

    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    _, links, run_dir = ui
    best = json.loads((run_dir / "best_precision.json").read_text())
    browser.get(links["best config and plots"])
    _wait_for_text(browser, ["best_precision.json", "summary.md", "plots"])
    _close_side_panel(browser)
    entry = WebDriverWait(browser, PAGE_TIMEOUT_S).until(
        expected_conditions.element_to_be_clickable(
            ("xpath", "//*[normalize-space(text())='best_precision.json']")))
    entry.click()
    _wait_for_text(browser, [f'"policy": "{best["policy"]}"', '"speedup_vs_float32"'])
    _screenshot(browser, "mlflow_best_config.png")
