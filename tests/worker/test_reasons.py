"""Failure reasons in the model's terms: the real TensorFlow message, the layer that owns the
failing op, and 16-bit rounding of float inputs that carry integers, caught before training."""

from pathlib import Path

import pytest

from tuner.apply.config import Float32Placement, PrecisionConfig
from tuner.trial_types import FailureClass, TrialOutcome, TrialResult, TrialSpec
from tuner.worker.trial.error_reading import classify, layer_for_node, read_error
from tuner.worker.trial.trial import run_trial

ZOO = Path(__file__).parent.parent / "suites" / "zoo"
FLOAT_IDS = str(ZOO / "float_token_ids.py")


def _trial(path, cfg, steps=6, **extra):
    spec = TrialSpec(0, path, cfg.to_dict(), steps, 2, **extra)
    return TrialResult.from_dict(run_trial(spec.to_dict()))


@pytest.fixture(scope="module")
def float_ids_diagnostics():
    from tuner.worker.diagnostics.diagnose import diagnose_task

    return diagnose_task(FLOAT_IDS, steps=1)


# -- reading TensorFlow's errors -----------------------------------------------------------------
def _graph_error():
    """A real runtime error out of a tf.function, as Keras's fit raises them."""
    import tensorflow as tf

    @tf.function
    def lookup(table, ids):
        with tf.name_scope("functional_1"), tf.name_scope("token_embedding_1"):
            return tf.gather(table, ids)

    try:
        lookup(tf.zeros((5, 2)), tf.constant([[1, 7]]))
    except tf.errors.InvalidArgumentError as exc:
        return exc
    raise AssertionError("the lookup did not fail")


def test_a_graph_error_is_read_past_its_preamble():
    exc = _graph_error()
    assert str(exc).lstrip().startswith("Graph execution error")  # what a first line would give
    reading = read_error(exc)
    assert reading.message == "indices[0,1] = 7 is not in [0, 5)"
    assert reading.node == "functional_1/token_embedding_1/GatherV2"
    assert reading.user_frame.startswith("test_reasons.py:")  # where the op was defined


def test_a_node_maps_to_the_deepest_layer_owning_it():
    paths = ["dense", "dense_1", "token_embedding", "block", "block/attention",
             "block/attention/query"]
    assert layer_for_node("functional_1/token_embedding_1/GatherV2", paths) == "token_embedding"
    assert layer_for_node("functional_1/dense_1_1/MatMul", paths) == "dense_1"
    assert layer_for_node("functional_1/dense_2/MatMul", paths) == "dense"
    assert layer_for_node("model/block_1/attention_1/query_1/einsum/Einsum", paths) == \
        "block/attention/query"
    assert layer_for_node("model/somewhere_else/Add", paths) is None


def test_an_index_error_is_classified_with_its_layer_and_fix():
    kind, reason, layer = classify(_graph_error(), stage="train",
                                   layer_paths=["token_embedding", "dense"])
    assert kind is FailureClass.INDEX_OUT_OF_RANGE and layer == "token_embedding"
    assert reason.startswith("index out of range in layer token_embedding: "
                             "indices[0,1] = 7 is not in [0, 5)")
    assert "keep token_embedding in float32" in reason and "\n" not in reason


def test_a_numerics_check_is_classified():
    import tensorflow as tf

    try:
        with tf.name_scope("scale_1"):
            tf.debugging.check_numerics(tf.constant([1.0, float("inf")]), "activations")
    except tf.errors.InvalidArgumentError as exc:
        kind, reason, layer = classify(exc, stage="train", layer_paths=["scale"])
    assert kind is FailureClass.NUMERIC_CHECK and "Inf" in reason


# -- float token ids ------------------------------------------------------------------------------
def test_diagnostics_name_the_layer_that_takes_integers_as_floats(float_ids_diagnostics):
    from tuner.records.diagnostics_report import conclusions

    (entry,) = float_ids_diagnostics["integer_inputs"]
    assert entry == {"layer": "token_embedding", "class": "TokenEmbedding", "max": 4999.0}
    assert float_ids_diagnostics["candidates"][0] == "token_embedding"
    assert any("token_embedding (TokenEmbedding) receives integer-valued floats up to 4999"
               in line for line in conclusions(float_ids_diagnostics))


def test_without_the_check_float16_fails_with_the_real_message_and_the_layer():
    result = _trial(FLOAT_IDS, PrecisionConfig("mixed_float16"))
    assert result.failure_class is FailureClass.INDEX_OUT_OF_RANGE
    assert result.failure_layer == "token_embedding"
    assert "is not in [0, 5000)" in result.failure_message
    assert "float_token_ids.py" in result.failure_message  # the user's line that did it


@pytest.mark.parametrize("policy, how", [
    ("mixed_bfloat16", "are cast to bfloat16"),
    ("float16", "arrive as float16 from the layers before it")])
def test_a_config_that_rounds_the_ids_fails_before_training(float_ids_diagnostics, policy, how):
    # mixed_bfloat16 would round silently (4999 -> 4992, still in range) and train.
    placement = Float32Placement((), ("token_embedding",)) if policy == "float16" else None
    cfg = PrecisionConfig(policy, float32=placement or Float32Placement())
    result = _trial(FLOAT_IDS, cfg, integer_inputs=float_ids_diagnostics["integer_inputs"])
    assert result.failure_class is FailureClass.INTEGER_ROUNDING, result.failure_message
    assert result.failure_layer == "token_embedding" and not result.losses
    assert how in result.failure_message and "(up to 4999)" in result.failure_message


def test_keeping_the_layer_in_float32_keeps_the_ids_exact(float_ids_diagnostics):
    cfg = PrecisionConfig("mixed_bfloat16", float32=Float32Placement((), ("token_embedding",)))
    result = _trial(FLOAT_IDS, cfg, integer_inputs=float_ids_diagnostics["integer_inputs"])
    assert result.outcome is TrialOutcome.COMPLETED, result.failure_message


def test_the_repair_keeps_the_rounding_layer_in_float32():
    from tuner.judging.verdict import Judgement, Verdict
    from tuner.records.results import TrialRow
    from tuner.search.proposer import repair_for

    cfg = PrecisionConfig("mixed_bfloat16")
    failed = TrialResult.failed(3, FailureClass.INTEGER_ROUNDING, "integer rounding ...",
                                "token_embedding")
    row = TrialRow(3, cfg, failed, Judgement(Verdict.FAILED, "integer rounding ...", None, None))
    assert repair_for(row).float32.layers == ("token_embedding",)


def test_a_dtype_mismatch_outside_every_layer_is_repaired_with_float32_outputs():
    from tuner.judging.verdict import Judgement, Verdict
    from tuner.records.results import TrialRow
    from tuner.search.proposer import repair_for

    def row(cfg):
        failed = TrialResult.failed(2, FailureClass.DTYPE_MISMATCH, "dtype mismatch ...", None)
        return TrialRow(2, cfg, failed, Judgement(Verdict.FAILED, "dtype mismatch ...", None,
                                                  None))

    plain = PrecisionConfig("mixed_bfloat16", float32=Float32Placement(("softmax",), ("x",)))
    repair = repair_for(row(plain))
    assert repair.float32 == Float32Placement(("softmax",), ("x",), True)
    assert repair.policy == "mixed_bfloat16"
    assert repair_for(row(repair)) is None          # once: it failed with float32 outputs too

