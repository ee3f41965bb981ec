"""A search space as a finite grid: the Optuna params of every distinct config, and how many.

``SearchSpace.suggest`` samples the same tree define-by-run: loss-scale choices only where the
policy computes in float16, weight updates only under pure policies, each epsilon only where it
guards a 16-bit quantity (``SearchSpace.epsilons_for``), float32 placements only off float32.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Iterator

from tuner.apply.config import PURE_POLICIES, compute_dtype_of

if TYPE_CHECKING:
    from tuner.search.space import SearchSpace


def grid_params(space: SearchSpace) -> Iterator[dict[str, Any]]:
    """The Optuna params of every distinct config (``suggest`` maps each to its config)."""
    names = [f"f32_{g}" for g in space.float32_groups] + \
            [f"f32_layer:{p}" for p in space.float32_layers]
    switches = list(itertools.product([False, True], repeat=len(names)))
    for policy in space.policies:
        scales: list[dict[str, Any]] = [{}]
        if compute_dtype_of(policy) == "float16":
            scales = []
            for kind in space.loss_scale_kinds:
                if kind == "dynamic":
                    scales += [{"loss_scale": kind, "initial_scale": s, "growth_steps": g}
                               for s in space.initial_scales for g in space.growth_steps]
                elif kind == "fixed":
                    scales += [{"loss_scale": kind, "fixed_value": v} for v in space.fixed_values]
                else:
                    scales.append({"loss_scale": kind})
        mixed = policy != "float32"  # float32 placement is a no-op under float32
        updates = [{"weight_update": u} for u in space.weight_updates] \
            if policy in PURE_POLICIES else [{}]
        backend, optimizer = space.epsilons_for(policy)
        epsilons = [{**({"backend_epsilon": b} if backend else {}),
                     **({"optimizer_epsilon": o} if optimizer else {})}
                    for b in backend or (None,) for o in optimizer or (None,)]
        for scale, update, epsilon, switch in itertools.product(
                scales, updates, epsilons, switches if mixed else [()]):
            params = {"policy": policy, **scale, **update, **epsilon,
                      **dict(zip(names, switch))}
            if mixed and space.risky_layers:
                for k in range(len(space.risky_layers) + 1):
                    yield {**params, "f32_riskiest": k}
            else:
                yield params


def grid_size(space: SearchSpace) -> int:
    """Number of distinct configs, computed without enumerating the grid."""
    scale_options = sum(len(space.initial_scales) * len(space.growth_steps) if kind == "dynamic"
                        else len(space.fixed_values) if kind == "fixed" else 1
                        for kind in space.loss_scale_kinds)
    switches = 2 ** (len(space.float32_groups) + len(space.float32_layers)) \
        * (len(space.risky_layers) + 1)

    def epsilons(policy: str) -> int:
        backend, optimizer = space.epsilons_for(policy)
        return max(1, len(backend)) * max(1, len(optimizer))

    return sum(epsilons(policy)
               * (scale_options if compute_dtype_of(policy) == "float16" else 1)
               * (len(space.weight_updates) if policy in PURE_POLICIES else 1)
               * (switches if policy != "float32" else 1)
               for policy in space.policies)
