"""What the service's server and its clients share: the names in Ray's job store and the
environment, and the connection to Ray's job server (``client_for``; tuner.service.job_server on the
submit path). Both sides import this; neither imports the other."""

from __future__ import annotations

from tuner.errors import UsageError, first_line

SERVICE_ENV = "PRECISION_TUNER_SERVICE"
TOKEN_ENV = "PRECISION_TUNER_TOKEN"
JOB_KIND = "job"
MLFLOW_USER = "precision-tuner"
RECORD_JOB = "precision-tuner-service"   # the Ray job whose metadata describes the service
# The spare drivers' sockets (tuner.cli.spare), in DIR/drivers/: PID.starting while importing,
# PID.ready once listening, PID.claimed once a job's entrypoint (tuner.cli.handoff) took it;
# PID.own marks a job that found no spare ready and runs as its own process PID.
DRIVERS = "drivers"
SPARES = 2                                # spare drivers kept ready
READY, CLAIMED, STARTING, OWN = ".ready", ".claimed", ".starting", ".own"


def live_markers(folder, suffix: str, remove_dead: bool = False) -> int:
    """How many ``PID{suffix}`` files in ``folder`` (a Path) name a live process; those of
    ended ones removed when ``remove_dead``."""
    import os

    live = 0
    for marker in folder.glob(f"*{suffix}"):
        try:
            os.kill(int(marker.stem), 0)
        except (ProcessLookupError, ValueError):
            if remove_dead:
                marker.unlink(missing_ok=True)
            continue
        except PermissionError:                # alive, another user's
            pass
        live += 1
    return live


class _NeverRaised(Exception):
    """Stands for an exception the installed library cannot raise."""


def client_for(address: str, token: str | None):
    """A ``JobSubmissionClient`` for the service, with the bearer token when there is one."""
    import logging

    from ray.job_submission import JobSubmissionClient

    try:
        from ray.exceptions import AuthenticationError
    except ImportError:   # Ray before 2.52: no token authentication, nor its error
        AuthenticationError = _NeverRaised

    for name in ("ray", "ray.dashboard.modules.dashboard_sdk",
                 "ray._private.runtime_env.packaging"):
        logging.getLogger(name).setLevel(logging.WARNING)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        return JobSubmissionClient(address, headers=headers)
    except AuthenticationError as exc:
        raise UsageError(refused_message(address, first_line(exc, 80), token)) from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise UsageError(unreachable_message(address, first_line(exc))) from None


def unreachable_message(address: str, why: str) -> str:
    return (f"cannot reach the service at --service {address}: {why}. Start it "
            "(`precision-tuner service start`) or fix the address.")


def refused_message(address: str, why: str, token: str | None) -> str:
    refused = "the token was not accepted" if token else "it requires authentication"
    return (f"the service at --service {address} refused the request: {refused} "
            f"({why[:80]}). Set {TOKEN_ENV} to the service's token, or pass "
            "--token-file DIR/auth_token")
