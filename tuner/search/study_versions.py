"""Resuming a study whose search space has changed since it started (a newer version's default
space, an edited space file): the study continues in a new Optuna study, never in a traceback.

Optuna keeps one distribution per parameter name for a whole study and refuses a suggestion
whose choices differ (``CategoricalDistribution does not support dynamic value space``). A run
started with ``growth_steps: [200, 2000]`` could therefore never run another float16 trial
under a version whose space says otherwise. ``continue_study`` compares the choices the study
holds with those the space asks with now; where they differ it opens a new study in the same
storage, carries over every finished trial whose values the space still offers (so the sampler
keeps what it learnt), and says so in lines for the summary. Every earlier trial stays in the
run's own records either way (trials.jsonl, MLflow), and the proposer still knows each config
that ran, so none is run twice.
"""

from __future__ import annotations

from typing import Any

from tuner.search.space import SearchSpace


def changed_choices(study, space: SearchSpace) -> dict[str, tuple[tuple, tuple]]:
    """``{name: (choices in the study, choices now)}`` for each parameter that differs."""
    now = space.choices()
    changed = {}
    for trial in study.get_trials(deepcopy=False):
        for name, distribution in trial.distributions.items():
            before = tuple(getattr(distribution, "choices", ()))
            if name in now and name not in changed and before != tuple(now[name]):
                changed[name] = (before, tuple(now[name]))
    return changed


def fits(params: dict[str, Any], space: SearchSpace) -> bool:
    """Whether every value of ``params`` is still among the space's choices."""
    now = space.choices()
    return all(name not in now or value in now[name] for name, value in params.items())


def continue_study(study, space: SearchSpace, storage: str) -> tuple[Any, list[str]]:
    """``study`` itself when the space still asks what it holds; otherwise a new study in
    ``storage`` (the study's own) with the earlier finished trials that fit, and lines saying
    what changed."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    changed = changed_choices(study, space)
    if not changed:
        return study, []
    now = space.choices()
    taken = {summary.study_name for summary in optuna.get_all_study_summaries(storage)}
    name = next(f"{study.study_name}+space{n}" for n in range(2, 10_000)
                if f"{study.study_name}+space{n}" not in taken)
    successor = optuna.create_study(study_name=name, storage=storage,
                                    directions=study.directions, sampler=study.sampler)
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    carried = 0
    for trial in finished:
        if not fits(trial.params, space):
            continue
        distributions = {key: CategoricalDistribution(now[key]) if key in now else value
                         for key, value in trial.distributions.items()}
        successor.add_trial(create_trial(
            state=trial.state, params=trial.params, distributions=distributions,
            values=trial.values if trial.state == TrialState.COMPLETE else None,
            user_attrs=trial.user_attrs, system_attrs=trial.system_attrs))
        carried += 1
    what = "; ".join(f"{key} {_listed(before)} is now {_listed(after)}"
                     for key, (before, after) in changed.items())
    return successor, [
        f"the search space changed since this run started ({what}): the search goes on in "
        f"a new Optuna study, {name!r}, with {carried} of the {len(finished)} earlier trials "
        "whose values it still offers; every earlier trial stays in the run's records"]


def _listed(choices: tuple) -> str:
    return "[" + ", ".join("default" if value is None else f"{value:g}"
                           if isinstance(value, float) else str(value)
                           for value in choices) + "]"
