"""Precision loss under a hand-written ``mixed_bfloat16`` config (the tuner keeps such layers in
float32; a config written by hand, or by another tool, does not): nothing is non-finite, no
layer is off by half its size, and the model learns less. Each case beside the same training
unguarded (the failure must show there) and in float32, asserting the outcome: within 1.5x
float32's validation loss, the layers at fault named in one event, the policy still mixed (not
the last resort).

- a head far from zero (tests/fixtures/tasks/kelvin_head.py: ~290 K, bfloat16's step 2) and two
  at once in dict outputs with Keras's automatic names elsewhere (station_heads.py: hPa and K);
- a residual stream carrying an offset (offset_stream.py: the stem and the ``Add`` layers round
  the corrections away, the norms and head show it) and the same written as a subclassed model
  whose blocks add with a raw ``h + z`` (offset_blocks.py: the blocks themselves and the
  model's own input cast are at fault, no layer inside them).
"""

from __future__ import annotations

import math

import pytest

from tests.apply.guard.test_repairs import ROOT, _fit, _task
from tuner import PrecisionConfig

pytestmark = pytest.mark.slow
EPOCHS = 20

CASES = {
    "kelvin_head": {"kelvin"},
    "station_heads": {"pressure", "dew_point"},
    "offset_stream": {"stem", "add_0", "add_1", "add_2"},
    "offset_blocks": {"regressor/dense", "regressor/offset_block", "regressor/offset_block_1"},
}


@pytest.fixture(scope="module", params=sorted(CASES))
def runs(request):
    task = _task(ROOT / "tests" / "fixtures" / "tasks" / f"{request.param}.py")
    config = PrecisionConfig("mixed_bfloat16")
    return request.param, {"float32": _fit(task, PrecisionConfig(), epochs=EPOCHS, guard=False),
                           "unguarded": _fit(task, config, epochs=EPOCHS, guard=False),
                           "guarded": _fit(task, config, epochs=EPOCHS, guard=True)}


def test_precision_loss_is_found_at_its_cause_and_the_policy_kept(runs):
    name, runs = runs
    float32 = runs["float32"][1][-1]
    unguarded = runs["unguarded"][1]
    _, guarded, watcher = runs["guarded"]
    assert all(math.isfinite(value) for value in unguarded)  # nothing non-finite ...
    assert unguarded[-1] > 3 * float32                      # ... and it learns far less
    assert guarded[-1] <= 1.5 * float32, (guarded[-1], float32)
    assert [event.kind for event in watcher.events] == ["precision_loss"]
    named = set(watcher.events[0].layers)
    assert CASES[name] <= named, named
    assert "last resort" not in watcher.events[0].action
    assert watcher.config.policy == "mixed_bfloat16"
    assert CASES[name] <= set(watcher.config.float32.layers)
    # the rest of the model stays 16-bit: the set found is small, not the whole model
    assert len(named) <= len(CASES[name]) + 1
