"""The small commands: export, ui, diagnose, spaces, train, bench (``tune``, the main job, is
tuner.api.job)."""

from __future__ import annotations

import sys
from pathlib import Path

from tuner.apply.config import PrecisionConfig
from tuner.cli.jobs import ui_links
from tuner.errors import UsageError
from tuner.execution.local import LocalProcessExecutor
from tuner.records.diagnostics_report import print_table
from tuner.records.mlflow_stores import default_tracking_uri, ui_paths
from tuner.records.run_store import RunStore
from tuner.run.bench import bench as run_bench
from tuner.run.bench import report
from tuner.run.guarded_training import train as train_guarded
from tuner.run.task_file import check_task_file, require_tensorflow
from tuner.search.space_files import builtin_space_names, load_space


def export(args) -> int:
    source = args.run_dir / "best_precision.json"
    if not args.run_dir.is_dir():
        raise UsageError(f"run directory not found: {str(args.run_dir)!r}. Pass the --run-dir of "
                         "a finished `precision-tuner tune`.")
    if not source.is_file():
        raise UsageError(f"{str(args.run_dir)!r} holds no best_precision.json: the tuning job did "
                         "not finish. Re-run `precision-tuner tune`.")
    config = PrecisionConfig.load(source)
    text = config.to_yaml() if args.format == "yaml" else config.to_json()
    if args.out is None:
        sys.stdout.write(text)
        return 0
    if args.out.exists() and not args.force:
        raise UsageError(f"--out {str(args.out)!r} already exists. Pass --force to overwrite it.")
    target = args.out
    if args.format == "yaml" and target.suffix.lower() not in (".yaml", ".yml"):
        target.write_text(text)  # honour --format over the file name
    else:
        config.save(target, overwrite=True)
    print(f"wrote {target}")
    return 0


def ui(args) -> int:
    import os
    import subprocess


    if args.run_dir is None:  # a service's UI (--service or PRECISION_TUNER_SERVICE)

        return ui_links(args)
    store = args.run_dir / "mlflow.db"
    if not store.is_file():
        raise UsageError(f"no MLflow store in {str(args.run_dir)!r} (expected mlflow.db). Pass "
                         "the --run-dir of a `precision-tuner tune` run.")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"precision-tuner: warning: binding the UI to {args.host} exposes every run to "
              "the network; there is no authentication.", file=sys.stderr)
    uri = default_tracking_uri(args.run_dir)
    base = f"http://{args.host}:{args.port}"
    print(f"MLflow UI on {base} (Ctrl-C to stop)")
    for label, path in _ui_links(args.run_dir, uri).items():
        print(f"  {label}: {base}/{path}")
    # The UI's background job workers serve MLflow's GenAI features, which a tuning run never
    # uses: seven idle processes less.
    env = {**os.environ}
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
               "--host", args.host, "--port", str(args.port)]
    return subprocess.call(command, env=env)


def _ui_links(run_dir: Path, uri: str) -> dict[str, str]:
    try:
        run = RunStore(run_dir).read_run()
    except Exception:  # noqa: BLE001 - an unreadable run.json must not keep the UI from starting
        return {}
    return ui_paths(uri, run.get("experiment", ""), run.get("parent_run_id"))


def diagnose(args) -> int:
    import json

    from rich.console import Console

    task_path = check_task_file(args.task)
    require_tensorflow()
    if args.json is not None and args.json.exists():
        raise UsageError(f"--json {str(args.json)!r} already exists. Remove it or choose another "
                         "file.")
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    with LocalProcessExecutor() as executor:
        executor.probe(str(task_path), args.steps)
        diagnostics = executor.diagnose(str(task_path), args.steps)
    print_table(diagnostics, console, limit=None if args.all else 25, every_finding=args.all)
    if args.json is not None:
        args.json.write_text(json.dumps(diagnostics, indent=1) + "\n")
        console.print(f"written to {args.json}")
    return 0


def spaces(args) -> int:
    for name in builtin_space_names():
        space = load_space(name)
        print(f"{name:10} {space.size():5} configs, {space.trials:3} trials  "
              f"{' '.join(space.description.split())}")
    return 0


def train(args) -> int:
    if not Path(args.task).is_file():
        raise UsageError(f"task file not found: {args.task!r}. Pass the path of a task file.")
    require_tensorflow()
    record = train_guarded(Path(args.task), args.config, args.epochs, args.against,
                           args.run_dir, args.tracking_uri, guard=not args.no_guard)
    return 1 if record.get("verdict", {}).get("worse") else 0


def bench(args) -> int:
    task_path = check_task_file(args.task)
    require_tensorflow()
    record = run_bench(task_path, args.config, rounds=args.rounds, steps=args.steps,
                       warmup=args.warmup, json_path=args.json)
    print(report(record))
    if args.json is not None:
        print(f"written to {args.json}")
    return 0
