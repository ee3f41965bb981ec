"""The guard's parts as plain rules: the search for the smallest set of layers (halving and
elimination on a predicate), the spacing of checks by their cost, the loss gap either way
round, the failure kinds as a documented enum, and the typed event."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tuner.apply.guard import failures, float32_set
from tuner.apply.guard.events import GuardEvent
from tuner.apply.guard.failures import Failure
from tuner.apply.guard.float32_set import _Search
from tuner.apply.guard.precision_loss import BatchLoss
from tuner.apply.guard.watch import Spacing


class _Predicate(_Search):
    """The search's minimiser on a predicate over names, no model."""

    def __init__(self, restores):
        self._restores, self.tries = restores, 0

    def restores(self, layers):
        self.tries += 1
        return self._restores(set(layers))


LAYERS = [f"layer_{index}" for index in range(16)]


@pytest.mark.parametrize("needed", [{"layer_3"}, {"layer_0", "layer_15"},
                                    {"layer_2", "layer_5", "layer_9", "layer_10", "layer_14"}])
def test_the_search_finds_exactly_the_layers_that_are_all_needed(needed):
    search = _Predicate(lambda chosen: needed <= chosen)
    assert set(search.minimise(list(LAYERS))) == needed
    assert search.tries <= 2 * 4 + len(LAYERS)


def test_the_search_is_one_minimal_where_either_of_two_layers_will_do():
    search = _Predicate(lambda chosen: "layer_4" in chosen or "layer_11" in chosen)
    assert len(search.minimise(list(LAYERS))) == 1


def test_the_search_stops_at_its_budget_with_a_set_that_still_restores(monkeypatch):
    monkeypatch.setattr(float32_set, "MAX_TRIES", 5)
    needed = {"layer_1", "layer_6", "layer_12"}
    search = _Predicate(lambda chosen: needed <= chosen)
    found = set(search.minimise(list(LAYERS)))
    assert needed <= found and search.tries <= 5


def test_the_loss_gap_counts_either_way_round():
    assert BatchLoss(4.0, 1.0).apart == 4.0 and BatchLoss(0.25, 1.0).apart == 4.0
    assert BatchLoss(float("nan"), 1.0).apart == math.inf
    assert BatchLoss(1.0, 1.0).apart == 1.0 and BatchLoss(0.0, 0.0).apart == 1.0


def test_checks_are_spaced_by_their_own_cost_but_not_by_the_first_one():
    spacing = Spacing(every=100, budget=0.02)
    assert spacing.due(step=5, at_epoch_end=True, now=10.0)
    spacing.ran(5, started=10.0, ended=12.0)            # the first: 2 s of tracing, not counted
    assert spacing.due(step=10, at_epoch_end=True, now=12.1)
    spacing.ran(10, started=12.1, ended=12.2)           # 0.1 s: the next one 5 s later
    assert not spacing.due(step=20, at_epoch_end=True, now=15.0)
    assert spacing.due(step=20, at_epoch_end=True, now=17.3)
    assert not spacing.due(step=50, at_epoch_end=False, now=30.0)   # mid-epoch: every 100
    assert spacing.due(step=110, at_epoch_end=False, now=30.0)
    assert not Spacing(every=None, budget=0.02).due(step=5, at_epoch_end=True, now=1.0)


def test_every_failure_kind_is_documented_and_classified():
    for kind in [*Failure, *failures.Notice]:
        assert f"``{kind.value}``" in failures.__doc__, kind
    assert {kind for kind in Failure if kind.of_the_scale} == {
        Failure.SCALE_AT_FLOOR, Failure.SCALE_COLLAPSED, Failure.SKIPPED_UPDATES}
    assert Failure.PRECISION_LOSS.of_precision and not Failure.LOSS_SPIKE.of_precision
    assert Failure("precision_loss") == "precision_loss"   # events stay plain strings


def test_an_event_is_typed_in_memory_and_plain_data_on_disk():
    event = GuardEvent(2, 40, Failure.PRECISION_LOSS, "seen", ["stem", "add_0"], "why", "moved")
    assert event.layers == ("stem", "add_0") and type(event.kind) is str
    data = json.loads(json.dumps(event.to_dict()))
    assert data == {"epoch": 2, "step": 40, "kind": "precision_loss", "seen": "seen",
                    "layers": ["stem", "add_0"], "cause": "why", "action": "moved"}
    assert GuardEvent(**data) == event
    assert event.line().startswith("precision guard: epoch 2 step 40: seen [precision_loss]")
    # every guard page kind is the enum's: the page and the module say the same
    page = (Path(__file__).resolve().parents[3] / "docs" / "how-to" / "guard.md").read_text()
    assert all(f"`{kind.value}`" in page for kind in [*Failure, *failures.Notice])
