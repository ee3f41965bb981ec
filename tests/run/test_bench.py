"""``precision-tuner bench``: float32 against a config in fresh processes, a speedup with its
interval; bad input refused in one line (exit 2) before any process starts."""

import json
import math
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, TASKS
from tuner.apply.config import PrecisionConfig
from tuner.judging.noise import SpeedupEstimate
from tuner.run.bench import _record, summary, verdict

TINY = str(TASKS / "tiny_mlp.py")
SUMMARY = re.compile(r"^speedup (\d+\.\d+)x \[(\d+\.\d+)-(\d+\.\d+)\] over (\d+) rounds "
                     r"\(95% interval\): (faster than float32|slower than float32|a tie)",
                     re.MULTILINE)
# What the summary line says for each verdict (group 5 of SUMMARY).
SAID = {"faster": "faster than float32", "slower": "slower than float32", "tie": "a tie"}


def cli(*args):
    return subprocess.run([sys.executable, "-m", "tuner", "bench", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


@pytest.fixture
def bf16(tmp_path):
    return str(PrecisionConfig(policy="mixed_bfloat16").save(tmp_path / "bf16.json"))


@pytest.mark.slow
def test_bench_times_float32_against_the_config_in_abba_rounds(tmp_path, bf16):
    out = tmp_path / "bench.json"
    done = cli(TINY, "--config", bf16, "--rounds", "2", "--steps", "8", "--warmup", "2",
               "--json", str(out))
    assert done.returncode == 0, done.stderr
    found = SUMMARY.search(done.stdout)
    assert found, done.stdout
    ratio, low, high = (float(found.group(i)) for i in (1, 2, 3))
    assert low <= ratio <= high and found.group(4) == "2"
    assert re.search(r"^\s+1\s+AB\s", done.stdout, re.MULTILINE)
    assert re.search(r"^\s+2\s+BA\s", done.stdout, re.MULTILINE)
    assert "bench round 1/2 (AB)" in done.stderr and "bench round 2/2 (BA)" in done.stderr

    record = json.loads(out.read_text())
    estimate = SpeedupEstimate.from_dict(record["speedup"])   # checks low <= ratio <= high
    assert estimate.rounds == 2 and math.isfinite(estimate.high)
    assert record["verdict"] == verdict(estimate)
    assert found.group(5) == SAID[record["verdict"]]   # the line says the record's verdict
    assert record["policies"] == {"float32": "float32", "config": "mixed_bfloat16"}
    assert [r["order"] for r in record["rounds"]] == ["AB", "BA"]
    for r in record["rounds"]:
        assert r["float32_ms"] > 0 and r["config_ms"] > 0
        assert r["ratio"] == pytest.approx(r["float32_ms"] / r["config_ms"])
        assert math.isfinite(r["float32_final_loss"]) and math.isfinite(r["config_final_loss"])
    # The speedup is the geometric mean of the rounds' ratios.
    mean = math.exp(sum(math.log(r["ratio"]) for r in record["rounds"]) / 2)
    assert estimate.ratio == pytest.approx(mean, rel=1e-3)
    assert record["steps"] == 8 and record["warmup"] == 2 and record["machine"]["device"]


@pytest.mark.slow
def test_a_failing_measurement_is_one_line(bf16):
    done = cli(str(TASKS / "broken_build.py"), "--config", bf16, "--rounds", "2")
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("precision-tuner")]
    assert len(lines) == 1, done.stderr
    assert "the float32 measurement of broken_build.py failed" in lines[0]
    assert "oops: this model cannot be built" in lines[0]



@pytest.mark.slow
def test_a_model_that_fails_under_the_config_gets_the_trials_reading(bf16):
    """The Keras guide's add_loss layer under mixed_bfloat16 fails as under ``model.fit``: the
    line names the layer whose 16-bit loss term is at fault and the fix, as a trial's does (a
    last line of stderr would be the middle of Keras's message)."""
    done = cli(str(ROOT / "tests" / "suites" / "zoo" / "add_loss.py"), "--config", bf16,
               "--rounds", "2", "--steps", "4")
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("precision-tuner")]
    assert len(lines) == 1, done.stderr
    assert "the config measurement of add_loss.py failed" in lines[0]
    assert "activity_regularization (its add_loss term is 16-bit" in lines[0]
    assert "fix: keep sequential/activity_regularization in float32" in lines[0]

@pytest.mark.parametrize("args, says", [
    (["missing_task.py", "--config", "{bf16}"], "task file not found"),
    ([TINY, "--config", "{bad}"], "cannot parse"),
    ([TINY, "--config", "{tmp}/absent.json"], "config file not found"),
    ([TINY, "--config", "{bf16}", "--steps", "0"], "--steps"),
    ([TINY, "--config", "{bf16}", "--rounds", "1"], "--rounds must be at least 2"),
    ([TINY], "--config"),
])
def test_bad_input_is_refused_in_one_line(tmp_path, bf16, args, says):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    args = [a.format(bf16=bf16, bad=bad, tmp=tmp_path) for a in args]
    done = cli(*args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("precision-tuner") and says in done.stderr
    assert "bench round" not in done.stderr   # refused before any measurement


def _measured(float32_ms: list[float], config_ms: list[float]) -> list[dict]:
    def side(ms, policy):
        return {"timed_steps_ms": [ms * 0.98, ms, ms * 1.02], "median_ms": ms,
                "final_loss": 0.5, "policy": policy, "outcome": "completed", "device": "CPU"}

    return [{"round": i + 1, "order": "AB" if i % 2 == 0 else "BA",
             "float32": side(a, "float32"), "config": side(b, "mixed_bfloat16")}
            for i, (a, b) in enumerate(zip(float32_ms, config_ms))]


@pytest.mark.parametrize("float32_ms, config_ms, expected", [
    ([10.0, 10.2, 9.9, 10.1], [5.0, 5.1, 5.0, 5.05], "faster"),
    ([10.0, 10.2, 9.9, 10.1], [20.0, 20.3, 19.8, 20.1], "slower"),
    ([10.0, 10.0, 10.0, 10.0], [8.0, 12.5, 8.0, 12.5], "tie"),
])
def test_the_verdict_follows_the_interval(tmp_path, float32_ms, config_ms, expected):
    """The verdict, and the summary line saying exactly that verdict.
    Mutation caught: the summary says "a tie" for a faster config (tuner/run/bench.py
    summary); and one that says "slower" for faster and the other way round."""
    config = PrecisionConfig(policy="mixed_bfloat16")
    record = _record(tmp_path / "t.py", tmp_path / "c.json", config,
                     _measured(float32_ms, config_ms), 3, 1, 0)
    estimate = SpeedupEstimate.from_dict(record["speedup"])
    assert record["verdict"] == expected
    assert (estimate.low <= 1.0 <= estimate.high) == (expected == "tie")
    line = summary(record)
    found = SUMMARY.search(line)
    assert found and found.group(5) == SAID[expected], line
    assert [r["ratio"] for r in record["rounds"]] == pytest.approx(
        [a / b for a, b in zip(float32_ms, config_ms)])
