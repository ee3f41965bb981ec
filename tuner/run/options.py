"""What a tune job is asked for: ``TuneOptions``, frozen and typed, the job's only input.

``tuner.tune()`` builds it from its keywords, ``precision-tuner tune`` from its command line
(tuner.cli.tune_parser) and ``submit`` from its own (to refuse before sending). Each field after
the task is one option: its type and default are the field's, its help, --help section and check
an ``Option`` in its annotation (``Annotated[int | None, Option(...)]``), so name, type,
default, check, help and one-line error have one definition. The constructor holds every value
to its check (tuner.run.option_checks), the command line's parsed values and a Python caller's
alike: ``trials=0`` is refused with the line ``precision-tuner tune --trials 0`` prints.
``tuner.run.plan.resolve`` turns the options into the run's plan; every check across options is
here: the options that cannot go together (``check_combinations``), and the rules a resumed run
holds them to (``check_resume``: a resumed run keeps its settings, and an option that disagrees
is refused in one line).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from tuner.errors import UsageError
from tuner.judging.decision import DEFAULT_MIN_GAIN
from tuner.judging.noise import RUN_DRIFT_SD
from tuner.judging.objective import DEFAULT_MEMORY_SLACK, Objective
from tuner.judging.sizing import DEFAULT_CAP_S
from tuner.records.run_store import BEST_FILE
from tuner.run.confirmation_run import DEFAULT_SECONDS as CONFIRM_SECONDS
from tuner.run.option_checks import (
    Check,
    gain,
    gibibytes,
    option_fields,
    positive_int,
    ratio,
    seconds,
    workers_count,
)
from tuner.search.space_files import looks_like_path

DEFAULT_FINALISTS = 3
DEFAULT_TIME_LIMIT = 900

# --help's sections, in order
TRY, JUDGE, GOES, RUNS = ("what to try", "how the pick is made and checked", "where things go",
                          "where trials run")


@dataclass(frozen=True)
class Option:
    """A tune option's help (argparse's ``%(default)s`` allowed), its --help section, the check
    its value passes (``tuner.run.option_checks.Check``; by default the annotation's type), its
    metavar, whether ``submit`` forwards it to a service's job (the run directory, tracking,
    Ray address and output are the service's business), whether a resumed run keeps it (a
    value that differs from the run's is refused: ``check_resume``), and, where a Python
    caller's default differs from the command line's (the field's), how ``help(tuner.tune)``
    names it."""

    help: str
    group: str
    check: Check | None = None
    metavar: str | None = None
    forwarded: bool = True
    kept: bool = False
    python_default: str = ""

    def __repr__(self) -> str:  # a field's repr shows its value, not its help
        return "Option()"


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    """What the user asked a tune job for; ``None`` means "not given" (a default, the space's,
    or the resumed run's). The run directory has no default here: whoever builds the options
    names it (``runs/TASK-TIMESTAMP``, ``default_run_dir``), so that nothing downstream
    fills it in."""

    task: Path
    # -- what to try
    space: Annotated[str | None, Option(
        "search space: a built-in name (quick, default) or a YAML path [default: quick]",
        TRY, kept=True)] = None
    trials: Annotated[int | None, Option(
        "number of trials, baseline included [default: the space's `trials`]",
        TRY, positive_int, kept=True)] = None
    exhaustive: Annotated[bool, Option(
        "try every config of the space instead of a budget of trials (the grid; its size is "
        "printed first). Not with --trials", TRY)] = False
    steps: Annotated[int | None, Option(
        "training steps per trial, fixed [default: sized by the float32 baseline: at least the "
        "space's trial.steps, more for a fast model until its step time and loss decrease are "
        "precise enough]", TRY, positive_int, kept=True)] = None
    trial_seconds: Annotated[float | None, Option(   # the sizing cap (tuner.judging.sizing)
        "how long the float32 baseline may train while it sizes the trials (a slow model gets "
        f"fewer steps than trial.steps) [default: {DEFAULT_CAP_S:g}]", TRY, seconds,
        "S")] = None
    seed: Annotated[int | None, Option(
        "seed for weights, data order and Optuna [default: 0]", TRY, kept=True)] = None
    tolerance: Annotated[float | None, Option(
        "share of float32's loss decrease a trial must reach to count as stable [default: the "
        "space's, 0.9]", TRY, ratio, kept=True)] = None
    keep_slow_policies: Annotated[bool, Option(
        "also try policies whose 16-bit dtype runs a dense layer's training step at under half "
        "float32's speed on the trial device (float16 on most CPUs), or cannot beat float32 at "
        "the model's largest layer (bfloat16 on CPUs without AVX512-BF16 or AMX); by default "
        "they are skipped, with a line saying so. No trial is then stopped early for being "
        "slow: the kept policies are there to be judged on stability", TRY)] = False
    strict_float32: Annotated[bool, Option(
        "hold float32 to IEEE float32 in every trial: TF32 off for its matrix products and "
        "convolutions (TensorFlow runs them in TF32 by default on NVIDIA Ampere and newer "
        "GPUs, which makes the float32 baseline faster and less precise); no effect elsewhere. "
        "A resumed run keeps its own setting", TRY)] = False
    # -- how the pick is made and checked
    finalists: Annotated[int, Option(
        "stable candidates re-measured back to back before naming the winner [default: "
        "%(default)s]", JUDGE, positive_int)] = DEFAULT_FINALISTS
    min_gain: Annotated[float, Option(
        "a 16-bit config is picked only when the lower end of its speedup interval beats "
        "float32 by this much; otherwise float32 (a tie goes to the simpler config) [default: "
        "%(default)s, i.e. 3%%]", JUDGE, gain, "FRACTION")] = DEFAULT_MIN_GAIN
    run_drift: Annotated[float | None, Option(   # kept where the run recorded one
        "the run-to-run allowance: the standard deviation of a speedup's log between tunes, "
        "beyond what one tune's rounds show; every speedup over float32 (the bar above and the "
        "exported interval) is widened by it. 0: this run's rounds alone [default: "
        f"{RUN_DRIFT_SD:g}, measured on a 2-core CPU by benchmarks/run_to_run.py]", JUDGE, gain,
        "SD", kept=True)] = None
    objective: Annotated[Objective | None, Option(
        "what best means: speed (the fastest config whose gain is real), memory (the least "
        "training memory), or balanced (from the Pareto front of step time and memory, the "
        "fastest within --memory-slack of the smallest) [default: speed]", JUDGE,
        kept=True)] = None
    memory_slack: Annotated[float | None, Option(
        "balanced: how far above the front's smallest memory the pick may be [default: "
        f"{DEFAULT_MEMORY_SLACK:g}, i.e. {DEFAULT_MEMORY_SLACK:.0%}%]", JUDGE, gain,
        "FRACTION", kept=True)] = None
    confirm_steps: Annotated[int | None, Option(   # tuner.run.confirmation_run
        "how many more steps the pick and float32 train, side by side, before the pick is "
        "exported (validated at 4 points) [default: 10x a trial's steps, capped by "
        "--confirm-seconds]", JUDGE, positive_int, "N")] = None
    confirm_seconds: Annotated[float | None, Option(
        "the most training time the default confirmation may take, both models together "
        f"[default: {CONFIRM_SECONDS:g}]", JUDGE, seconds, "S")] = None
    no_confirm: Annotated[bool, Option(
        "export the pick without the confirmation run (the provenance says so)", JUDGE)] = False
    # -- where things go
    run_dir: Annotated[Path, Option(
        "where the Optuna and MLflow stores go [default: runs/TASK-TIMESTAMP]", GOES,
        forwarded=False)]
    out: Annotated[Path, Option(
        "where to write the best config (.json or .yaml) [default: %(default)s]", GOES,
        forwarded=False, python_default=f"RUN_DIR/{BEST_FILE}, always rewritten")] = \
        Path(BEST_FILE)
    force: Annotated[bool, Option(
        "overwrite --out without keeping the earlier export (by default it is kept beside it, "
        "named after the time it was written)", GOES, forwarded=False)] = False
    resume: Annotated[bool, Option(
        "continue the interrupted run in --run-dir (also automatic when --run-dir holds an "
        "unfinished run)", GOES, forwarded=False)] = False
    tracking_uri: Annotated[str | None, Option(
        "MLflow tracking server URI [default: SQLite in the run directory]", GOES,
        forwarded=False)] = None
    # -- where trials run
    time_limit: Annotated[int, Option(   # seconds a trial may take before it is killed
        "per-trial time limit; a trial past it is killed [default: %(default)s]", RUNS,
        positive_int, "SECONDS")] = DEFAULT_TIME_LIMIT
    workers: Annotated[int | Literal["auto"], Option(
        "trials side by side, each worker a TensorFlow process with its share of the CPUs "
        "(more than one runs on Ray); auto: one per visible GPU, one without GPUs; the "
        "winner is always re-timed alone [default: %(default)s]", RUNS,
        workers_count)] = "auto"
    ray_address: Annotated[str | None, Option(
        "attach to an existing Ray cluster (auto, HOST:PORT or ray://...) instead of starting "
        "a local one", RUNS, metavar="ADDRESS", forwarded=False)] = None
    executor: Annotated[Literal["auto", "ray", "local"], Option(
        "auto: the local worker process for one trial at a time on this machine, Ray for "
        "several workers, --ray-address or a service job; ray: Ray actors always; local: "
        "one plain subprocess, no Ray [default: %(default)s]", RUNS,
        forwarded=False)] = "auto"
    worker_memory: Annotated[float | None, Option(
        "the memory, in GiB, a trial's worker may count on (on a shared GPU or host): float32's "
        "model stays alive for the re-measurement only while a 16-bit trial fits beside it "
        "within this and what the device has free (it does not cap TensorFlow's allocations) "
        "[default: what the device has free]", RUNS, gibibytes, "GIB")] = None

    def __post_init__(self) -> None:
        """Every value held to its option's check, in its type (``"memory"`` becomes
        ``Objective.MEMORY``, a str path a ``Path``); a bad one is refused in one line."""
        object.__setattr__(self, "task", Path(self.task))
        for option in option_fields(TuneOptions):
            object.__setattr__(self, option.name, option.checked(getattr(self, option.name)))


def default_run_dir(task_stem: str) -> Path:
    """runs/TASK-TIMESTAMP: where a run goes when no run directory is given."""
    return Path("runs") / f"{task_stem}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def space_ref(space: str) -> str:
    """How run.json names a space: a built-in name, or the YAML file's absolute path."""
    if looks_like_path(space):
        return str(Path(space).resolve())
    return space


def check_combinations(options: TuneOptions) -> None:
    """The options that cannot go together, each refused in one line: every check across
    options but a resume's (``check_resume``) is here."""
    if options.exhaustive and options.trials:
        raise UsageError(f"--exhaustive tries every config of the space; it cannot be combined "
                         f"with --trials {options.trials}. Drop one of the two.")
    if options.steps is not None and options.trial_seconds is not None:
        raise UsageError(f"--trial-seconds caps how long trials are sized; --steps fixes their "
                         f"count instead. Received: --steps {options.steps} --trial-seconds "
                         f"{options.trial_seconds:g}. Drop one of the two.")
    if options.no_confirm and (options.confirm_steps is not None
                               or options.confirm_seconds is not None):
        raise UsageError("--no-confirm skips the confirmation; --confirm-steps and "
                         "--confirm-seconds size it. Received both. Drop one of the two.")


def check_resume(previous: dict[str, Any], options: TuneOptions) -> None:
    """On resume, what the user passes must agree with what the run was started with."""
    run_dir, task_path = options.run_dir, options.task.resolve()
    if previous.get("status") == "finished":
        raise UsageError(f"the run in {str(run_dir)!r} already finished. Export its result "
                         f"(precision-tuner export --run-dir {run_dir}) or choose a new "
                         "--run-dir.")
    if previous["task"] != str(task_path):
        raise UsageError(f"--run-dir {str(run_dir)!r} belongs to task {previous['task']!r}, "
                         f"not {str(task_path)!r}. Pass that task, or a new --run-dir.")
    if options.exhaustive and not previous.get("exhaustive"):
        raise UsageError(f"--exhaustive: the run in {str(run_dir)!r} was started with a "
                         "budget of trials; a resumed run keeps its settings. Drop --exhaustive, "
                         "or start a new --run-dir.")
    given = {kept.name: getattr(options, kept.name) for kept in option_fields(TuneOptions)
             if kept.option.kept and (kept.name != "run_drift" or "run_drift" in previous)}
    if options.space:
        given["space"] = space_ref(options.space)
    if options.trial_seconds is not None:
        raise UsageError(f"--trial-seconds {options.trial_seconds:g}: a resumed run keeps how "
                         "its trials were sized. Drop --trial-seconds, or start a new --run-dir.")
    for key, value in given.items():
        flag = "--" + key.replace("_", "-")
        if value is not None and value != previous.get(key):
            raise UsageError(f"{flag} {value} differs from the interrupted run's "
                             f"{previous.get(key)!r}; a resumed run keeps its settings. Drop "
                             f"{flag}, or start a new --run-dir.")
