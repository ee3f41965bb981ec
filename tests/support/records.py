"""Reading a run's trial records in the end-to-end tests, and holding every rejected trial's
reason to the standard users read it by: it names the layer or the cause, never only an
exception's first line ("InvalidArgumentError: Graph execution error:")."""

import json
import re
from pathlib import Path

# Failure classes whose reason states the cause itself (and, where one exists, the layer); a
# task_error is the task's own code raising, or breaking the task-file contract.
CAUSES = {"task_error", "dtype_mismatch", "integer_rounding", "input_rounding",
          "index_out_of_range", "numeric_check",
          "out_of_memory", "timeout", "worker_crashed", "precision_unreached"}
_BARE_PREAMBLE = re.compile(r"Graph execution error|Exception encountered when calling")


def reason_problem(trial: dict) -> str | None:
    """What is wrong with a failed trial's reason, or None when it explains the failure."""
    if trial["verdict"] != "failed":
        return None
    reason, kind = trial["reason"], trial["result"]["failure_class"]
    if not reason or _BARE_PREAMBLE.search(reason):
        return f"trial #{trial['number']}: reason is only a preamble: {reason!r}"
    if kind not in CAUSES and " layer " not in f" {reason} ":
        return (f"trial #{trial['number']}: a {kind} failure whose reason names neither its "
                f"layer nor its cause: {reason!r}")
    return None


def assert_reasons_explain(trials: list[dict]) -> list[dict]:
    problems = [problem for problem in map(reason_problem, trials) if problem]
    assert not problems, "\n".join(problems)
    return trials


def read_trials(run_dir: Path, name: str = "trials.json") -> list[dict]:
    """The run's trials (trials.json, or trials.jsonl line by line), reasons checked."""
    text = (Path(run_dir) / name).read_text()
    trials = json.loads(text) if name.endswith(".json") else \
        [json.loads(line) for line in text.splitlines() if line.strip()]
    return assert_reasons_explain(trials)
