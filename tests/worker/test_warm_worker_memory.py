"""A warm worker serves job after job: after ``forget`` it holds no job's data.

Each job below is a task of its own (its own file, its own arrays: 24 MB of training batches per
job) run the way a service job runs on a warm worker: a trial that keeps its model live, the
re-measurement's runs of that live model, then ``TrialWorker.forget``. The worker runs in a
fresh process (this one's memory holds every earlier test's), which reports its resident memory
after each job. Before the stacked-batch cache (``tuner.worker.trial.steps``) was cleared
between jobs, each job left its batches and their stacked copy behind: 40-50 MB a job.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tuner.apply.config import PrecisionConfig
from tuner.trial_types import TrialSpec

JOBS = 5
STEPS = 12
# One job's batches: STEPS batches of 64 rows of 8192 float32 features (~25 MB), and the
# stacked copy of them that a live model's runs train on: what a leak would leave per job.
FEATURES = 8192
BATCH = 64
JOB_BYTES = 2 * STEPS * BATCH * FEATURES * 4

TASK = '''
import keras
import numpy as np

BATCH_SIZE = {batch}
LOSS = "mse"


def build_model():
    inputs = keras.Input(shape=({features},))
    return keras.Model(inputs, keras.layers.Dense(1)(inputs))


def train_data():
    rng = np.random.default_rng({seed})
    x = rng.normal(size=({rows}, {features})).astype("float32")
    return x, x[:, :1] * 0.5
'''

PROGRAM = '''
import json, resource, sys

from tuner.worker.process.trial_worker import TrialWorker


def rss_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


worker = TrialWorker(threads=1, use_gpu=False, node="test")
after = []
for spec in json.loads(sys.argv[1]):
    worker.run(spec)                          # the job's trial, its model kept live
    for _ in range(2):
        worker.run_live(spec)                 # the re-measurement's runs of it
    worker.forget()                           # the job is over
    after.append(rss_bytes())
print(json.dumps(after))
'''


@pytest.mark.slow  # the warm worker runs in a process of its own, five jobs
def test_a_warm_worker_holds_no_job_after_the_job(tmp_path):
    specs = []
    for job in range(JOBS):
        path = tmp_path / f"job{job}.py"
        path.write_text(TASK.format(batch=BATCH, features=FEATURES, seed=job,
                                    rows=BATCH * STEPS))
        specs.append(TrialSpec(job, str(path), PrecisionConfig().to_dict(), STEPS, 2,
                               keep_live=True).to_dict())
    root = Path(__file__).resolve().parents[2]
    completed = subprocess.run([sys.executable, "-c", textwrap.dedent(PROGRAM),
                                json.dumps(specs)], capture_output=True, text=True,
                               cwd=root, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    after = json.loads(completed.stdout.strip().splitlines()[-1])
    # The first jobs warm the allocator and TensorFlow's caches; from the second on, memory
    # stays flat: growth over three more jobs stays under half of what one job's data weighs.
    growth = after[-1] - after[1]
    assert growth < JOB_BYTES / 2, (
        f"resident memory after each job (MB): {[round(b / 2**20) for b in after]}; grew "
        f"{growth / 2**20:.0f} MB over {JOBS - 2} jobs (one job's batches: "
        f"{JOB_BYTES / 2**20:.0f} MB)")
