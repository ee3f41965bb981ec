"""Which trials' models the worker keeps alive, and when the worker lets everything go (the
driver's side of tuner.worker.trial.live).

The re-measurement times float32 and the finalists round after round; a model kept alive in
the trials' worker spares it a build and a trace per config. A kept model also holds memory the
16-bit trials after it need: on a GPU, a float32 model that fills most of the device would
leave them out of memory, and the tuner would answer float32 for a model 16-bit lets fit.

Dropping a model does not give its memory back, measured on TensorFlow 2.21 (CPU): a process
that trained a model in a ``tf.function`` keeps its weights' and optimizer's memory after every
Python reference is gone (a 25M-parameter model: +295 MB resident per model trained, with or
without ``clear_session``, not reused by the next one). Only a fresh process starts empty. So:

- Models are kept only where the re-measurement runs in the trials' own worker
  (``Executor.keeps_live_models``): anywhere else nothing would time them again.
- After every trial its worker says what it has left (``TrialResult.device_room``: with what it
  keeps held, and no more than ``--worker-memory`` allows). Where that is under ``ROOM_MARGIN``
  times what float32's trial needed (no 16-bit trial of the model needs more:
  ``room_verdict``), the next trial gets a fresh worker (``Executor.replace_worker``): float32's
  kept model goes before the 16-bit trials start, and the re-measurement builds it again.
- The finalists-to-be are kept too with one worker, while float32 is kept and needs no more
  than ``LIVE_MODELS_MEMORY_BOUND``.
- A trial that fails out of memory is run again, once, in a fresh worker, before it is judged
  (``retry_fresh``).

Each replacement is recorded (run.json's ``live_models``: what went, why, the worker's resident
memory before and the fresh one's) and said.
"""

from __future__ import annotations

from tuner.records.results import Progress
from tuner.trial_types import FailureClass, TrialResult, TrialSpec

# Where the re-measurement runs in the trials' own worker, the models of the finalists-to-be
# stay alive there (built and traced once for the search and the re-measurement), unless
# float32 alone needs more training memory than this: then only its model is kept.
LIVE_MODELS_MEMORY_BOUND = 512 * 2**20
# A 16-bit trial beside the kept float32 model needs at most float32's memory; allocators
# fragment, and the measure is of one moment: ask for half as much again.
ROOM_MARGIN = 1.5


def trial_need_bytes(result: TrialResult) -> int:
    """What a trial of this model needs at most: float32's counted training memory or what its
    trial was seen to use (the GPU allocator's peak, or the host's RSS growth), the larger."""
    counted = (result.training_memory or {}).get("total_bytes") or 0
    return max(int(counted), int(result.peak_memory_bytes or 0))


def room_verdict(room: dict | None, need: int, worker_memory: int | None) -> tuple[bool, str]:
    """Whether a trial that needs ``need`` bytes fits in what a worker said it has left
    (``room``: tuner.worker.device.room); why not, in words."""
    room = room or {}
    free, held = room.get("free_bytes"), room.get("held_bytes")
    bounded = worker_memory is not None and held is not None
    if bounded:
        allowed = max(0, worker_memory - held)
        free = allowed if free is None else min(free, allowed)
    if free is None or not need or free >= ROOM_MARGIN * need:
        return True, ""
    where = "of --worker-memory" if bounded else f"on the {room.get('source', 'device')}"
    return False, (f"{_mib(free)} MiB left {where}, and a trial may need {_mib(need)} MiB "
                   f"(float32's) x{ROOM_MARGIN:g}")


def _mib(count: float) -> str:
    return f"{count / 2**20:,.0f}"


class KeptModels:
    """The trials whose models the worker keeps (``kept``), and the releases."""

    def __init__(self, executor, finalists: int, worker_memory: int | None, records,
                 progress: Progress) -> None:
        self.executor = executor
        self.finalists = finalists
        self.worker_memory = worker_memory
        self.records = records
        self.progress = progress
        self.kept: list[int] = [0] if executor.keeps_live_models else []
        self.baseline_kept = bool(self.kept)
        self._retried: set[int] = set()

    def keep(self, number: int, baseline: TrialResult | None) -> bool:
        """Whether trial ``number`` leaves its model alive in the worker."""
        return number == 0 and self.baseline_kept or self._keeps_candidates(baseline)

    def _keeps_candidates(self, baseline: TrialResult | None) -> bool:
        if not self.baseline_kept or self.executor.slots > 1 or baseline is None:
            return False
        return ((baseline.training_memory or {}).get("total_bytes", 0)
                <= LIVE_MODELS_MEMORY_BOUND)

    def trial_finished(self, result: TrialResult, baseline: TrialResult | None) -> None:
        """A fresh worker for the next trial where this one has no room left for it."""
        if not self.executor.keeps_live_models or baseline is None:
            return
        fits, why = room_verdict(result.device_room, trial_need_bytes(baseline),
                                 self.worker_memory)
        if not fits:
            what = ("float32's model, before the 16-bit trials" if result.number == 0
                    else "what the worker held of its trials")
            self._replace(what, why, result.number)

    def keep_finalists(self, baseline: TrialResult, specs: list[TrialSpec]) -> None:
        """Keep float32's and the fastest stable trials' models (``specs``: float32's first,
        then the leaders, fastest first): as many leaders as there are finalists, the models
        the re-measurement may time."""
        if not self._keeps_candidates(baseline):
            return
        specs = specs[:1 + self.finalists]
        kept = sorted(spec.number for spec in specs)
        if kept != self.kept:
            self.kept = kept
            self.executor.keep_live_only(specs)

    def retry_fresh(self, result: TrialResult) -> bool:
        """A trial that ran out of memory: True (run it again, once, before judging it), in
        a fresh worker where the executor has one to give."""
        if result.failure_class is not FailureClass.OUT_OF_MEMORY \
                or result.number in self._retried:
            return False
        self._retried.add(result.number)
        self._replace(f"everything, to run trial #{result.number} again",
                      "it ran out of memory", result.number)
        return True

    def _replace(self, what: str, why: str, after: int) -> None:
        released, self.kept, self.baseline_kept = self.kept, [], False
        answer = self.executor.replace_worker() or {}
        event = {"after_trial": after, "released": released, "what": what, "why": why,
                 "fresh_worker": bool(answer.get("replaced")),
                 "rss_before": answer.get("rss_before"), "rss_after": answer.get("rss_after")}
        self.records.live_models_released(event)
        freed = ""
        if event["rss_before"] and event["rss_after"] is not None:
            freed = (f"; the worker's resident memory {_mib(event['rss_before'])} MiB, the "
                     f"fresh one's {_mib(event['rss_after'])} MiB")
        how = "a fresh worker" if event["fresh_worker"] else "the live models dropped"
        self.progress.phase(f"{how} for the next trial, releasing {what}: {why}{freed}")
