"""The task's model as a trial trains it: compiled under a config the way the user's own
training compiles it, and run once, eagerly, where a check must watch its layers.

Two ways to compile (the task-file contract, docs/how-to/task-files.md):

- the tuner compiles: ``LOSS``, ``METRICS`` and ``make_optimizer()`` (default Adam), its
  optimizer wrapped with the config (``PrecisionConfig.wrap_optimizer``);
- the task compiles, ``compile_model(model, wrap_optimizer)``: the Keras guide's GAN
  (``compile(d_optimizer, g_optimizer, loss_fn)``), any model that keeps optimizers of its own.
  Every optimizer it passes through ``wrap_optimizer`` gets the config's loss scale, epsilon and
  weight update, and is named after the model attribute that holds it (``d_optimizer``), so
  that each one's loss scale and skipped steps are recorded (tuner.worker.trial.steps).

A model without ``call()`` is trained by its ``train_step`` alone and has no forward pass to
watch. The checks that watch one (the input checks, the memory count, the search for the first
non-finite layer, the diagnostics) watch a training step instead (``watch_step``): run eagerly
on a batch as ``fit`` hands it over, it calls every sub-model (a generator, a discriminator)
on exactly what the ``train_step`` feeds it.

Keras is imported where it is used: the driver imports the worker's face
(tuner.worker.process.trial_worker), which imports this.
"""

from __future__ import annotations

from typing import Any, Callable

from tuner.errors import ConfigError, TaskError, describe, first_line

Named = list[tuple[str, Any]]   # (the model attribute holding it, the optimizer)


def has_forward_pass(model) -> bool:
    """Whether the model defines ``call()`` (a GAN trained by its train_step alone does not)."""
    import keras

    return type(model).call is not keras.Model.call


def compile_for_trial(model, task, config) -> Named:
    """Compile ``model`` as the user's training would under ``config``; its optimizers, named."""
    if task.compile_model is None:
        optimizer = config.wrap_optimizer(task.optimizer())
        model.compile(optimizer=optimizer, loss=task.loss, metrics=task.metrics,
                      **config.compile_kwargs())
        return [("optimizer", optimizer)]
    return compile_by_task(model, task, config.wrap_optimizer)


def compiling_own_step(module, name: str) -> Callable:
    """The ``compile_model`` of a task that hands the tuner its own training step,
    ``train_step(model, optimizer, batch)`` (a custom loop's: tuner.apply.own_step): the
    optimizers ``make_optimizer()`` makes (one, or a dict by name; default Adam) wrapped, the
    model compiled with the task's ``LOSS`` (for evaluation; optional) and ``METRICS``, and the
    step made the model's training step, which ``fit`` then runs in every trial."""

    def compile_model(model, wrap_optimizer) -> None:
        import keras

        from tuner.apply import own_step

        try:
            made = module.make_optimizer() if hasattr(module, "make_optimizer") \
                else keras.optimizers.Adam(1e-3)
        except Exception as exc:
            raise TaskError(f"make_optimizer() in {name} raised {type(exc).__name__}: "
                            f"{first_line(exc)}. Fix the task file.") from exc
        try:
            own_step.named_optimizers(made, "make_optimizer()")
        except ConfigError as exc:
            raise TaskError(f"{name}: {exc}") from None
        optimizer = own_step.each_optimizer(made, wrap_optimizer)
        own_step.compile_for_step(model, optimizer, loss=getattr(module, "LOSS", None),
                                  metrics=getattr(module, "METRICS", None))
        own_step.install(model, module.train_step, optimizer)

    return compile_model


def compile_by_task(model, task, wrap: Callable) -> Named:
    """Run the task's ``compile_model(model, wrap_optimizer)``, every optimizer it makes passed
    through ``wrap``; checked: it must wrap at least one optimizer and compile the model."""
    import keras

    name = task.path.name
    wrapped: list = []

    def wrap_optimizer(optimizer):
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TaskError(f"compile_model in {name} passed wrap_optimizer something that is "
                            f"not a Keras optimizer. Received: {describe(optimizer)}. Pass "
                            "each optimizer itself: wrap_optimizer(keras.optimizers.Adam(1e-4))")
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            raise TaskError(f"compile_model in {name} passed wrap_optimizer a "
                            "LossScaleOptimizer. Pass the plain optimizer: the config adds the "
                            "loss scale it tunes.")
        wrapped.append(wrap(optimizer))
        return wrapped[-1]

    try:
        task.compile_model(model, wrap_optimizer)
    except TaskError:
        raise
    except Exception as exc:
        raise TaskError(f"compile_model(model, wrap_optimizer) in {name} raised "
                        f"{type(exc).__name__}: {first_line(exc)}. Fix the task file.") from exc
    if not wrapped:
        raise TaskError(f"compile_model(model, wrap_optimizer) in {name} passed no optimizer "
                        "through wrap_optimizer, so no config would reach the training. Wrap "
                        "every optimizer it makes: d_optimizer=wrap_optimizer(keras.optimizers"
                        ".Adam(1e-4))")
    if not getattr(model, "compiled", False):
        raise TaskError(f"compile_model(model, wrap_optimizer) in {name} did not compile the "
                        "model. Call model.compile(...) in it (a custom compile() must call "
                        "super().compile()).")
    _undo_automatic_scaling(model, wrapped)
    return _named(model, wrapped)


def _undo_automatic_scaling(model, wrapped: list) -> None:
    """Keras's ``compile`` wraps the model's optimizer in a LossScaleOptimizer of its own under
    ``mixed_float16`` (``auto_scale_loss``); over one the config wrapped, that second scale is
    not the config's, so it is taken off, as ``compile_kwargs`` keeps it off when the tuner
    compiles."""
    import keras

    outer = getattr(model, "optimizer", None)
    if isinstance(outer, keras.optimizers.LossScaleOptimizer) \
            and not any(outer is o for o in wrapped) \
            and any(outer.inner_optimizer is o for o in wrapped):
        model.optimizer = outer.inner_optimizer


def _named(model, optimizers: list) -> Named:
    from tuner.apply.loss_scaling import held_optimizers

    attributes = {id(value): key for key, value in held_optimizers(model).items()}
    named: Named = []
    for optimizer in optimizers:
        name = attributes.get(id(optimizer)) or optimizer.name
        taken = {existing for existing, _ in named}
        while name in taken:
            name += "_"
        named.append((name, optimizer))
    return named


def batch_size_of(x) -> int | None:
    import tensorflow as tf

    leaves = tf.nest.flatten(x)
    return int(leaves[0].shape[0]) if leaves and leaves[0].shape.rank else None


def fit_input(batch: tuple):
    """What ``fit`` hands ``train_step`` for one of the fixed batches: ``x`` alone for data
    without labels, the tuple otherwise (tuner.worker.trial.steps.batch_dataset feeds the same)."""
    return batch[0] if len(batch) == 1 else tuple(batch)


def watch_step(model, batch: tuple, *, restore: bool = False) -> Any:
    """One ``train_step`` on ``batch``, eagerly (so that layer-call hooks see real tensors);
    its logs. With ``restore``, every variable of the model and of its optimizers that existed
    before is put back afterwards: the step is watched, not trained."""
    from tuner.apply.instruments import HostCopy

    state = state_variables(model) if restore else []
    saved = HostCopy(state)
    try:
        return model.train_step(fit_input(batch))
    finally:
        saved.put_back(state)


def state_variables(model) -> list:
    """The model's variables and those of every optimizer it holds that exist by now (a
    LossScaleOptimizer's inner optimizer's too), each once."""
    from tuner.apply.loss_scaling import held_optimizers, optimizer_variables

    seen: dict[int, Any] = {id(v): v for v in model.variables}
    for optimizer in held_optimizers(model).values():
        for variable in optimizer_variables(optimizer):
            seen.setdefault(id(variable), variable)
    return list(seen.values())


def one_pass(model, batch: tuple, *, training: bool, restore: bool = False) -> Any:
    """The model's forward pass on ``batch``'s x where it has one, else a watched training
    step (``watch_step``): what a layer-call hook around it sees."""
    import keras

    if has_forward_pass(model):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
        return model(x, training=training)
    return watch_step(model, batch, restore=restore)
