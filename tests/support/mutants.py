"""Mutations of the code that a named test must catch: ``python -m tests.support.mutants [NAME..]``.

Each mutant is one textual change to one module (it must match exactly once), made in a copy of
the repository, and the tests that are meant to catch it, run there; a mutant survives when
they all pass. A test that claims to guard a rule names its mutant in its docstring; this runs
those claims (`make test-mutants`; minutes, not part of `make test`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str          # the module changed, from the repository root
    old: str           # text found exactly once in it
    new: str
    tests: tuple[str, ...]   # node ids (or files) of which at least one must fail


MUTANTS = [
    Mutant("saved dtype repair a no-op", "tuner/apply/dtype_origins.py",
           '        kwargs["dtype"] = policy\n', "        pass\n",
           ("tests/apply/loaded/test_loaded_dtypes.py::"
            "test_a_loaded_model_computes_like_its_twin_built_in_code",
            "tests/apply/loaded/test_loaded_dtypes.py::"
            "test_a_saved_mixed_models_float32_softmax_stays_float32")),
    Mutant("a trial never fails as precision_unreached", "tuner/worker/trial/trial.py",
           "    return reached_none(reach)\n", "    return False\n",
           ("tests/apply/loaded/test_loaded_trials.py::"
            "test_layers_built_with_float32_in_code_fail_as_unreached",)),
    Mutant("the loss gap counts at its first check, not the second in a row",
           "tuner/apply/guard/precision_loss.py",
           "self._running = InARow(2)", "self._running = InARow(1)",
           ("tests/apply/guard/test_check_rules.py::"
            "test_the_loss_gap_counts_at_the_second_check_running",)),
    Mutant("a disagreeing layer counts at its first check, not the second in a row",
           "tuner/apply/guard/detectors.py",
           "self._suspects = InARow(2)", "self._suspects = InARow(1)",
           ("tests/apply/guard/test_check_rules.py::"
            "test_a_layer_disagreeing_counts_at_the_second_check_in_a_row",)),
    Mutant("out of repairs stops under a mixed policy too", "tuner/apply/guard/rungs.py",
           '        trip.end, trip.why = End.DONE, "out of repairs"\n'
           "        if not ladder.training.last_resort_left():\n",
           '        trip.end, trip.why = End.DONE, "out of repairs"\n'
           "        if True:\n",
           ("tests/apply/guard/test_last_resort.py",)),
    Mutant("the guard's rungs answer every kind, a detector's own too",
           "tuner/apply/guard/ladder.py",
           "if kind not in ANSWERS.get(type(rung), {kind}):", "if kind not in {kind}:",
           ("tests/apply/guard/test_extending.py::"
            "test_a_kind_of_your_own_spends_no_repair_and_meets_no_last_resort",
            "tests/apply/guard/test_extending.py::test_a_trip_no_rung_ends_changes_no_weight")),
    Mutant("train no longer refuses an unsupported Keras", "tuner/cli/app.py",
           '_TRAINING_COMMANDS = {"tune", "train", "bench"',
           '_TRAINING_COMMANDS = {"tune", "bench"',
           ("tests/project/test_dependency_ranges.py::"
            "test_every_command_that_trains_or_serves_refuses_an_unsupported_keras",)),
    Mutant("the declared ranges read as empty", "tuner/dependency_versions.py",
           "        if bounds:  # the floor first", "        if not bounds:  # the floor first",
           ("tests/project/test_dependency_ranges.py::"
            "test_the_installed_metadata_puts_a_keras_below_the_floor_outside",)),
    Mutant("a scale failure remembered by its kind, not by the optimizers that failed",
           "tuner/apply/guard/trip.py",
           "        return tuple(sorted(w.name for w in self.watches)) if self.of_the_scale "
           "else (self.kind,)",
           "        return (self.kind,)",
           ("tests/apply/guard/test_ladder.py",)),
    Mutant("a failure left as it is no longer tolerates each of its optimizers",
           "tuner/apply/guard/rungs.py",
           "        ladder.tolerated.update((watch.name,) for watch in trip.watches)",
           "        pass",
           ("tests/apply/guard/test_ladder.py",)),
    Mutant("the model figure's spread read from the peak's figure",
           "tuner/judging/ceiling_limit.py",
           '        spread = float((figure.get("spread") or {}).get(dtype, 0.0))',
           '        spread = float((peak.get("spread") or {}).get(dtype, 0.0))',
           ("tests/run/test_ceiling_answer.py::test_each_figure_is_read_with_its_own_spread",)),
    Mutant("the at-scale rule holds every run to the default gain", "tuner/run/plan.py",
           "            else ruled_out(ceiling, self.min_gain)",
           "            else ruled_out(ceiling, DEFAULT_MIN_GAIN)",
           ("tests/run/test_ceiling_answer.py::"
            "test_the_rule_holds_a_dtype_to_the_runs_own_min_gain",)),
    Mutant("the early no-finalist-can-clear stop ends memory and balanced rounds too",
           "tuner/run/remeasure.py",
           "        if self.by_speed and rounds < policy.min_rounds:",
           "        if rounds < policy.min_rounds:",
           ("tests/run/test_decisions.py::"
            "test_a_memory_pick_slower_than_float32_still_gets_its_rounds",)),
    Mutant("below_float32 ignores whether a finalist was timed alone", "tuner/run/finalists.py",
           "        if not row.result.timed_steps_ms or not row.result.exclusive_timing:",
           "        if not row.result.timed_steps_ms:",
           ("tests/run/test_decisions.py::"
            "test_a_finalist_timed_beside_another_is_not_dropped_on_its_search_figure",)),
    Mutant("the in-step metric reset never marks the model", "tuner/worker/trial/steps.py",
           "    setattr(model, _RESETS_IN_STEP, True)\n", "    pass\n",
           ("tests/worker/test_trial.py::"
            "test_only_a_step_made_without_the_reset_is_reset_eagerly",)),
    Mutant("the unit tier's import hook appended, never firing", "tests/conftest.py",
           "        sys.meta_path.insert(0, finder)", "        sys.meta_path.append(finder)",
           ("tests/project/test_tiers.py::"
            "test_a_unit_test_importing_keras_is_stopped_and_named",)),
    Mutant("one trip stops after the first layer whose backward pass overflows",
           "tuner/apply/guard/rungs.py",
           "            found = again\n",
           "            found = again\n            break\n",
           ("tests/apply/guard/test_one_trip.py::"
            "test_one_trip_moves_every_failing_layer_and_nothing_else",)),
    Mutant("the test that runs an excerpted example renamed", "tests/api/test_python_api.py",
           "def test_a_model_defined_in_main_tunes_and_its_pick_applies(",
           "def test_a_model_defined_in_main_tunes(",
           ("tests/project/test_docs.py::"
            "test_every_tested_example_names_a_test_that_exists_and_runs_it",)),
    Mutant("bench says a tie for a faster config", "tuner/run/bench.py",
           '"faster": "faster than float32",',
           '"faster": "a tie with float32 (the interval holds 1.00: within noise)",',
           ("tests/run/test_bench.py::test_the_verdict_follows_the_interval",)),
    Mutant("bench says slower for faster and faster for slower", "tuner/run/bench.py",
           '"faster": "faster than float32",\n              "slower": "slower than float32",',
           '"faster": "slower than float32",\n              "slower": "faster than float32",',
           ("tests/run/test_bench.py::test_the_verdict_follows_the_interval",)),
    Mutant("the last resort's step not traced anew", "tuner/apply/guard/training.py",
           "        cause.whole_model_float32(self.model)\n        self.retrace()\n",
           "        cause.whole_model_float32(self.model)\n",
           ("tests/apply/guard/test_last_resort.py::"
            "test_after_the_last_resort_the_training_computes_in_float32_and_its_loss_is_finite",)),
    Mutant("train makes its run directory before reading the config",
           "tuner/run/guarded_training.py",
           "    PrecisionConfig.load(config_path)  # refused here, in one line, before any process "
           "starts\n    run_dir.mkdir(parents=True, exist_ok=True)\n",
           "    run_dir.mkdir(parents=True, exist_ok=True)\n"
           "    PrecisionConfig.load(config_path)\n",
           ("tests/run/test_guarded_training.py::"
            "test_a_missing_config_is_refused_before_the_run_directory_is_made",)),
    Mutant("the job records ray while running on the local worker", "tuner/api/job.py",
           "        local.chosen = choice.to_dict()\n",
           '        local.chosen = {**choice.to_dict(), "kind": "ray"}\n',
           ("tests/api/test_executor_said.py::"
            "test_the_local_choice_runs_the_local_worker_and_records_local",)),
    Mutant("the executor choice ignored: Ray for every tune", "tuner/api/job.py",
           '    if choice.kind == "local":\n        local = LocalProcessExecutor()\n',
           '    if False:\n        local = LocalProcessExecutor()\n',
           ("tests/api/test_executor_said.py::"
            "test_the_local_choice_runs_the_local_worker_and_records_local",)),
]


def _copy(into: Path) -> None:
    ignore = shutil.ignore_patterns(".venv*", ".git", "runs", "site", "dist", "test-results",
                                    "__pycache__", ".pytest_cache", "*.db", "mlruns")
    shutil.copytree(ROOT, into, ignore=ignore, dirs_exist_ok=True)


def run(mutant: Mutant, workers: int) -> bool:
    """True when the mutant was caught (a test failed)."""
    with tempfile.TemporaryDirectory(prefix="mutant-") as folder:
        copy = Path(folder) / "repo"
        _copy(copy)
        module = copy / mutant.path
        text = module.read_text()
        if text.count(mutant.old) != 1:
            raise SystemExit(f"mutant {mutant.name!r}: its text occurs {text.count(mutant.old)} "
                             f"times in {mutant.path}, not once: update tests/support/mutants.py")
        module.write_text(text.replace(mutant.old, mutant.new))
        command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                   *mutant.tests]
        if workers > 1:
            command += ["-n", str(workers)]
        env = {**os.environ, "PYTHONPATH": str(copy)}
        completed = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True)
        tail = (completed.stdout.strip().splitlines() or [""])[-1]
        caught = completed.returncode == 1
        if completed.returncode not in (0, 1):
            print(completed.stdout[-2000:] + completed.stderr[-2000:])
            raise SystemExit(f"mutant {mutant.name!r}: pytest could not run (exit "
                             f"{completed.returncode})")
        print(f"{'caught  ' if caught else 'SURVIVED'} {mutant.name}: {tail}", flush=True)
        return caught


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.mutants",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all); "
                        "substrings of their names")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.names or any(n in m.name for n in args.names)]
    if args.list:
        for mutant in chosen:
            print(f"{mutant.name} ({mutant.path}): {', '.join(mutant.tests)}")
        return 0
    survived = [mutant.name for mutant in chosen if not run(mutant, args.workers)]
    if survived:
        print(f"{len(survived)} of {len(chosen)} mutants survived: {', '.join(survived)}")
        return 1
    print(f"all {len(chosen)} mutants caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
