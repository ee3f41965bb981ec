"""Every private Keras name the project touches, in one place: what each relies on, since which
Keras, and the version differences handled here. No other module under ``tuner/`` imports from
``keras.src`` or names a Keras attribute that starts with ``_``
(``tests/project/test_keras_seam.py`` holds it, reading ``KERAS_PRIVATE_NAMES``).

Why a seam: Keras's public API has no way to do what these do (read the current name scope,
keep the batch a compiled step trains on, decide a ``LossScaleOptimizer``'s step over every
replica, count a layer's own weights). A Keras release may move any of them; when one does, the
change is made here, the range ``pyproject.toml`` declares (``keras>=3.10.0,<4``) says which
releases were tried, and ``make test-lowest`` runs the floor. Each entry below says what it
relies on and since which Keras; every entry is checked at the floor (3.10) and with the newest
Keras the suite runs. No path for a Keras below the floor is kept: the range refuses one.

Keras behaviour the project relies on beyond these names (public, but not promised by Keras's
API), each checked by the tests named:

- a model's ``train_step``, ``train_function`` and ``reset_metrics`` are looked up on the
  instance, so an attribute set on one model replaces them for that model alone (the trial's
  in-step metric reset, tuner.worker.trial.steps; a custom loop's step, tuner.apply.own_step;
  the guard's kept batch, tuner.apply.guard.state; the guard's row written by the step,
  tuner.apply.guard.ledger, read by ``make_train_function`` when it is made):
  tests/worker/test_trial.py, tests/worker/test_own_step.py, tests/apply/guard/test_guard.py,
  tests/apply/guard/test_step_ledger.py;
- ``train_function`` is made by ``make_train_function`` from ``train_step`` when ``fit`` first
  needs it, and takes a list of batches as well as an iterator (from 3.7):
  tests/apply/guard/test_guarded_apply_loaded.py;
- ``Layer.__init__`` and ``Model.compile`` are the entry points the config's scope wraps while it
  is open (tuner.apply.scope, tuner.apply.compiling): tests/apply/test_keras_apply.py,
  tests/apply/test_compile_as_tuned.py;
- a model loaded from a file or a config is built in the frames ``CONFIG_FRAMES`` and
  ``CLONE_FRAME`` name, holding their config in the locals named beside them
  (tuner.apply.dtype_origins): tests/apply/loaded/.
"""

from __future__ import annotations

from typing import Any

import keras

from tuner.dependency_versions import warn_if_unsupported

# A Keras (or TensorFlow, Optuna, Ray, MLflow) outside the declared range: one line now, where
# the seam is first imported, rather than a traceback from inside a training later.
warn_if_unsupported()

# The private names below, for the structure test: an attribute, a string given to
# getattr/setattr, or a method overridden under one of these names, outside this module, fails it.
KERAS_PRIVATE_NAMES = frozenset({
    "_parent_path", "_flatten_layers", "_compile_loss", "_loss_tracker", "_trainable_variables",
    "_non_trainable_variables", "_losses", "_inbound_nodes", "_tf_apply",
    "_stateful_handle_finite_grads", "_stateful_handle_non_finite_grads", "_get_variable_index",
    "_distribute_strategy",
})


# --- Layers: paths, sublayers, own weights, added losses, graph nodes ---------------------------

def current_name_scope_path() -> str | None:
    """The path of the name scope open now (what Keras prefixes a layer's ``path`` with when it
    builds it). Relies on ``keras.src.backend.common.name_scope.current_path``, since Keras 3.0
    (checked 3.10); ``None`` where a Keras lacks it (names still match, paths do not)."""
    try:
        from keras.src.backend.common.name_scope import current_path
    except ImportError:
        return None
    return current_path()


def parent_path(layer: keras.layers.Layer) -> str | None:
    """The parent path Keras recorded for ``layer`` at construction (``Layer._parent_path``,
    since Keras 3.0; checked 3.10), ``None`` before it has one."""
    return getattr(layer, "_parent_path", None)


def direct_sublayers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """Keras's own traversal (what ``Model.layers`` and ``summary()`` use,
    ``Layer._flatten_layers``; checked 3.10): it also lists the layers a parent created itself
    (MultiHeadAttention's softmax, Bidirectional's copies), which ``layer.layers`` may not."""
    return list(layer._flatten_layers(include_self=False, recursive=False))


def own_variables(layer: Any) -> list:
    """The weights ``layer`` created itself, its sublayers' left out (``Layer._trainable_variables``
    and ``_non_trainable_variables``, Keras 3's own lists since 3.0; checked 3.10)."""
    return list(getattr(layer, "_trainable_variables", [])) \
        + list(getattr(layer, "_non_trainable_variables", []))


def added_losses(layer: Any) -> list:
    """The loss terms ``layer.add_loss`` gave in its last call (``Layer._losses``, since 3.0;
    checked 3.10); ``layer.losses`` would add its sublayers' and regularizers'."""
    return list(getattr(layer, "_losses", []))


def inbound_nodes(layer: Any) -> list:
    """The graph nodes that call ``layer`` in a functional model (``Operation._inbound_nodes``,
    since 3.0; checked 3.10); empty outside a functional graph."""
    return list(getattr(layer, "_inbound_nodes", None) or [])


def is_functional(layer: Any) -> bool:
    """A functional or Sequential model (its layers cast their own inputs). ``Functional`` is not
    exported (``keras.src.models.functional``, since 3.0; checked 3.10)."""
    from keras.src.models.functional import Functional

    return isinstance(layer, (Functional, keras.Sequential))


def current_call_entry_layer() -> Any | None:
    """The outermost layer of the call running now (Keras's call context, its ``entry_layer``),
    ``None`` outside a call. Relies on ``keras.src.backend.common.global_state``'s
    ``"current_call_ctx"``, since 3.0 (checked 3.10)."""
    from keras.src.backend.common import global_state

    context = global_state.get_global_attribute("current_call_ctx")
    return None if context is None else context.entry_layer


# --- Models: the compiled loss and its running mean --------------------------------------------

def compiled_loss(model: keras.Model) -> Any | None:
    """The loss ``compile`` gave the model (``Trainer._compile_loss``, since 3.0; checked 3.10),
    ``None`` where it was compiled without one or not at all."""
    return getattr(model, "_compile_loss", None)


def compiled_loss_tracker(model: keras.Model) -> Any | None:
    """Keras's running mean of the loss (``Trainer._loss_tracker``, since 3.0; checked 3.10)."""
    return getattr(model, "_loss_tracker", None)


def own_distribution_strategy(model: keras.Model) -> Any | None:
    """The ``tf.distribute`` strategy the model was made under (``Trainer._distribute_strategy``,
    TensorFlow backend, since 3.0; checked 3.10), ``None`` where it was made under none."""
    return getattr(model, "_distribute_strategy", None)


# --- Optimizers -------------------------------------------------------------------------------

def optimizer_trainable_variables(optimizer: Any) -> list:
    """The variables ``optimizer`` was built for, in its order
    (``BaseOptimizer._trainable_variables``, since 3.0; checked 3.10): ``apply(grads)`` without
    variables pairs the gradients with these."""
    return list(optimizer._trainable_variables)


def applied_updates(optimizer: Any) -> int:
    """How many updates ``optimizer`` has applied (a step a loss scale skipped does not count).

    A ``LossScaleOptimizer`` applies its updates through its inner optimizer, whose
    ``iterations`` count them. From Keras 3.9 the wrapper's own ``iterations`` is the inner
    one's (before 3.9 it was a variable of its own that never moved); the inner optimizer's count
    is read, which no wrapper can get wrong."""
    return int(keras.ops.convert_to_numpy(updates_counter(optimizer)))


def updates_counter(optimizer: Any) -> Any:
    """The variable counting ``optimizer``'s applied updates (``applied_updates`` says which),
    for a compiled step to read."""
    return getattr(optimizer, "inner_optimizer", optimizer).iterations


# The optimizer method that maps a variable to its slot index
# (``BaseOptimizer._get_variable_index``, since 3.0; checked 3.10): tuner.apply.weight_update wraps
# it to let a float32 view of a 16-bit weight find the weight's slots.
VARIABLE_INDEX_METHOD = "_get_variable_index"


class LossScaleOptimizerHooks(keras.optimizers.LossScaleOptimizer):
    """Keras's ``LossScaleOptimizer`` with its private step hooks under public names, and its
    step decided over every replica.

    Relies on three private methods of ``keras.optimizers.LossScaleOptimizer`` (since 3.0;
    checked 3.10): ``_tf_apply`` (the TensorFlow backend's apply under a strategy),
    ``_stateful_handle_finite_grads`` and ``_stateful_handle_non_finite_grads`` (what a step does
    with finite and non-finite gradients). A subclass overrides ``on_non_finite_step``.

    Under ``tf.distribute``, Keras decides whether to apply a step from the first replica's
    gradients alone, before they are summed: where another replica's are non-finite (its share
    of the batch overflowed), the step is applied, the sum is non-finite, and the weights become
    NaN. Here the step is applied only where every replica's gradients are finite.
    """

    def on_non_finite_step(self) -> None:
        """What a step with non-finite gradients does: Keras's own halves the scale."""
        super()._stateful_handle_non_finite_grads()

    def _stateful_handle_non_finite_grads(self):
        self.on_non_finite_step()

    def _tf_apply(self, grads, trainable_variables=None):
        import tensorflow as tf

        if tf.distribute.in_cross_replica_context() \
                or tf.__internal__.distribute.strategy_supports_no_merge_call():
            return super()._tf_apply(grads, trainable_variables)

        def apply_where_finite_everywhere(strategy, grads, variables):
            verdicts = strategy.experimental_local_results(
                strategy.extended.call_for_each_replica(self.check_finite, args=(grads,)))
            finite = tf.reduce_all(tf.stack([tf.identity(each) for each in verdicts]))

            def apply():
                strategy.extended.call_for_each_replica(self._stateful_handle_finite_grads,
                                                        args=(grads, variables))

            keras.ops.cond(finite, apply, self._stateful_handle_non_finite_grads)

        tf.distribute.get_replica_context().merge_call(apply_where_finite_everywhere,
                                                       args=(grads, trainable_variables))


# --- Deserialisation: the frames tuner.apply.dtype_origins reads ---------------------------------

# Every way of getting a model from a saved config ends in one of these Keras functions, whose
# locals hold the config being deserialised: ``Layer.from_config``/``Model.from_config`` (local
# ``config``) and ``keras.src.models.functional.functional_from_config`` (which pops the layer
# list into its local ``functional_config``); ``keras.models.clone_model`` holds the model it
# clones in its local ``model``. Names and locals as of Keras 3.0 (checked 3.10).
CONFIG_FRAMES = ("from_config", "functional_from_config")
CONFIG_LOCALS = ("functional_config", "config")
CLONE_FRAME = "clone_model"
CLONE_LOCAL = "model"
