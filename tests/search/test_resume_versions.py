"""A run resumed after its search space changed (a newer version's default space, an edited
space file): Optuna refuses a categorical whose choices changed, so the search goes on in a new
study that carries over the earlier trials the space still offers."""

import pytest

from tests.support.scripted import space_file
from tuner.search.proposer import create_study, study_storage
from tuner.search.study_versions import continue_study, fits

SPACE = """
policies: [float32, mixed_float16]
loss_scale: {{kinds: [dynamic], initial_scales: [32768], growth_steps: {growth}}}
trials: 4
"""


def _ran(study, space):
    """Every config of ``space`` once, told to ``study`` as the search does."""
    for params in space.grid_params():
        study.enqueue_trial(params)
        trial = study.ask()
        space.suggest(trial)
        study.tell(trial, 1.0)


def test_a_changed_categorical_continues_in_a_new_study_with_the_trials_that_fit(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    before = space_file(tmp_path, SPACE.format(growth="[200, 2000]"), "before")
    after = space_file(tmp_path, SPACE.format(growth="[500, 2000]"), "after")
    _ran(create_study(run_dir, "job", 0), before)
    study = create_study(run_dir, "job", 0, resume=True)

    # What a resume met before: Optuna's own refusal, as a traceback.
    study.enqueue_trial(after.params_for("mixed_float16"))
    with pytest.raises(ValueError, match="dynamic value space"):
        after.suggest(study.ask())

    study = create_study(run_dir, "job", 0, resume=True)
    same, notes = continue_study(study, before, study_storage(run_dir))
    assert same is study and notes == []
    successor, notes = continue_study(study, after, study_storage(run_dir))
    assert successor.study_name == "job+space2"
    assert notes == ["the search space changed since this run started (growth_steps [200, "
                     "2000] is now [500, 2000]): the search goes on in a new Optuna study, "
                     "'job+space2', with 2 of the 3 earlier trials whose values it still "
                     "offers; every earlier trial stays in the run's records"]
    carried = successor.get_trials()
    assert [t.params.get("growth_steps") for t in carried] == [None, 2000]
    assert all(fits(t.params, after) for t in carried)
    successor.enqueue_trial({**after.params_for("mixed_float16"), "growth_steps": 500})
    trial = successor.ask()
    config = after.suggest(trial)          # the new choices are accepted
    assert config.loss_scale.growth_steps == 500
    successor.tell(trial, 1.0)
    # The new study is what a later resume opens (run.json names it: tuner.run.search_run._open).
    again = create_study(run_dir, "job+space2", 0, resume=True)
    assert len(again.get_trials()) == 3 and continue_study(again, after,
                                                           study_storage(run_dir))[1] == []
