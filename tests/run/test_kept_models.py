"""What the trials' worker keeps alive, and when it is replaced by a fresh one
(tuner.run.kept_models), through a scripted executor that keeps live models and reports the
room a real worker reports (tuner.worker.device.room)."""

from tests.support.scripted import Machine, ScriptedExecutor, scheduler_for, space_file
from tuner.apply.config import PrecisionConfig
from tuner.run.kept_models import ROOM_MARGIN, room_verdict, trial_need_bytes
from tuner.trial_types import FailureClass, TrialOutcome, TrialResult, TrialSpec

MiB = 2**20

SPACE = """
policies: [float32, mixed_bfloat16, mixed_float16]
loss_scale: {kinds: [dynamic]}
trials: 3
trial: {steps: 20, warmup_steps: 3}
"""


class KeepingExecutor(ScriptedExecutor):
    """A one-worker executor that keeps live models: what it holds, and each replacement."""

    keeps_live_models = True

    def __init__(self, machine: Machine, free_after, oom=lambda spec, fresh: False) -> None:
        super().__init__(machine)
        self.free_after = free_after   # (spec, live numbers) -> the free bytes it reports
        self.oom = oom                 # (spec, trials since the worker started) -> bool
        self.live: list[int] = []
        self.replaced_before: list[int] = []   # the trials submitted so far at each replacement
        self.since_fresh = 0

    def wait_any(self) -> list[TrialResult]:
        if not self._pending:
            return []
        spec = self._pending[0]
        if self.oom(spec, self.live):
            self._pending.pop(0)
            return [TrialResult.failed(spec.number, FailureClass.OUT_OF_MEMORY,
                                       "OOM when allocating tensor with shape[4096,4096]")]
        (result,) = super().wait_any()
        if spec.keep_live and result.outcome is TrialOutcome.COMPLETED:
            self.live.append(spec.number)
        result.peak_memory_bytes = 200 * MiB
        result.device_room = {"source": "gpu", "free_bytes": self.free_after(spec, self.live),
                              "held_bytes": 100 * MiB * len(self.live), "rss_bytes": 1}
        return [result]

    def replace_worker(self) -> dict:
        self.replaced_before.append(len(self.submitted))
        self.live = []
        return {"live": 0, "rss_before": 1500 * MiB, "rss_after": 700 * MiB, "replaced": True}

    def keep_live_only(self, specs: list[TrialSpec]) -> dict:
        self.live = [spec.number for spec in specs if spec.number in self.live]
        return {"live": len(self.live)}


def _tune(tmp_path, executor):
    scheduler = scheduler_for(space_file(tmp_path, SPACE), executor, tmp_path, trials=3,
                              exhaustive=True)
    scheduler.run()
    return scheduler


def _machine() -> Machine:
    return Machine(step_ms=lambda config: 20.0 if config.policy == "float32" else 10.0)


def test_room_verdict_holds_a_trial_to_the_room_left_and_to_worker_memory():
    result = TrialResult(0, TrialOutcome.COMPLETED, peak_memory_bytes=300 * MiB,
                         training_memory={"total_bytes": 200 * MiB})
    need = trial_need_bytes(result)
    assert need == 300 * MiB   # the larger of what was counted and what was seen
    room = {"source": "gpu", "free_bytes": 10_000 * MiB, "held_bytes": 500 * MiB}
    assert room_verdict(room, need, None) == (True, "")
    fits, why = room_verdict({**room, "free_bytes": 400 * MiB}, need, None)
    assert not fits and "400 MiB left on the gpu" in why and "300 MiB" in why
    # Within --worker-memory: 900 MiB less the 500 held leaves 400, under 1.5 x 300.
    fits, why = room_verdict(room, need, 900 * MiB)
    assert not fits and "400 MiB left of --worker-memory" in why
    assert room_verdict(room, need, 2000 * MiB)[0]
    assert ROOM_MARGIN * need <= 10_000 * MiB
    # Nothing known: keep as before.
    assert room_verdict(None, need, None) == (True, "")
    assert room_verdict({"free_bytes": None, "held_bytes": None}, need, 1000 * MiB)[0]


def test_float32s_model_goes_before_the_16_bit_trials_where_none_fits_beside_it(tmp_path):
    executor = KeepingExecutor(_machine(), free_after=lambda spec, live: 250 * MiB)
    scheduler = _tune(tmp_path, executor)
    first, *rest = [s for s in executor.submitted if s.number is not None][:3]
    assert first.number == 0 and first.keep_live
    assert executor.replaced_before[0] == 1, "replaced after float32, before trial #1"
    assert all(not s.keep_live for s in rest)
    (event, *_) = scheduler.records.released
    assert event["released"] == [0] and event["fresh_worker"]
    assert "before the 16-bit trials" in event["what"]
    assert "250 MiB left on the gpu" in event["why"]
    assert (event["rss_before"], event["rss_after"]) == (1500 * MiB, 700 * MiB)


def test_float32s_model_stays_where_a_16_bit_trial_fits_beside_it(tmp_path):
    executor = KeepingExecutor(_machine(), free_after=lambda spec, live: 50_000 * MiB)
    scheduler = _tune(tmp_path, executor)
    assert executor.replaced_before == [] and scheduler.records.released == []
    assert 0 in executor.live
    assert all(s.keep_live for s in executor.submitted[:3])   # float32 and the candidates


def test_a_trial_out_of_memory_beside_a_kept_model_runs_again_in_a_fresh_worker(tmp_path):
    """The fake allocator fails a 16-bit trial while float32's model is held, not after."""
    executor = KeepingExecutor(
        _machine(), free_after=lambda spec, live: 50_000 * MiB,
        oom=lambda spec, live: spec.number == 1 and 0 in live)
    scheduler = _tune(tmp_path, executor)
    numbers = [s.number for s in executor.submitted]
    assert numbers[:3] == [0, 1, 1], "trial #1 ran again at once"
    assert executor.replaced_before == [2]
    row = next(r for r in scheduler.rows if r.number == 1)
    assert row.result.outcome is TrialOutcome.COMPLETED and row.judgement.stable
    (event,) = scheduler.records.released
    assert event["released"] == [0] and "ran out of memory" in event["why"]
    assert len(scheduler.rows) == 3   # the retry spent no trial of the budget


def test_a_trial_out_of_memory_twice_is_judged_as_it_failed(tmp_path):
    executor = KeepingExecutor(_machine(), free_after=lambda spec, live: 50_000 * MiB,
                               oom=lambda spec, live: spec.number == 2)
    scheduler = _tune(tmp_path, executor)
    assert [s.number for s in executor.submitted].count(2) == 2
    row = next(r for r in scheduler.rows if r.number == 2)
    assert row.result.failure_class is FailureClass.OUT_OF_MEMORY and not row.judgement.stable


def test_the_baseline_is_not_kept_where_nothing_would_time_it_again(tmp_path):
    executor = ScriptedExecutor(_machine())   # keeps_live_models False: Ray with several
    _tune(tmp_path, executor)
    assert not any(s.keep_live for s in executor.submitted)
    assert PrecisionConfig.from_dict(executor.submitted[0].config).policy == "float32"
