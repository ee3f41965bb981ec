"""A model compiled as its config was tuned: ``cfg.compile(model, ...)``, ``model.compile``
inside ``cfg.scope()``, and the check the guard makes before a training starts.

The trap this closes: Keras's ``compile`` wraps the optimizer in a dynamic
``LossScaleOptimizer`` of its own wherever the model's policy is ``mixed_float16``
(``auto_scale_loss=True``, its default). A config tuned with no loss scale, or a fixed one,
then trains under a scale nobody tuned; an optimizer not passed through ``wrap_optimizer``
trains without the tuned scale and epsilon. Three ways keep it from happening:

- ``compile_model`` (``cfg.compile``) wraps the optimizer and turns Keras's own scale off: one
  call where there were three;
- while ``cfg.scope()`` is open, ``model.compile`` does the same (``compile_arguments``), so a
  model compiled in the scope trains as tuned whether or not its optimizer was wrapped;
- ``untuned(cfg, model)`` says in one line how a compiled model's optimizers differ from the
  config (the kind of loss scale, the optimizer epsilon), and the guard refuses such a model
  before its first step.

A Keras ``LossScaleOptimizer`` the user made and passed themselves is left as it is (their
choice): the check says whether it is the kind the config was tuned with.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import keras

from tuner.apply.config_data import ConfigData
from tuner.apply.loss_scaling import held_optimizers, is_wrapped, loss_scale_kind, wrap_optimizer
from tuner.apply.vocabulary import LossScaleKind

FIX = ("Compile with cfg.compile(model, optimizer, loss=...), or inside cfg.scope(), or pass "
       "the optimizer through cfg.wrap_optimizer() and **cfg.compile_kwargs() to compile")


def tuned_optimizer(cfg: ConfigData, optimizer: Any) -> Any:
    """``optimizer`` as the config trains it: a name (``"adam"``) made an optimizer, a plain
    optimizer wrapped (loss scale, epsilon, weight update); one already wrapped, or a
    ``LossScaleOptimizer`` the caller made, as it is."""
    if isinstance(optimizer, (str, dict)):
        optimizer = keras.optimizers.get(optimizer)
    if is_wrapped(optimizer) or isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer
    return wrap_optimizer(cfg, optimizer)


def compile_arguments(cfg: ConfigData, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``model.compile``'s arguments as the config trains them: the optimizer, where one is
    given, through ``tuned_optimizer``; Keras's own loss scale off unless asked for."""
    kwargs = dict(kwargs)
    if args and args[0] is not None:
        args = (tuned_optimizer(cfg, args[0]), *args[1:])
    elif kwargs.get("optimizer") is not None:
        kwargs["optimizer"] = tuned_optimizer(cfg, kwargs["optimizer"])
    kwargs.setdefault("auto_scale_loss", False)
    return args, kwargs


def compile_model(cfg: ConfigData, model: keras.Model, optimizer: Any = "adam",
                  **kwargs: Any) -> keras.Model:
    """``model.compile(optimizer=..., **kwargs)`` with the optimizer wrapped for the config
    and no second loss scale from Keras; returns the model."""
    args, kwargs = compile_arguments(cfg, (optimizer,), kwargs)
    model.compile(*args, **kwargs)
    return model


def expected_kind(cfg: ConfigData) -> LossScaleKind:
    """The loss scaling a training under ``cfg`` applies (none where compute is not float16)."""
    kind = LossScaleKind(cfg.loss_scale.kind)
    return kind if cfg.compute_dtype == "float16" and kind.scales else LossScaleKind.NONE


def untuned(cfg: ConfigData, model: keras.Model) -> str | None:
    """How ``model``'s optimizers differ from what ``cfg`` was tuned with, in one line; None
    when they do not. A model whose own ``compile`` keeps optimizers (a GAN's) is checked on
    those, not on the default one Keras's ``compile`` adds, which its ``train_step`` ignores."""
    held = held_optimizers(model)
    if len(held) > 1:
        held.pop("optimizer", None)
    for name, optimizer in held.items():
        problem = _difference(cfg, optimizer)
        if problem:
            where = f"{name} ({type(optimizer).__name__})" if len(held) > 1 else \
                type(optimizer).__name__
            return f"the model's optimizer {where} {problem}. {FIX}."
    return None


def _difference(cfg: ConfigData, optimizer: Any) -> str | None:
    expected, actual = expected_kind(cfg), loss_scale_kind(optimizer)
    if actual != expected:
        made = " (Keras's own, added by compile under mixed_float16)" \
            if type(optimizer) is keras.optimizers.LossScaleOptimizer else ""
        applies = "applies no loss scale" if actual is LossScaleKind.NONE \
            else f"applies a {actual.value} loss scale{made}"
        tuned = "no loss scale" if expected is LossScaleKind.NONE \
            else f"a {expected.value} loss scale"
        return f"{applies}, but the config was tuned with {tuned}"
    wanted = cfg.epsilon.optimizer
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    have = getattr(inner, "epsilon", None)
    if wanted is not None and (have is None or abs(have - wanted) > 1e-6 * wanted):
        return f"has epsilon {have}, but the config was tuned with {wanted:g}"
    return None


@contextlib.contextmanager
def compiling_as_tuned(cfg: ConfigData) -> Iterator[None]:
    """While open, ``model.compile`` (and a custom ``compile``'s ``super().compile``) takes its
    arguments through ``compile_arguments``: a model compiled in ``cfg.scope()`` trains as
    tuned. The patch replaces ``compile`` on the class that defines it (Keras's trainer), so
    that Keras still tells a model's own ``compile`` from its default (it compares the two:
    a model loaded in the scope is compiled from its saved config as before)."""
    owner = next(cls for cls in keras.Model.__mro__ if "compile" in vars(cls))
    original = vars(owner)["compile"]

    def compile(self, *args, **kwargs):
        args, kwargs = compile_arguments(cfg, args, kwargs)
        return original(self, *args, **kwargs)

    owner.compile = functools.wraps(original)(compile)
    try:
        yield
    finally:
        owner.compile = original
