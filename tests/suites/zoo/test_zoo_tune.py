"""Every zoo model tunes end to end: task check, space fitted to the model, diagnostics, the
float32 baseline and a 16-bit trial, the re-measurement, the records, an exported config.

The job runs through the same code as `precision-tuner tune` (plan, job, scheduler,
remeasure) on one local worker shared by all models, on the quick space without float16: this
CPU emulates float16 (70-400x slower), which would only make the suite slow.
"""

from pathlib import Path

import pytest

from tests.support.records import read_trials

pytestmark = pytest.mark.slow

ZOO = Path(__file__).parent
MODELS = sorted(path.stem for path in ZOO.glob("*.py")
                if not path.stem.startswith(("test_", "_")))
SPACE = """
policies: [float32, mixed_bfloat16]
float32: {groups: [softmax, normalization, attention, embedding]}
trials: 2
trial: {steps: 9, warmup_steps: 4}
"""


# What each model's 16-bit trial must come to. A model not listed trains stably in
# mixed_bfloat16; these fail, for the named reason, in the named layer, and the repair the
# tuner then tries (that layer in float32, a third trial) trains stably. Where no layer is
# named (None), the failure is outside every layer and the repair is float32 outputs.
EXPECTED_FAILURES = {
    "add_loss": ("dtype_mismatch", "activity_regularization"),   # its add_loss term is 16-bit
    "float_token_ids": ("integer_rounding", "token_embedding"),  # ids up to 4999 as floats
    "custom_metric": ("dtype_mismatch", None),   # its metric subtracts 16-bit predictions
    "vae": ("dtype_mismatch", "sampling"),       # float32 noise added to a 16-bit mean
}
# Models whose short bf16 trial ends on either side of the quality rules' allowance:
# guide_train_step's was stable in most runs; in one fresh-clone run of the whole suite it
# validated at 0.0191 against float32's 0.0127 (1.5x; allowance 25%), and in another it ended
# at a training loss of 0.00762 against float32's 0.002 (3.8x; noise +-0.0049), both models
# near zero loss, where bfloat16's rounding shows. Rejecting that is the verdict doing its job,
# so the test asks for a quality verdict against float32 with its reason, not for a side.
# transformer's trial is sized to 238-347 steps by the machine's speed, 20-29 passes over its 384
# samples: it overfits (training loss 0.003), and its validation loss grows with the steps and
# differs by precision. Measured on one machine: float32 1.63, 2.59 and (in CI) 1.27; bfloat16
# 2.07, 2.68 and 1.88 (1.5x: rejected on validation, rightly for what it measured).
EITHER_SIDE_OF_QUALITY = {"guide_train_step", "transformer"}
QUALITY_REASONS = ("validation loss ", "ended at a training loss ")


@pytest.fixture(scope="module")
def executor():
    from tuner.execution.local import LocalProcessExecutor

    with LocalProcessExecutor() as shared:
        yield shared


@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_tunes_end_to_end(name, executor, tmp_path):
    from tuner.apply.config import PrecisionConfig
    from tuner.run.options import TuneOptions
    from tuner.run.plan import Remeasurement, resolve
    from tuner.run.search_run import run_search
    from tuner.task_facts import TaskFacts

    space = tmp_path / "zoo.yaml"
    space.write_text(SPACE)
    # float_token_ids: under memory its repaired 16-bit config must be the export (it needs
    # less memory than float32), so the check below sees a 16-bit export, not float32's.
    plan = resolve(TuneOptions(task=ZOO / f"{name}.py", run_dir=tmp_path / "run",
                               space=str(space), trials=3 if name in EXPECTED_FAILURES else None,
                               objective="memory" if name == "float_token_ids" else None), None)
    info = executor.probe(str(plan.task_path), plan.steps, plan.space.float32_layers)
    plan, notes = plan.fitted_to(info["float32_matches"])
    # Groups that select nothing in this model are gone from the space, each with a line.
    for note in notes:
        group = note.split("'")[1]
        assert group not in plan.space.float32_groups
        assert not info["float32_matches"]["groups"][group]
    diagnostics = executor.diagnose(str(plan.task_path), 2)
    plan = plan.with_diagnostics(diagnostics)
    from dataclasses import replace

    # Verdicts are the point: no trial is stopped early for being slow on this CPU.
    plan = replace(plan, remeasurement=Remeasurement(min_rounds=2, max_rounds=2),
                   slow_factor=1e9)
    summary = run_search(plan, executor, diagnostics=diagnostics,
                         facts=TaskFacts.from_dict(info))

    trials = read_trials(plan.run_dir)
    assert [t["config"]["policy"] for t in trials][:1] == ["float32"]
    assert trials[0]["verdict"] == "stable", trials[0]["reason"]
    assert trials[1]["config"]["policy"] == "mixed_bfloat16"
    if name in EXPECTED_FAILURES:
        failure_class, layer = EXPECTED_FAILURES[name]
        assert len(trials) == 3
        assert trials[1]["verdict"] == "failed", trials[1]["reason"]
        assert trials[1]["result"]["failure_class"] == failure_class
        if layer is None:
            assert trials[1]["result"]["failure_layer"] is None, trials[1]["reason"]
            assert "fix: float32 outputs (float32.outputs: true" in trials[1]["reason"]
            assert trials[2]["config"]["float32"]["outputs"] is True   # the repair
        else:
            assert trials[1]["result"]["failure_layer"].endswith(layer)
            assert trials[2]["config"]["float32"]["layers"][-1].endswith(layer)   # the repair
        assert trials[2]["verdict"] == "stable", trials[2]["reason"]
    else:
        assert len(trials) == 2
        if name in EITHER_SIDE_OF_QUALITY and trials[1]["verdict"] == "unstable":
            assert trials[1]["reason"].startswith(QUALITY_REASONS), trials[1]["reason"]
            assert "vs float32's" in trials[1]["reason"]
        else:
            assert trials[1]["verdict"] == "stable", trials[1]["reason"]
    # Every trial was validated, on held-back data (no zoo model defines val_data()), through
    # the model's own evaluate; a test_step that never computes its loss is named, not trusted.
    validation = trials[0]["result"]["validation"]
    if name == "sample_weights":  # its `metrics` property hides Keras's loss tracker
        assert "does not compute it" in validation["error"], validation
    elif name == "vae":           # no compiled loss, no test_step: evaluate has no loss either
        assert "No loss to compute" in validation["error"], validation
        assert diagnostics["unavailable"].startswith("the task's LOSS is None")
    else:
        assert validation["source"] == "held-back" and validation["loss"] > 0, validation
    best = PrecisionConfig.load(plan.run_dir / "best_precision.json")
    assert best.to_dict() == summary.best_config.to_dict()   # provenance too
    low, high = best.provenance["speedup_interval"]
    assert low <= best.provenance["speedup_vs_float32"] <= high
    if name == "float_token_ids":  # token ids as floats, vocabulary 5000: never rounded
        assert diagnostics["integer_inputs"][0]["layer"] == "token_embedding"
        assert best.policy == "mixed_bfloat16" and "token_embedding" in best.float32.layers
        rounded = [t for t in trials if t["result"]["failure_class"] == "integer_rounding"]
        assert all("token_embedding" not in t["config"]["float32"]["layers"] for t in rounded)
    # The exported config names only placements that select a layer of this model.
    for group in best.float32.groups:
        assert info["float32_matches"]["groups"][group]
    print(f"{name}: pick {best.describe()} ({summary.decision}); 16-bit trial "
          f"{trials[1]['verdict']} {trials[1]['reason']}")
