"""``precision-tuner service start|stop|status``: what the user sees (tuner.service.server acts)."""

from __future__ import annotations

import argparse
import time

from tuner.service import server as service
from tuner.service.client import Service
from tuner.service.contract import JOB_KIND, client_for
from tuner.service.limits import ServiceLimits
from tuner.service.warm_side import pool_line, spares_line


def run(args) -> int:
    return {"start": _start, "stop": _stop, "status": _status}[args.service_action](args)


def _start(args) -> int:
    began = time.perf_counter()
    info, started = service.start(args.dir, host=args.host, ray_port=args.ray_port,
                                  dashboard_port=args.dashboard_port,
                                  mlflow_port=args.mlflow_port, num_cpus=args.num_cpus,
                                  auth=True if args.auth else None,
                                  warm_workers=args.warm_workers,
                                  limits={"max_running": args.max_running,
                                          "max_job_mib": args.max_job_mib,
                                          "max_queued_per_user": args.max_queued_per_user})
    token = service.token_path(args.dir.resolve()) if info.auth else None
    if not started:
        print(f"precision-tuner service: already running in {info.dir} (started "
              f"{info.started_at}); nothing changed")
    else:
        print(f"precision-tuner service: started in {time.perf_counter() - began:.1f} s")
    for line in service.describe(info, token):
        print(line)
    print(limits_line(info))
    if started and info.pool is not None:
        print(pool_line(info.pool))
        print(spares_line(info))
    if started:
        _close_orphans(info, token)
    return 0


def _close_orphans(info, token_file) -> None:
    """Jobs that died with the last cluster: their MLflow runs closed (tuner.service.client)."""
    try:
        service = Service(argparse.Namespace(service=info.job_server, token_file=token_file))
        for line in service.close_orphans():
            print(f"  {line}")
    except Exception as exc:  # noqa: BLE001 - the service is up; `jobs` retries this
        print(f"  could not check for jobs left RUNNING in MLflow ({type(exc).__name__}); "
              "`precision-tuner jobs` closes them")


def _stop(args) -> int:
    info = service.read_info(args.dir.resolve())
    if info is None or not (service.alive(info.ray_pid) or service.alive(info.mlflow_pid)):
        print(f"precision-tuner service: not running in {args.dir}")
        if info is not None:
            service.stop(args.dir)  # leftovers of a half-dead service
        return 0
    service.stop(args.dir)
    print(f"precision-tuner service: stopped (Ray head and MLflow server in {info.dir}); jobs "
          "still running were stopped first, their finished trials kept: the next `service "
          "start` queues them again, with the jobs still queued, in their order")
    return 0


def limits_line(info) -> str:
    limits = ServiceLimits.of(info.limits or {})
    return (f"  jobs at once: {limits.turns} (the rest wait queued, in the order they came); "
            f"a job up to {limits.max_job_mib} MiB; up to {limits.max_queued_per_user} "
            "queued a submitter")


def _status(args) -> int:
    info = service.read_info(args.dir.resolve())
    if not service.running(info):
        print(f"precision-tuner service: not running in {args.dir}")
        return 3
    print(f"precision-tuner service: running in {info.dir} since {info.started_at}")
    for line in service.describe(info, service.token_path(args.dir.resolve())
                                 if info.auth else None)[:4]:
        print(line)
    try:
        token = service.token_path(args.dir.resolve()).read_text().strip() if info.auth \
            else None
        jobs = [j for j in client_for(info.job_server, token).list_jobs()
                if (j.metadata or {}).get("precision_tuner") == JOB_KIND]
        counts: dict[str, int] = {}
        for job in jobs:
            state = "QUEUED" if job.status.value == "PENDING" else job.status.value
            counts[state] = counts.get(state, 0) + 1
        print("  jobs: " + (", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
                            or "none yet"))
    except Exception as exc:  # noqa: BLE001 - status still says what it knows
        print(f"  jobs: cannot list them ({type(exc).__name__})")
    print(limits_line(info))
    for line in service.pool_status(info):
        print(line)
    print(spares_line(info))
    return 0
