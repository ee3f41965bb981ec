"""What a ``precision-tuner tune`` running as a service job knows about itself.

``precision-tuner submit`` starts ``tune`` as a Ray job and hands it, through the job's
environment variables, the job id, who submitted it and the tune flags it was given. ``tune``
puts them on its MLflow parent run (so the MLflow UI shows what the Ray dashboard shows) and
on its run.json. Outside a service job none of these variables is set and nothing changes.
"""

from __future__ import annotations

import json
import os

JOB_ID_ENV = "PRECISION_TUNER_JOB_ID"
SUBMITTER_ENV = "PRECISION_TUNER_SUBMITTED_BY"
FLAGS_ENV = "PRECISION_TUNER_FLAGS"
RESUMES_ENV = "PRECISION_TUNER_RESUMES"          # the job id a resubmission continues
WORKER_CPUS_ENV = "PRECISION_TUNER_WORKER_CPUS"   # CPUs per screening worker on the cluster

TAG_PREFIX = "precision_tuner."
JOB_ID_TAG = TAG_PREFIX + "job_id"
JOB_IDS_TAG = TAG_PREFIX + "job_ids"              # every job that worked on this run, in order
PHASE_TAG = TAG_PREFIX + "phase"                  # what the job is doing now (e.g. waiting)


def job_id() -> str | None:
    """The Ray job id of this service job; None for a plain ``tune``."""
    return os.environ.get(JOB_ID_ENV) or None


def worker_cpus() -> int | None:
    """CPUs each screening worker takes on the shared cluster (None: the executor's default)."""
    text = os.environ.get(WORKER_CPUS_ENV)
    return int(text) if text and text.isdigit() and int(text) > 0 else None


def parent_tags(previous_job_ids: str | None = None) -> dict[str, str]:
    """Tags for the MLflow parent run: job id, submitter, flags (empty outside a job)."""
    current = job_id()
    if current is None:
        return {}
    ids = [i for i in (previous_job_ids or "").split(",") if i]
    if current not in ids:
        ids.append(current)
    tags = {JOB_ID_TAG: current, JOB_IDS_TAG: ",".join(ids),
            TAG_PREFIX + "submitted_by": os.environ.get(SUBMITTER_ENV, "-"),
            TAG_PREFIX + "flags": " ".join(json.loads(os.environ.get(FLAGS_ENV, "[]"))) or "-"}
    if os.environ.get(RESUMES_ENV):
        tags[TAG_PREFIX + "resumes"] = os.environ[RESUMES_ENV]
    return tags
