import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TASKS = Path(__file__).parent / "tasks"
ROOT = Path(__file__).parent.parent


@pytest.fixture
def task_path():
    return lambda name: str(TASKS / f"{name}.py")
