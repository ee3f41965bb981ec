"""The precision guard: a Keras callback that watches a user's whole training under a config
and repairs it when 16-bit training fails.

One shape: detectors (``detectors``: each answers "did this step or epoch fail, and what did
it see?") give a typed failure (``failures``), which one repair ladder answers, its rungs
tried in order (``ladder``) on one ``Trip`` each (``trip``), and each trip is a typed event
(``events``) in ``guard.events``, MLflow and the lines of ``precision-tuner train``. ``callback``
(``PrecisionGuard``) holds them together on Keras's hooks, which ``loop`` (``LoopGuard``) drives
from a training loop that is not ``fit``; ``training`` is what both sides share of
the watched training (the model, the config as repaired, the snapshots, the kept batch, the loss
scales).

Beneath them: what each compiled step writes of itself for the guard (``ledger``) and how the
guard hears of the steps, read from that ledger once a window of steps or from the host after
each (``step_reads``), the per-step loss and its noise (``watch``), the host-memory snapshot of
weights and optimizer state and the training batches kept for diagnosis (``state``), the cause of a
failure found on that batch and the moves of one layer (``cause``), each 16-bit layer's output
against its float32 computation (``fidelity``), the kept batch's loss against float32's
(``precision_loss``), the smallest set of layers whose float32 brings the model back
(``float32_set``), each optimizer's loss scale and the largest scale at which a step applies
(``scales``), what it reads from Keras (``readings``), and what a guarded training reports in
MLflow (``mlflow_record``); the rungs themselves in ``rungs``, ``ladder`` holding which answers
which failure (``ladder.ANSWERS``).

Imported from here (each on first use), the surface for a failure of your own: a
``Detector`` returning a ``Finding`` (of a kind of your own, any string), and a ``Rung`` that
answers it and ends its ``Trip`` (``trip.end = End.DONE``), seeing the ladder as a
``LadderState``. The guard's own rungs leave a kind
of yours alone, and yours run before its repair budget and its last resort, spending neither.
"""

from __future__ import annotations

from tuner.lazy_names import lazy_names

# Imported on first use (tuner.lazy_names): the driver imports this package's plain-data
# modules (events, failures) and must not import Keras with them.
_WHERE = {
    "Detector": "tuner.apply.guard.detectors", "Finding": "tuner.apply.guard.detectors",
    "StepReading": "tuner.apply.guard.detectors", "TripReport": "tuner.apply.guard.detectors",
    "Failure": "tuner.apply.guard.failures", "End": "tuner.apply.guard.trip",
    "Rung": "tuner.apply.guard.trip", "Trip": "tuner.apply.guard.trip",
    "LadderState": "tuner.apply.guard.trip",
}
__all__ = list(_WHERE)
__getattr__, __dir__ = lazy_names(globals(), _WHERE)
