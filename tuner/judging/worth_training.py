"""Whether a proposed config is worth training: a trial costs only what it can still change.

A search spends its time on trainings; one whose config cannot change the answer is waste, and
under ``--objective memory`` on a device that emulates a 16-bit dtype, one such trial costs as
much as a hundred float32 baselines. Before a proposal is trained the scheduler asks
``hold_for`` here; the answer is one of

- ``None``: train it;
- ``DOMINATED`` (memory): at least ``finalists`` stable configs already found each need no
  more training memory than it by construction (``needs_no_more_memory``) and are simpler
  (``tuner.judging.decision.complexity``). The objective ranks by memory, then simplicity, so
  it would rank behind all of them: it can be neither the pick nor a finalist the
  confirmation falls back on. Not trained.
- ``EMULATED`` (memory): it computes in a 16-bit dtype the device's ceiling probe says is
  emulated (``tuner.worker.device.ceiling``), and a config of the fast 16-bit dtype with the same
  weight and activation widths (``memory_width``: float16 and bfloat16 take the same bytes)
  is already stable. Not trained.
- ``DEFERRED`` (memory): emulated, and nothing stable of its width yet. It waits until the
  search has tried the fast dtype (the scheduler releases it at the end, when ``final``);
  then it is trained only where the fast dtype found no stable config of that width.

Under ``speed`` and ``balanced`` a config's step time decides, and nothing tells it before the
trial starts; there the worker's early stop ends a trial as soon as it is clearly slower than
the bar (``tuner.judging.early_stop``), and policies the ceiling says cannot win are left out of the
space (``tuner.run.plan.RunPlan.within_ceiling``). ``--keep-slow-policies`` trains them all.
Pure Python: plain configs and numbers in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping, Sequence

from tuner.apply.config import PrecisionConfig, compute_dtype_of
from tuner.judging.decision import complexity

# Bytes per weight and activation, by policy: float16 and bfloat16 take the same. A mixed
# policy keeps float32 weights and 16-bit activations; a pure one 16-bit both.
_WIDTH = {"float32": 2, "mixed_float16": 1, "mixed_bfloat16": 1, "float16": 0, "bfloat16": 0}
_WIDTH_NAMES = {2: "float32", 1: "mixed", 0: "pure 16-bit"}


def memory_width(policy: str) -> int:
    """The policy's storage widths as a rank: pure 16-bit 0, mixed 1, float32 2."""
    return _WIDTH[policy]


def width_name(policy: str) -> str:
    return _WIDTH_NAMES[memory_width(policy)]


def needs_no_more_memory(smaller: PrecisionConfig, config: PrecisionConfig) -> bool:
    """Whether ``smaller`` needs no more training memory than ``config`` by construction: no
    wider weights or activations (``memory_width``: float16 and bfloat16 alike), no float32
    placement that ``config`` lacks (a float32 layer keeps float32 activations), and no
    compensated update (its buffers) unless ``config`` has one. Under ``balanced`` a trial is
    stopped as slow only against such a config: being also faster, it dominates the trial,
    which then cannot be on the front whatever the trials still to come."""
    return (memory_width(smaller.policy) <= memory_width(config.policy)
            and set(smaller.float32.groups) <= set(config.float32.groups)
            and set(smaller.float32.layers) <= set(config.float32.layers)
            and smaller.float32.outputs <= config.float32.outputs
            and (not smaller.weight_update.keeps_buffers or config.weight_update.keeps_buffers))


class HoldKind(str, enum.Enum):
    DOMINATED = "dominated"
    EMULATED = "emulated"
    DEFERRED = "deferred"


@dataclass(frozen=True)
class Hold:
    """Why a config is not trained (now): its kind and the stable trials that settle it."""

    kind: HoldKind
    by: tuple[int, ...] = ()


def fast_twin(dtype: str) -> str:
    """The other 16-bit dtype (same bytes): bfloat16 for float16 and back."""
    return {"float16": "bfloat16", "bfloat16": "float16"}[dtype]


def hold_for(config: PrecisionConfig, stable: Sequence[tuple[int, PrecisionConfig]], *,
             memory: bool, emulated: Mapping[str, float], finalists: int,
             final: bool = False) -> Hold | None:
    """Why not to train ``config`` now (None: train it). ``stable``: the stable trials so
    far, as (number, config), float32 included; ``memory``: the objective ranks by memory;
    ``emulated``: the compute dtypes the ceiling says the device emulates (dtype -> speed);
    ``final``: the search is over (a deferred config is then trained or settled)."""
    if not memory or config.policy == "float32":
        return None
    dtype = compute_dtype_of(config.policy)
    if dtype in emulated and fast_twin(dtype) not in emulated:
        twins = tuple(number for number, other in stable
                      if other.policy != "float32"
                      and memory_width(other.policy) == memory_width(config.policy)
                      and compute_dtype_of(other.policy) == fast_twin(dtype))
        if twins:
            return Hold(HoldKind.EMULATED, twins)
        if not final:
            return Hold(HoldKind.DEFERRED)
    own = complexity(config)
    dominating = tuple(number for number, other in stable
                       if needs_no_more_memory(other, config) and complexity(other) < own)
    if len(dominating) >= max(1, finalists):
        return Hold(HoldKind.DOMINATED, dominating)
    return None
