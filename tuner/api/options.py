"""The options of ``precision-tuner tune``, in four groups (what to try, how the pick is made and
checked, where things go, where trials run); ``submit`` forwards the same ones."""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner.api.arguments import gain, positive_int, ratio, seconds
from tuner.errors import UsageError
from tuner.judging.noise import RUN_DRIFT_SD
from tuner.run.flags import Flags


def add_tune_parser(commands) -> argparse.ArgumentParser:
    tune = commands.add_parser("tune", help="tune a task file (the main job)",
                               description="Run trial trainings of TASK.py and write the fastest "
                                           "stable precision config.")
    _what_to_try(tune.add_argument_group('what to try'))
    _how_to_judge(tune.add_argument_group('how the pick is made and checked'))
    _where_it_goes(tune.add_argument_group('where things go'))
    _where_it_runs(tune.add_argument_group('where trials run'))
    return tune


def _what_to_try(group) -> None:
    group.add_argument("task", metavar="TASK.py", help="task file: defines build_model(), "
                      "train_data() and LOSS (docs/how-to/task-files.md)")
    group.add_argument("--space",
                      help="search space: a built-in name (quick, default) or a YAML path "
                           "[default: quick]")
    group.add_argument("--trials", type=positive_int, help="number of trials, baseline "
                      "included [default: the space's `trials`]")
    group.add_argument("--exhaustive", action="store_true",
                      help="try every config of the space instead of a budget of trials (the "
                           "grid; its size is printed first). Not with --trials")
    group.add_argument("--steps", type=positive_int,
                      help="training steps per trial, fixed [default: sized by the float32 "
                           "baseline: at least the space's trial.steps, more for a fast model "
                           "until its step time and loss decrease are precise enough]")
    group.add_argument("--trial-seconds", type=seconds, metavar="S",
                      help="how long the float32 baseline may train while it sizes the "
                           "trials (a slow model gets fewer steps than trial.steps) [default: "
                           "2.5]")
    group.add_argument("--seed", type=int, help="seed for weights, data order and Optuna "
                      "[default: 0]")
    group.add_argument("--tolerance", type=ratio, help="share of float32's loss decrease a "
                      "trial must reach to count as stable [default: the space's, 0.9]")
    group.add_argument("--keep-slow-policies", action="store_true",
                      help="also try policies whose 16-bit dtype runs a dense layer's training "
                           "step at under half float32's speed on the trial device (float16 on "
                           "most CPUs); by default they are skipped, with a line saying so. "
                           "No trial is then stopped early for being slow: the kept policies "
                           "are there to be judged on stability")


def _how_to_judge(group) -> None:
    group.add_argument("--finalists", type=positive_int, default=3, help="stable candidates "
                      "re-measured back to back before naming the winner [default: %(default)s]")
    group.add_argument("--min-gain", type=gain, default=0.03, metavar="FRACTION",
                      help="a 16-bit config is picked only when the lower end of its speedup "
                           "interval beats float32 by this much; otherwise float32 (a tie goes "
                           "to the simpler config) [default: %(default)s, i.e. 3%%]")
    group.add_argument("--run-drift", type=gain, default=None, metavar="SD",
                      help="the run-to-run allowance: the standard deviation of a speedup's "
                           "log between tunes, beyond what one tune's rounds show; every "
                           "speedup over float32 (the bar above and the exported interval) is "
                           "widened by it. 0: this run's rounds alone [default: "
                           f"{RUN_DRIFT_SD:g}, measured on a 2-core CPU by "
                           "benchmarks/run_to_run.py]")
    group.add_argument("--objective", choices=("speed", "memory", "balanced"), default=None,
                      help="what best means: speed (the fastest config whose gain is real), "
                           "memory (the least training memory), or balanced (from the Pareto "
                           "front of step time and memory, the fastest within --memory-slack "
                           "of the smallest) [default: speed]")
    group.add_argument("--memory-slack", type=gain, default=None, metavar="FRACTION",
                      help="balanced: how far above the front's smallest memory the pick may "
                           "be [default: 0.1, i.e. 10%%]")
    group.add_argument("--confirm-steps", type=positive_int, metavar="N",
                      help="how many more steps the pick and float32 train, side by side, "
                           "before the pick is exported (validated at 4 points) [default: 10x "
                           "a trial's steps, capped by --confirm-seconds]")
    group.add_argument("--confirm-seconds", type=seconds, metavar="S",
                      help="the most training time the default confirmation may take, both "
                           "models together [default: 20]")
    group.add_argument("--no-confirm", action="store_true",
                      help="export the pick without the confirmation run (the provenance says "
                           "so)")


def _where_it_goes(group) -> None:
    group.add_argument("--run-dir", type=Path, help="where the Optuna and MLflow stores go "
                      "[default: runs/TASK-TIMESTAMP]")
    group.add_argument("--out", type=Path, default=Path("best_precision.json"),
                      help="where to write the best config (.json or .yaml) [default: %(default)s]")
    group.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    group.add_argument("--resume", action="store_true",
                      help="continue the interrupted run in --run-dir (also automatic when "
                           "--run-dir holds an unfinished run)")
    group.add_argument("--tracking-uri", help="MLflow tracking server URI [default: SQLite in "
                      "the run directory]")


def _where_it_runs(group) -> None:
    group.add_argument("--time-limit", type=positive_int, default=900, metavar="SECONDS",
                      help="per-trial time limit; a trial past it is killed [default: "
                           "%(default)s]")
    group.add_argument("--workers", type=positive_int, default=1,
                      help="trials run side by side on Ray (each worker a TensorFlow process); "
                           "the winner is always re-timed alone [default: %(default)s]")
    group.add_argument("--ray-address", metavar="ADDRESS",
                      help="attach to an existing Ray cluster (auto, HOST:PORT or ray://...) "
                           "instead of starting a local one")
    group.add_argument("--executor", choices=("ray", "local"), default="ray",
                      help="ray: trials on Ray actors; local: one plain subprocess, no Ray "
                           "[default: %(default)s]")


class _RaisingParser(argparse.ArgumentParser):
    """The tune parser for Python callers: a bad value raises UsageError with argparse's line
    (the CLI prints the same line and exits 2)."""

    def error(self, message: str):
        raise UsageError(f"{message}. See help(tuner.tune) or `precision-tuner tune --help`")


def _tune_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    return add_tune_parser(parser.add_subparsers(parser_class=_RaisingParser))


def tune_keywords(tune: argparse.ArgumentParser | None = None) -> dict[str, argparse.Action]:
    """Every option of ``tune`` by its keyword name (``--min-gain`` is ``min_gain``)."""
    tune = tune or _tune_parser()
    return {action.dest: action for action in tune._actions
            if action.option_strings and action.dest != "help"}


def parse_tune_keywords(task: str, options: dict) -> argparse.Namespace:
    """The Namespace ``precision-tuner tune TASK ...`` would give for these keyword arguments:
    the CLI's own parser checks every value, so both refuse a bad one with the same line."""
    tune = _tune_parser()
    actions = tune_keywords(tune)
    argv = [str(task)]
    for name, value in options.items():
        action = actions.get(name)
        if action is None:
            raise UsageError(f"tune() got an unknown keyword argument {name!r}. Choose from: "
                             f"{', '.join(sorted(actions))}")
        if value is None:
            continue
        if isinstance(action, argparse._StoreTrueAction):
            if not isinstance(value, bool):
                raise UsageError(f"tune(): {name} must be True or False. Received: "
                                 f"{name}={value!r}")
            argv += [action.option_strings[0]] if value else []
        else:
            argv += [action.option_strings[0], str(value)]
    return tune.parse_args(argv)


def flags_from(args, task_path: Path) -> Flags:
    """The ``Flags`` of parsed tune options (``add_tune_parser``'s; ``submit`` has the same)."""
    return Flags(task_path=task_path, run_dir=args.run_dir, space=args.space, trials=args.trials,
                 steps=args.steps, seed=args.seed, tolerance=args.tolerance,
                 exhaustive=args.exhaustive, tracking_uri=args.tracking_uri,
                 finalists=args.finalists, trial_time_limit_s=float(args.time_limit),
                 min_gain=args.min_gain, run_drift=args.run_drift,
                 keep_slow_policies=args.keep_slow_policies,
                 objective=args.objective, memory_slack=args.memory_slack,
                 trial_seconds=args.trial_seconds, confirm_steps=args.confirm_steps,
                 confirm_seconds=args.confirm_seconds, no_confirm=args.no_confirm)
