"""Weight updates that survive 16-bit weights: stochastic rounding and compensated summation.

Under a pure ``float16``/``bfloat16`` policy the weights themselves are 16-bit, and an update
smaller than half the spacing between neighbouring 16-bit values (bfloat16 keeps 8 significant
bits: 2^-8 relative) is lost to round-to-nearest: the weight does not move. Two remedies, applied
by the optimizer to each model weight (its slots are left alone):

- ``stochastic`` (Gupta et al., 2015): the new weight is computed in float32 and rounded to one
  of its two 16-bit neighbours at random, up with probability equal to how far it lies towards
  the upper one, so the expected stored value equals the float32 result. Seeded: the random
  numbers come from a stateless generator keyed by the optimizer's step and the weight.
- ``compensated`` (Kahan summation): a 16-bit buffer per weight keeps what the last update lost
  to rounding and adds it back into the next one, so the weight stays within about one spacing
  of the exact sum of its updates.

Both also do the optimizer's arithmetic for a 16-bit weight in float32: Keras computes it in
the weight's dtype, where Adam's ``beta_2 = 0.999`` rounds to 1.0 in bfloat16 and its step size
``lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)`` becomes exactly 0 — the weights never move. The
optimizer's ``update_step`` is handed a float32 view of the weight (:class:`_Float32View`), so
its casts go to float32, and the view's updates come back here to be stored. The optimizer's
slots (Adam's moments) stay in the weight's dtype.

``nearest`` is Keras's own behaviour. The wrapping is done on the optimizer instance (its
``update_step``, ``assign``/``assign_add``/``assign_sub``, ``build`` and variable lookup), so
every Keras optimizer that updates weights through them — all the built-in ones — gets it, and
so does the inner optimizer of a ``LossScaleOptimizer``.
"""

from __future__ import annotations

import functools
from typing import Any

from tuner.apply.vocabulary import WEIGHT_UPDATES, WeightUpdate

# Significand bits after the leading one, and the smallest normal exponent, of each 16-bit type.
_FORMAT = {"bfloat16": (7, -126), "float16": (10, -14)}


def stochastic_round(value32, dtype: str, uniform):
    """Round float32 ``value32`` to ``dtype`` stochastically, given ``uniform`` in [0, 1) of the
    same shape: to the lower or upper neighbour, with E[result] == value32 (within range)."""
    import tensorflow as tf

    bits, min_exponent = _FORMAT[dtype]
    value32 = tf.convert_to_tensor(value32, tf.float32)
    # The float32 exponent read from the bits is exact, unlike floor(log2(|x|)).
    raw = tf.bitwise.bitwise_and(tf.bitwise.right_shift(tf.bitcast(value32, tf.int32), 23), 0xFF)
    exponent = tf.maximum(raw - 127, min_exponent)
    # Spacings below float32's smallest normal would flush to zero on CPUs: keep them above.
    spacing = tf.pow(2.0, tf.cast(tf.maximum(exponent - bits, -126), tf.float32))
    lower = tf.floor(value32 / spacing) * spacing
    upper_share = (value32 - lower) / spacing
    rounded = lower + spacing * tf.cast(uniform < upper_share, tf.float32)
    finite = tf.math.is_finite(value32)
    return tf.cast(tf.where(finite, rounded, value32), dtype)


def wrap(optimizer, mode: "str | WeightUpdate", seed: int = 0):
    """Make ``optimizer`` update its 16-bit model weights by ``mode``; returns it."""
    if mode not in WEIGHT_UPDATES:
        raise ValueError(f"weight_update must be one of {', '.join(WEIGHT_UPDATES)}. "
                         f"Received: {mode!r}")
    mode = WeightUpdate(mode)
    if not mode.wraps:
        return optimizer
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's own
    _ensure_view_conversion()
    _Updates(inner, mode, seed).install()
    return optimizer


class _Updates:
    def __init__(self, optimizer, mode: WeightUpdate, seed: int) -> None:
        self.optimizer = optimizer
        self.mode = mode
        self.seed = seed
        self.weights: dict[int, int] = {}         # id(weight) -> its index
        self.compensation: dict[int, Any] = {}    # id(weight) -> Kahan buffer

    def install(self) -> None:
        from tuner.apply.keras_internals import VARIABLE_INDEX_METHOD

        optimizer = self.optimizer
        self.keras_assign = optimizer.assign
        for name in ("build", "update_step", VARIABLE_INDEX_METHOD, "assign", "assign_add",
                     "assign_sub"):
            method = getattr(optimizer, name)
            # Keras's private slot-index method is wrapped by a method named for what it does.
            wrapper = self._variable_index if name == VARIABLE_INDEX_METHOD \
                else getattr(self, f"_{name}")
            object.__setattr__(optimizer, name, functools.wraps(method)(
                functools.partial(wrapper, method)))

    def _update_step(self, keras_update_step, gradient, variable, learning_rate):
        if self._sixteen_bit(variable) is None:
            return keras_update_step(gradient, variable, learning_rate)
        return keras_update_step(gradient, _Float32View(variable), learning_rate)

    def _variable_index(self, keras_get_variable_index, variable):
        if isinstance(variable, _Float32View):
            variable = variable.weight
        return keras_get_variable_index(variable)

    def _sixteen_bit(self, variable) -> str | None:
        if isinstance(variable, _Float32View):
            variable = variable.weight
        dtype = getattr(variable, "dtype", None)
        name = getattr(dtype, "name", str(dtype))
        return name if id(variable) in self.weights and name in _FORMAT else None

    def _build(self, keras_build, variables, *args, **kwargs):
        keras_build(variables, *args, **kwargs)
        for index, variable in enumerate(variables):
            # The TensorFlow backend hands update_step the Keras variable's tf.Variable.
            same = [variable] + ([variable.value] if hasattr(variable, "value") else [])
            buffer = None
            if self.mode.keeps_buffers and getattr(variable.dtype, "name",
                                                      str(variable.dtype)) in _FORMAT:
                buffer = self.optimizer.add_variable_from_reference(
                    variable, "compensation", initializer="zeros")
            for each in same:
                self.weights[id(each)] = index
                if buffer is not None:
                    self.compensation[id(each)] = buffer

    def _assign(self, keras_assign, variable, value):
        dtype = self._sixteen_bit(variable)
        if dtype is None:
            return keras_assign(variable, value)
        return self._update(variable, dtype, target=value)

    def _assign_add(self, keras_assign_add, variable, value):
        dtype = self._sixteen_bit(variable)
        if dtype is None:
            return keras_assign_add(variable, value)
        return self._update(variable, dtype, delta=value)

    def _assign_sub(self, keras_assign_sub, variable, value):
        dtype = self._sixteen_bit(variable)
        if dtype is None:
            return keras_assign_sub(variable, value)
        import tensorflow as tf

        return self._update(variable, dtype, delta=-tf.convert_to_tensor(value))

    def _update(self, variable, dtype: str, *, delta=None, target=None):
        """Store ``variable + delta`` (or ``target``) in 16 bits by this mode."""
        import tensorflow as tf

        if isinstance(variable, _Float32View):
            variable = variable.weight
        current = tf.cast(tf.convert_to_tensor(variable), tf.float32)
        if delta is None:
            delta = tf.cast(target, tf.float32) - current
        delta = tf.cast(delta, tf.float32)
        if self.mode.rounds_at_random:
            step = tf.cast(self.optimizer.iterations, tf.int32)
            uniform = tf.random.stateless_uniform(
                tf.shape(current), seed=tf.stack([step, self.seed * 100003
                                                  + self.weights[id(variable)]]))
            return self.keras_assign(variable, stochastic_round(current + delta, dtype, uniform))
        # Kahan: what the last update lost comes back into this one; all of it in 16 bits.
        buffer = self.compensation[id(variable)]
        weight = tf.convert_to_tensor(variable)
        wanted = tf.cast(delta, dtype) - tf.convert_to_tensor(buffer)
        stored = weight + wanted
        buffer.assign((stored - weight) - wanted)
        return self.keras_assign(variable, stored)


class _Float32View:
    """A 16-bit weight as the optimizer's arithmetic sees it: dtype float32, its value read as
    float32. Updates to it reach the weight through the optimizer's wrapped assign methods."""

    dtype = "float32"

    def __init__(self, weight) -> None:
        self.weight = weight

    def __getattr__(self, name: str):
        # Anything else an optimizer reads (shape, name, path, ...) is the weight's own.
        return getattr(self.weight, name)

    def value_as_float32(self):
        import tensorflow as tf

        return tf.cast(tf.convert_to_tensor(self.weight), tf.float32)


def _register_view_conversion() -> None:
    import tensorflow as tf

    tf.register_tensor_conversion_function(
        _Float32View, lambda view, dtype=None, name=None, as_ref=False: view.value_as_float32())


_register_view_conversion_done = False


def _ensure_view_conversion() -> None:
    global _register_view_conversion_done
    if not _register_view_conversion_done:
        _register_view_conversion()
        _register_view_conversion_done = True
