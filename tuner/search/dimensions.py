"""A search space as a conditional tree of dimensions, and the walks over it.

A ``Dimension`` is one Optuna parameter: its name, its choices, and the earlier parameter (its
parent) whose value decides whether it is asked at all. ``SearchSpace.dimensions`` writes the
tree once; sampling (``suggest``), the grid (``grid``), its size (``count``), a named config's
params (``pick``) and the study's choices all walk that one tree, so they cannot drift apart.
The walks know nothing of precision: they see names, choices and parents only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence


class Suggester(Protocol):
    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...


def _always(value: Any) -> bool:
    return True


@dataclass(frozen=True)
class Dimension:
    """One Optuna parameter, asked where ``parent`` was asked and ``under(its value)`` holds.

    ``preferred``: the values a named config takes (``pick``), in order, where the dimension
    offers them; otherwise its first choice.
    """

    name: str
    choices: tuple[Any, ...]
    parent: str | None = None
    under: Callable[[Any], bool] = _always
    preferred: tuple[Any, ...] = ()

    def asked(self, params: Mapping[str, Any]) -> bool:
        """Whether this dimension is asked after the earlier ``params``."""
        return self.parent is None or (self.parent in params and self.under(params[self.parent]))

    def default(self) -> Any:
        return next((value for value in self.preferred if value in self.choices),
                    self.choices[0])


def suggest(tree: Sequence[Dimension], trial: Suggester) -> dict[str, Any]:
    """The params of one sampled config, asked define-by-run in the tree's order."""
    params: dict[str, Any] = {}
    for dimension in tree:
        if dimension.asked(params):
            params[dimension.name] = trial.suggest_categorical(dimension.name,
                                                               list(dimension.choices))
    return params


def grid(tree: Sequence[Dimension], params: Mapping[str, Any] | None = None
         ) -> Iterator[dict[str, Any]]:
    """The params of every distinct config, depth-first: later dimensions vary fastest."""
    params = params or {}
    if not tree:
        yield dict(params)
        return
    first, rest = tree[0], tree[1:]
    if not first.asked(params):
        yield from grid(rest, params)
        return
    for value in first.choices:
        yield from grid(rest, {**params, first.name: value})


def count(tree: Sequence[Dimension]) -> int:
    """Number of distinct configs, branching only on the parents of other dimensions (the
    grid of a space with many float32 switches is too large to enumerate)."""
    parents = {dimension.parent for dimension in tree}

    def configs(rest: Sequence[Dimension], params: Mapping[str, Any]) -> int:
        if not rest:
            return 1
        first = rest[0]
        if not first.asked(params):
            return configs(rest[1:], params)
        if first.name not in parents:
            return len(first.choices) * configs(rest[1:], params)
        return sum(configs(rest[1:], {**params, first.name: value}) for value in first.choices)

    return configs(tree, {})


def pick(tree: Sequence[Dimension], wanted: Mapping[str, Any]) -> dict[str, Any] | None:
    """The params of the config with the ``wanted`` values where they are asked, each other
    asked dimension at its default; None where a wanted value is not among its choices."""
    params: dict[str, Any] = {}
    for dimension in tree:
        if not dimension.asked(params):
            continue
        if dimension.name not in wanted:
            params[dimension.name] = dimension.default()
        elif wanted[dimension.name] in dimension.choices:
            params[dimension.name] = wanted[dimension.name]
        else:
            return None
    return params
