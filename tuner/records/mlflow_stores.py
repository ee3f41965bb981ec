"""Where MLflow's records live: the default SQLite store in the run directory, stores staged
before a run directory exists (``StagedStores``), a URI without its credentials
(``redact_uri``), and the UI's pages for a run (``ui_paths``)."""

from __future__ import annotations

import logging
import urllib.parse
from pathlib import Path

from tuner.machine import cache_dir
from tuner.records.mlflow_text import SUMMARY_TABLE


def default_tracking_uri(run_dir: Path) -> str:
    return f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"


class StagedStores:
    """Empty Optuna and MLflow SQLite stores, created in a thread while the job starts up.

    Creating them (importing MLflow and Optuna, migrating each database's schema) took 3 s of
    a 30 s job on this project's machine, and nothing else waits on it. They are made in a
    temporary folder, because nothing may be written to the run directory before the task is
    checked, and moved there (``move_into``) once it is. Only for a new run; with a tracking
    server (``mlflow=False``: a service job) only Optuna's store, MLflow being imported
    meanwhile. A failure here only costs that time: the job creates them itself.

    An empty store is the same for every run of one MLflow (or Optuna) version, so the first
    one made is kept as a template in the machine's cache (``tuner.machine.cache_dir``, by
    version) and later runs copy it: MLflow's schema migrations alone took 2.3 s of the thread
    here, a copy 0.04 s. A copy is opened as the job will open it before it is used; one its
    version cannot read is made afresh (and kept in its place). The template's only record,
    MLflow's "Default" experiment, names the folder it was first made from; no run uses it.
    """

    def __init__(self, mlflow: bool = True) -> None:
        import tempfile
        import threading

        self.names = ("mlflow.db", "optuna.db") if mlflow else ("optuna.db",)
        self.folder = Path(tempfile.mkdtemp(prefix="precision-tuner-stores-"))
        self._thread = threading.Thread(target=self._create, daemon=True)
        self._thread.start()

    def _create(self) -> None:
        try:
            import optuna

            if "mlflow.db" in self.names:
                import mlflow
                from mlflow import MlflowClient

                for name in ("mlflow", "alembic"):
                    logging.getLogger(name).setLevel(logging.WARNING)
                self._made("mlflow.db", f"mlflow-{mlflow.__version__}.db",
                           lambda path: MlflowClient(f"sqlite:///{path}").search_experiments())
            self._made("optuna.db", f"optuna-{optuna.__version__}.db",
                       lambda path: optuna.storages.RDBStorage(f"sqlite:///{path}"))
        except Exception:  # noqa: BLE001 - the job creates its stores itself then
            for name in self.names:
                (self.folder / name).unlink(missing_ok=True)

    def _made(self, name: str, template_name: str, open_store) -> None:
        """``name`` in the staging folder: a copy of the template, opened by ``open_store``,
        or made by ``open_store`` and then kept as the template."""
        import os
        import shutil

        target, template = self.folder / name, cache_dir() / "stores" / template_name
        try:
            shutil.copyfile(template, target)
            open_store(target)
            return
        except Exception:  # noqa: BLE001 - no template, or one this version cannot read
            target.unlink(missing_ok=True)
        open_store(target)
        try:
            template.parent.mkdir(parents=True, exist_ok=True)
            temporary = template.with_name(f".{template.name}.{os.getpid()}")
            shutil.copyfile(target, temporary)
            os.replace(temporary, template)   # whole, for a job that copies it meanwhile
        except OSError:
            pass

    def move_into(self, run_dir: Path) -> None:
        """Wait for the stores and move them into ``run_dir`` (a new run's, still empty)."""
        import shutil

        self._thread.join()
        run_dir.mkdir(parents=True, exist_ok=True)
        if all((self.folder / name).exists() for name in self.names) and \
                not any((run_dir / name).exists() for name in self.names):
            for name in self.names:
                shutil.move(str(self.folder / name), str(run_dir / name))
        self.discard()

    def discard(self) -> None:
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


def redact_uri(uri: str) -> str:
    """Hide credentials (``user:password@``) in a tracking URI before printing or logging it."""
    parts = urllib.parse.urlsplit(uri)
    if not (parts.username or parts.password):
        return uri
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"***@{host}"))


# Fastest first by the re-measured speedup, the figure the pick is decided on (a search run's
# own ``speedup_vs_float32`` is one unpaired run: a config it flatters would sit on top). Only
# float32 and the finalists carry it; MLflow lists the runs without it after them. Sorting
# also lists the trials flat; ``workflowType`` opens MLflow's model-training side bar (without
# it MLflow 3 shows its GenAI one).
RANKED_BY = "remeasured_speedup_vs_float32"
TRIALS_QUERY = (f"orderByKey=metrics.%60{RANKED_BY}%60&orderByAsc=false"
                "&workflowType=machine_learning")


def ui_paths(tracking_uri: str, experiment_name: str,
             parent_run_id: str | None) -> dict[str, str]:
    """Deep links (relative to the UI's address) to a run's trials and its best config.

    The trials link sorts by ``RANKED_BY``, which also lists the child runs flat instead of
    folded under the tuning job. Empty when the experiment is not in the store.
    """
    from mlflow import MlflowClient

    experiment = MlflowClient(tracking_uri).get_experiment_by_name(experiment_name)
    if experiment is None:
        return {}
    runs = f"#/experiments/{experiment.experiment_id}/runs"
    links = {"trials, fastest first": f"{runs}?{TRIALS_QUERY}"}
    if parent_run_id:
        links["summary table"] = f"{runs}/{parent_run_id}/artifacts/{SUMMARY_TABLE}"
        links["best config and plots"] = f"{runs}/{parent_run_id}/artifacts"
    return links
