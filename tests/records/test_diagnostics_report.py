"""The diagnostics a person reads before the first trial (``console_lines``: one line per layer,
its worst finding and how many more, the features zero to float32 too left out) and the ones the
records keep (``conclusions``/``markdown``: every finding), on the real diagnostics of
tests/fixtures/tasks/raw_residual.py (issue 62: a residual regressor on raw readings of about 1000,
two inputs of about 1e-21)."""

import copy
import json
import re

import pytest

from tests.conftest import TASKS
from tuner.records.diagnostics_report import (
    conclusions,
    console_lines,
    describe_continuous,
    describe_negligible,
    markdown,
    print_table,
)

FIXTURE = TASKS / "raw_residual.diagnostics.json"
MORE = re.compile(r" \(and (\d+) more of its input features\)$")


@pytest.fixture
def residual():
    return json.loads(FIXTURE.read_text())


def _layer_of(line: str) -> str:
    return line.split(" (", 1)[0]


def _finding_lines(lines: list[str]) -> list[str]:
    """The lines about a layer's inputs (``LAYER (Class) receives ...``)."""
    return [line for line in lines if re.match(r"^\S+ \(\w+\) receives ", line)]


def test_the_console_has_one_line_per_layer_with_a_finding(residual):
    lines = console_lines(residual)
    layers = [_layer_of(line) for line in _finding_lines(lines)]
    expected = list(dict.fromkeys(e["layer"] for e in residual["continuous_inputs"]))
    assert layers == expected and len(expected) == 22   # stem, 10 blocks, 10 adds, out
    # Before: one line per recorded feature (69 lines, 66 of them features).
    assert len(conclusions(residual)) > 3 * len(lines)
    assert len(lines) == len(layers) + 4   # candidates, left out, loss scale, flushed


def test_each_layer_line_is_its_worst_finding_and_counts_the_rest(residual):
    lines = {_layer_of(line): line for line in _finding_lines(console_lines(residual))}
    stem = lines["stem"]
    # Not the tiny features (float16 erases them whole, the noisiest): the worst that matters.
    assert stem.startswith("stem (Dense) receives feature 2 (values 995.4..1005.4, spread 1.9): "
                           "bfloat16's step there is 4, 3 of 192 distinct values survive, so "
                           "a bfloat16 config must keep stem in float32")
    assert MORE.search(stem).group(1) == "5"   # the other 5 of its 6 readings
    for layer, line in lines.items():
        entries = [e for e in residual["continuous_inputs"] if e["layer"] == layer]
        worst = entries[0]
        assert line.startswith(describe_continuous(worst))
        assert int(MORE.search(line).group(1)) == worst["of_layer"] - 1
        # Erased in both dtypes where any of the layer's features is.
        assert len(worst["erased_in"]) == max(len(e["erased_in"]) for e in entries)


def test_features_zero_to_float32_too_are_left_out_of_the_console(residual):
    zero = residual["negligible_inputs"]
    assert {(e["layer"], e["feature"]) for e in zero} == {("stem", 6), ("stem", 7)}
    assert all(max(abs(e["min"]), abs(e["max"])) < 1e-20 for e in zero)
    lines = console_lines(residual)
    assert not any(re.search(r"(?<!\d)1 of \d+ distinct values survive", line)
                   or "e-21" in line for line in _finding_lines(lines))
    assert sum("e-21" in line for line in conclusions(residual)) == 2   # the records do
    assert [line for line in lines if line.startswith("left out:")] == [
        "left out: 2 input features that float16 rounds to 0 but that float32 drops too (at "
        "most 3.6e-21, next to values 2^24 times larger in the same input): stem (2)"]
    # Nor do they make stem a candidate or reach a trial's input-rounding check.
    assert not any(e["feature"] in (6, 7) for e in residual["continuous_inputs"]
                   if e["layer"] == "stem")


def test_the_records_keep_every_finding(residual):
    text = markdown(residual)
    for entry in residual["continuous_inputs"]:
        assert f"- {describe_continuous(entry)}\n" in text
    for entry in residual["negligible_inputs"]:
        assert f"- {describe_negligible(entry)}\n" in text
    assert "stem (Dense) receives feature 6 (values -2.8e-21..2.3e-21, spread 9.6e-22): float16 " \
           "rounds its 192 distinct values all to 0, but next to the 1.01e+03 its input also " \
           "carries it is zero to float32 too, so it keeps stem in no config's float32" in text
    # What the worker counted but kept only the worst 3 of: counted in the records too.
    assert "- stem: 3 more features like these" in text
    assert text.count("| Dense |") + text.count("| Add |") == len(residual["layers"])


def test_mlflow_gets_the_full_table(residual):
    from tuner.records.mlflow_records import Tracker

    class Client:
        def __init__(self):
            self.logged = {}

        def log_dict(self, run_id, data, name):
            self.logged[name] = data

        def log_text(self, run_id, text, name):
            self.logged[name] = text

        def set_tag(self, run_id, key, value):
            pass

    tracker = Tracker.__new__(Tracker)   # no store: only what log_diagnostics sends
    tracker.client, tracker.parent_id = Client(), "parent"
    tracker.log_diagnostics(residual)
    assert tracker.client.logged["diagnostics.json"] == residual
    assert tracker.client.logged["diagnostics.md"] == markdown(residual)


def test_an_integer_input_and_erased_features_of_one_layer_are_one_line(residual):
    diagnostics = copy.deepcopy(residual)
    diagnostics["integer_inputs"] = [{"layer": "block_0", "class": "Dense", "max": 4999.0}]
    lines = {_layer_of(line): line for line in _finding_lines(console_lines(diagnostics))}
    block = lines["block_0"]
    assert block.startswith("block_0 (Dense) receives integer-valued floats up to 4999")
    of_layer = next(e["of_layer"] for e in residual["continuous_inputs"]
                    if e["layer"] == "block_0")
    assert int(MORE.search(block).group(1)) == of_layer   # the integers, then its features
    assert len(lines) == 22


def test_a_layer_with_one_finding_says_no_more():
    entry = {"layer": "normalization", "class": "Normalization", "input": 0, "feature": 0,
             "min": -122.5, "max": -121.8, "spread": 0.21, "distinct": 192,
             "survive": {"bfloat16": 2, "float16": 150}, "step": {"bfloat16": 0.5,
                                                                  "float16": 0.0625},
             "noise": {"bfloat16": 0.7, "float16": 0.05}, "erased_in": ["bfloat16"],
             "of_layer": 1}
    diagnostics = {"candidates": ["normalization"], "integer_inputs": [],
                   "continuous_inputs": [entry], "negligible_inputs": [], "output_heads": [],
                   "layers": [], "gradient_abs_max": 1.0,
                   "loss_scale": {"initial_scale": 2.0**15, "exponent": 15,
                                  "lifts_p01_to_normal": True}}
    lines = console_lines(diagnostics)
    assert lines[1] == describe_continuous(entry)
    assert not any(line.startswith("left out") for line in lines)
    # Diagnostics written before `of_layer` (and `negligible_inputs`) read the same.
    del entry["of_layer"], diagnostics["negligible_inputs"]
    assert console_lines(diagnostics)[1] == describe_continuous(entry)


def test_diagnose_prints_the_console_lines_or_with_all_every_finding(residual):
    from rich.console import Console

    def printed(every_finding: bool) -> str:
        console = Console(record=True, width=400)
        print_table(residual, console, limit=None if every_finding else 25,
                    every_finding=every_finding)
        return console.export_text()

    short, everything = printed(False), printed(True)
    assert all(line in short for line in console_lines(residual))
    assert all(line in everything for line in conclusions(residual))
    assert "feature 6" not in short and "stem (Dense) receives feature 6" in everything
