"""The space's conditional tree is written once: suggest, the grid, its size, params_for and the
study's choices all agree, and the Optuna parameter names stay what earlier studies hold."""

from dataclasses import replace

import pytest

from tuner.search.dimensions import Dimension, count, grid, pick
from tuner.search.space_files import load_space


class Replay:
    """A Suggester that answers from given params and records the names asked, in order."""

    def __init__(self, params):
        self.params, self.asked = params, []

    def suggest_categorical(self, name, choices):
        assert self.params[name] in choices
        self.asked.append(name)
        return self.params[name]


def _spaces():
    default = load_space("default")
    wide = replace(default, float32_layers=("dense_*",), float32_auto_layers=2,
                   weight_updates=("compensated", "nearest"), initial_scales=(256.0, 2.0**15),
                   backend_epsilons=(1e-4, None)).with_diagnostics(["a", "b", "c"])
    return [load_space("quick"), default, wide, replace(default, policies=("float32",))]


@pytest.mark.parametrize("space", _spaces(), ids=lambda space: space.name)
def test_suggest_grid_size_and_params_for_walk_one_tree(space):
    params = list(space.grid_params())
    assert space.size() == len(params) == len({repr(p) for p in params})
    choices = space.choices()
    for each in params:
        replay = Replay(each)
        config = space.suggest(replay)
        assert replay.asked == list(each)      # suggest asks exactly these, in this order
        assert config == space.config_from_params(each)
        assert all(value in choices[name] for name, value in each.items())
    named = [space.baseline_params(), *space.recommended_params(),
             *(space.params_for(policy, loss_scale=kind) for policy in space.policies
               for kind in space.loss_scale_kinds)]
    assert all(p in params for p in named)


def test_optuna_parameter_names_stay_as_earlier_studies_hold_them():
    held = ["policy", "loss_scale", "initial_scale", "growth_steps", "fixed_value",
            "weight_update", "backend_epsilon", "optimizer_epsilon", "f32_normalization",
            "f32_softmax", "f32_attention", "f32_embedding", "f32_layer:dense_*", "f32_riskiest"]
    space = replace(load_space("default"), float32_layers=("dense_*",),
                    float32_auto_layers=1).with_diagnostics(["out"])
    # A new dimension may join; none of these may be renamed, dropped or reordered.
    assert [name for name in space.choices() if name in held] == held


def test_count_branches_only_where_a_later_dimension_depends():
    tree = [Dimension("a", (1, 2, 3)), Dimension("b", ("x", "y"), "a", lambda a: a > 1),
            Dimension("c", (True, False), "b", lambda b: b == "y"), Dimension("d", (0, 1, 2, 3))]
    assert count(tree) == sum(1 for _ in grid(tree)) == (1 + 2 * (1 + 2)) * 4
    assert pick(tree, {"a": 2, "b": "y"}) == {"a": 2, "b": "y", "c": True, "d": 0}
    assert pick(tree, {"a": 4}) is None
