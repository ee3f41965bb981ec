"""A training step of the user's own, the step of a custom training loop, run where Keras runs
``train_step``.

The step is a function ``train_step(model, optimizer, batch)`` that trains on one batch and
returns its loss: a scalar tensor, or a dict of losses (``"loss"``, or names ending in
``loss``: a GAN's ``d_loss`` and ``g_loss``), each judged and watched. ``optimizer`` is what the
loop uses: one Keras optimizer, or a dict of them by name (a GAN's ``{"generator": ...,
"discriminator": ...}``). It scales each loss with its own optimizer inside the tape
(``optimizer.scale_loss(loss)``) and applies the gradients with ``apply_gradients``, as
Keras's own ``train_step`` does.

``install`` makes it the model's training step (an attribute of this one model, not of its
class) and the optimizers the model's attributes (``optimizer``, or one per name of a dict,
``generator`` as ``generator_optimizer``), so that everything that runs a Keras training step
runs it as it is: ``fit`` in the tuner's trials, timed and judged as any model's, and the
guard's probes and repairs (tuner.apply.guard), in ``fit`` or in the loop's own
(tuner.apply.guard.loop). ``uninstall`` takes both back.
"""

from __future__ import annotations

from typing import Any, Callable

import keras

from tuner.errors import ConfigError, describe

Step = Callable[[keras.Model, Any, Any], Any]

# Set on a model whose training step is a custom loop's: what ``uninstall`` takes back.
_INSTALLED = "_precision_tuner_own_step"


def named_optimizers(optimizer: Any, what: str = "optimizer") -> dict[str, Any]:
    """The model attribute each optimizer goes under: ``optimizer`` for one; for a dict, each
    name, with ``_optimizer`` added where it does not end so (``generator_optimizer``)."""
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return {"optimizer": optimizer}
    if isinstance(optimizer, dict) and optimizer and all(
            isinstance(name, str) and name.isidentifier()
            and isinstance(value, keras.optimizers.Optimizer)
            for name, value in optimizer.items()):
        return {name if name.endswith("optimizer") else f"{name}_optimizer": value
                for name, value in optimizer.items()}
    raise ConfigError(f"{what} must be a Keras optimizer or a dict of them by name (a GAN's "
                      f"{{'generator': ..., 'discriminator': ...}}). Received: {what}="
                      f"{describe(optimizer)}")


def each_optimizer(optimizer: Any, change: Callable[[Any], Any]) -> Any:
    """``optimizer`` (one, or a dict of them) with ``change`` applied to each, in its shape."""
    if isinstance(optimizer, dict):
        return {name: change(value) for name, value in optimizer.items()}
    return change(optimizer)


def step_logs(returned: Any) -> dict[str, Any]:
    """What the step returned, as the logs of a Keras training step: a loss tensor as
    ``{"loss": it}``; a dict as it is, where it names at least one loss."""
    if isinstance(returned, dict):
        if not any(str(name) == "loss" or str(name).endswith("loss") for name in returned):
            raise ConfigError("a training step's dict of losses must name one \"loss\" or "
                              f"\"*loss\". Received the names {sorted(map(str, returned))}. "
                              "Name each loss so (d_loss, g_loss) or return the loss itself")
        return dict(returned)
    if returned is None:
        raise ConfigError("the training step returned None. Return the step's loss (the "
                          "tensor before scale_loss), or a dict of losses by name")
    return {"loss": returned}


def compile_for_step(model: keras.Model, optimizer: Any, **kwargs: Any) -> None:
    """``model.compile`` for a step of its own: with the one optimizer as ``model.optimizer``
    (a dict's are the step's, set by ``install``; compile then keeps Keras's default, which no
    step applies), Keras adding no loss scale of its own; ``kwargs`` as ``compile`` takes
    them (loss, metrics, jit_compile)."""
    single = optimizer if isinstance(optimizer, keras.optimizers.Optimizer) else None
    model.compile(optimizer=single or "rmsprop", auto_scale_loss=False, **kwargs)


def install(model: keras.Model, step: Step, optimizer: Any) -> dict[str, Any]:
    """Make ``step(model, optimizer, batch)`` the model's training step and each optimizer a
    model attribute (``named_optimizers``); returns those attributes. ``model.compile`` first:
    compile sets ``model.optimizer`` (to ``None`` where the loop has a dict of its own)."""
    if not callable(step):
        raise ConfigError(f"train_step must be a function train_step(model, optimizer, batch) "
                          f"returning the loss. Received: train_step={describe(step)}")
    named = named_optimizers(optimizer)
    taken = [name for name in named if name != "optimizer" and name in vars(model)
             and vars(model)[name] is not named[name]]
    if taken:
        raise ConfigError(f"the model already has an attribute {taken[0]!r}, which the "
                          "optimizer of that name would replace. Name the optimizer otherwise")

    def train_step(data):
        return step_logs(step(model, optimizer, data))

    added = [name for name in named if name not in vars(model)]
    for name, value in named.items():
        setattr(model, name, value)
    model.train_step = train_step
    object.__setattr__(model, _INSTALLED, tuple(added))   # untracked by Keras
    return named


def installed(model: keras.Model) -> bool:
    return hasattr(model, _INSTALLED)


def uninstall(model: keras.Model) -> None:
    """Take back what ``install`` set: the model's class's ``train_step`` again, and the
    optimizer attributes it added (compile's ``optimizer`` stays)."""
    added = vars(model).pop(_INSTALLED, None)
    if added is None:
        return
    vars(model).pop("train_step", None)
    for name in added:
        if name != "optimizer":
            vars(model).pop(name, None)
