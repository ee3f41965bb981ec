"""``precision-tuner tune``'s parser, built from ``TuneOptions`` (tuner.run.options): the task
file, then one flag per option, by --help section, with the option's type, default, check,
metavar and help (``submit`` reuses the flags it forwards); and back from the parsed command
line to ``TuneOptions`` (``options_from``), the job's input, by the same table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner.run.option_checks import option_fields
from tuner.run.options import GOES, JUDGE, RUNS, TRY, TuneOptions, default_run_dir

TASK_HELP = "task file: defines build_model(), train_data() and LOSS (docs/how-to/task-files.md)"


def add_tune_parser(commands) -> argparse.ArgumentParser:
    """``precision-tuner tune``: the task file, then every option of ``TuneOptions`` by
    section."""
    parser = commands.add_parser("tune", help="tune a task file (the main job)",
                                 description="Run trial trainings of TASK.py and write the "
                                             "fastest stable precision config.")
    groups = {name: parser.add_argument_group(name) for name in (TRY, JUDGE, GOES, RUNS)}
    groups[TRY].add_argument("task", metavar="TASK.py", help=TASK_HELP)
    for option in option_fields(TuneOptions):
        group = groups[option.option.group]
        if option.switch:
            group.add_argument(option.flag, action="store_true", help=option.option.help)
            continue
        group.add_argument(option.flag, type=option.parse, choices=option.choices,
                           default=option.default, metavar=option.option.metavar,
                           help=option.option.help)
    return parser


def options_from(args: argparse.Namespace, run_dir: Path | None = None) -> TuneOptions:
    """The ``TuneOptions`` of a parsed command line (``tune``'s; ``submit``'s has the options
    it forwards), each by its name; the run directory ``run_dir``, else ``--run-dir``, else
    ``runs/TASK-TIMESTAMP``."""
    given = vars(args)
    values = {option.name: given[option.name] for option in option_fields(TuneOptions)
              if option.name in given}
    values["run_dir"] = run_dir or values.get("run_dir") \
        or default_run_dir(Path(args.task).resolve().stem)
    return TuneOptions(task=Path(args.task), **values)
