"""``cfg.apply(model)``: a config applied to a model that already exists in memory.

A model loaded or built before the config's scope opened carries the dtypes it was made with.
The scope decides a layer's dtype as it is constructed (tuner.apply.scope); this module does
what the scope would have done, for a model that is past that point, by the same rule as a
saved model (tuner.apply.dtype_origins): every layer in the model's own dtype (the one most of
its layers carry) takes the config's policy, and a layer in another dtype (a float32 softmax in
a mixed model) keeps it; then the config's float32 placements apply.

- Where the variables keep their dtype (``float32`` and the mixed policies keep float32
  weights), the model is changed **in place** and the same object is returned, compiled or
  not: each layer's ``dtype_policy`` is set (Keras's own per-layer mechanism), and a compiled
  model's train, test and predict functions are dropped so that the next ``fit`` traces them
  with the new dtypes.
- Where they change (to or from ``float16``/``bfloat16``, whose weights are 16-bit), the
  model is **rebuilt**: ``keras.models.clone_model`` inside the config's scope (each layer
  from its config; a subclassed model needs ``get_config``), then the weights are copied over,
  cast. A **new, uncompiled** model is returned; the old one is left as it was.
"""

from __future__ import annotations

from typing import Any

from tuner.apply.config_data import PURE_POLICIES, ConfigData
from tuner.apply.dtype_origins import DtypeOrigin, model_layer_dtypes, own_dtype, policy_name
from tuner.errors import ConfigError, first_line


def _weights_dtype(policy: str | None) -> str:
    return policy if policy in PURE_POLICIES else "float32"


def apply_to_model(cfg: ConfigData, model: Any) -> Any:
    """The model under ``cfg``: the same object changed in place, or a rebuilt copy where the
    weights' dtype changes (see the module docstring)."""
    import keras

    if not isinstance(model, keras.Model):
        raise ConfigError(f"cfg.apply() takes a keras.Model. Received: model={model!r} (of "
                          f"type {type(model).__name__}). Pass the model, or build it inside "
                          "`with cfg.scope():`.")
    own = own_dtype(model_layer_dtypes(model)) or policy_name(model.dtype_policy)
    if _weights_dtype(own) != _weights_dtype(cfg.policy):
        return _rebuilt(cfg, model)
    _in_place(cfg, model, own)
    return model


def _in_place(cfg: ConfigData, model: Any, own: str | None) -> None:
    import keras

    from tuner.apply.float32_outputs import cast_outputs_to_float32
    from tuner.apply.layers import layer_paths
    from tuner.apply.scope import Float32Placer

    placer = Float32Placer(cfg)
    members = [(model, model.name)] + layer_paths(model)
    for layer, _ in members:
        name = policy_name(layer.dtype_policy)
        if isinstance(layer, keras.layers.InputLayer) or name is None:
            continue
        if name == own and name != cfg.policy:
            layer.dtype_policy = keras.DTypePolicy(cfg.policy)
            placer.note_origin(layer, DtypeOrigin.SAVED)
        elif name == cfg.policy:
            placer.note_origin(layer, DtypeOrigin.POLICY)
        else:
            placer.note_origin(layer, DtypeOrigin.SAVED_KEPT)  # placed by whoever made it
    if placer.placing:
        placer.place_built_model(model)
    if placer.outputs:
        cast_outputs_to_float32(model)
    for name in ("train_function", "test_function", "predict_function"):
        if getattr(model, name, None) is not None:
            setattr(model, name, None)  # traced with the old dtypes


def _rebuilt(cfg: ConfigData, model: Any) -> Any:
    import keras

    from tuner.apply.scope import precision_scope

    try:
        with precision_scope(cfg):
            clone = keras.models.clone_model(model)
            if not clone.built and model.built:
                build_config = model.get_build_config()
                if build_config:
                    clone.build_from_config(build_config)
        source, target = model.weights, clone.weights
        if len(source) != len(target):
            raise ValueError(f"the rebuilt model has {len(target)} weights, the model "
                             f"{len(source)}")
        for old, new in zip(source, target):
            new.assign(keras.ops.cast(old.value, new.dtype))
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - said in one line, with the fix
        raise ConfigError(
            f"cfg.apply() could not rebuild model {model.name!r} ({type(model).__name__}) "
            f"with {cfg.policy} weights: {type(exc).__name__}: {first_line(exc, 200)}. Fix: "
            "build or load the model inside `with cfg.scope():` (a subclassed model also "
            "needs get_config() to be rebuilt)") from exc
    return clone
