"""How much of a model a config's 16-bit dtype reaches, and what to say when it reaches none.

A config that sets ``mixed_bfloat16`` can leave a model in float32: a model loaded before the
config's scope opened, layers built with ``dtype="float32"`` written in their code, a library
that passes its own dtype down. Such a trial trains float32 and looks like a slow 16-bit
config; the tool must say so instead (tuner.worker.trial.trial fails it as ``precision_unreached``,
the guard and ``precision-tuner train`` warn).

``precision_reach(model, policy, origin_of)`` counts, as plain data, the model's parameters by
the compute dtype of the layer that owns them (each weight once, at the innermost layer that
created it), and names the layers outside the 16-bit dtype with where their dtype came from
(tuner.apply.dtype_origins). ``activation_share`` reads the activations' share from the
trial's memory record (tuner.worker.trial.memory), which counts every layer call's float outputs.
"""

from __future__ import annotations

from typing import Any, Callable

from tuner.apply.config_data import compute_dtype_of
from tuner.apply.dtype_origins import DtypeOrigin
from tuner.apply.dtype_origins import origin_of as recorded_origin

# Below this share of the parameters and of the computation (the activations once measured,
# the layers before) in its 16-bit dtype, a config has reached (almost) none of the model: its
# trial measures float32, not the config. A 16-bit model whose parameters sit mostly in one
# float32 layer (an embedding table kept exact) is reached: its computation is 16-bit.
REACH_FLOOR = 0.05
_SHOWN_LAYERS = 3
_ITEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def precision_reach(model: Any, policy: str,
                    origin_of: Callable[[Any], DtypeOrigin] | None = None) -> dict[str, Any]:
    """``{"dtype", "parameters": {dtype: count}, "parameter_share", "layer_share", "elsewhere":
    [{"path", "dtype", "origin", "parameters"}, ...]}``: ``parameter_share`` is the share of the
    parameters whose layer computes in ``policy``'s compute dtype (None for a model without
    parameters, or one not built yet); ``layer_share`` the share of its layers (any, weights or
    not) that compute in it (None for a model without layers); ``elsewhere`` the layers with
    parameters that compute in another dtype, most parameters first."""
    from tuner.apply.layers import layer_paths

    dtype = compute_dtype_of(policy)
    parameters: dict[str, int] = {}
    elsewhere: list[dict[str, Any]] = []
    layers = in_dtype = 0
    for layer, path in [(model, model.name)] + layer_paths(model):
        if layer is not model and type(layer).__name__ != "InputLayer":
            layers += 1
            in_dtype += str(layer.compute_dtype) == dtype
        count = _own_parameters(layer)
        if not count:
            continue
        layer_dtype = str(layer.compute_dtype)
        parameters[layer_dtype] = parameters.get(layer_dtype, 0) + count
        if layer_dtype != dtype:
            origin = (origin_of or recorded_origin)(layer)
            elsewhere.append({"path": path, "dtype": layer_dtype, "origin": origin.value,
                              "parameters": count})
    total = sum(parameters.values())
    elsewhere.sort(key=lambda entry: -entry["parameters"])
    return {"dtype": dtype, "parameters": parameters,
            "parameter_share": parameters.get(dtype, 0) / total if total else None,
            "layer_share": in_dtype / layers if layers else None, "elsewhere": elsewhere}


def _own_parameters(layer: Any) -> int:
    from tuner.apply.keras_internals import own_variables

    # Only the weights a layer created itself (its sublayers' are their own): each weight is
    # counted once, with the layer that computes with it.
    own = own_variables(layer)
    count = 0
    for variable in own:
        if str(variable.dtype) not in _ITEM_BYTES:
            continue  # integer state (a seed, a counter) is not a parameter
        size = 1
        for dim in variable.shape:
            size *= int(dim)
        count += size
    return count


def activation_share(memory: dict[str, Any] | None, dtype: str) -> float | None:
    """The share of the activations (elements, every layer call's float outputs) computed in
    ``dtype``, from a trial's memory record; None without one."""
    activations = (memory or {}).get("activations") or {}
    elements = {name: size / _ITEM_BYTES[name] for name, size in activations.items()
                if name in _ITEM_BYTES}
    total = sum(elements.values())
    return elements.get(dtype, 0) / total if total else None


def computation_share(reach: dict[str, Any]) -> tuple[float | None, str]:
    """The share of the model's computation in the 16-bit dtype and what it counts: the
    activations once a trial has measured them, the layers before."""
    if reach.get("activation_share") is not None:
        return reach["activation_share"], "activations"
    return reach.get("layer_share"), "layers"


def reached_none(reach: dict[str, Any] | None) -> bool:
    """A 16-bit config whose dtype computes (almost) none of the model: under the floor in its
    parameters and in its computation, of those that are known."""
    if not reach or reach["dtype"] == "float32":
        return False
    shares = [share for share in (reach.get("parameter_share"), computation_share(reach)[0])
              if share is not None]
    return bool(shares) and all(share < REACH_FLOOR for share in shares)


_FIXES = {
    DtypeOrigin.CODE.value: "construct them without dtype= (or with dtype=None) so that they "
                            "take the config's policy",
    DtypeOrigin.OUTSIDE.value: "build or load the model inside the config's scope "
                               "(build_model() in a task file, `with cfg.scope():` in a "
                               "training script), or pass it through `model = cfg.apply(model)`",
    DtypeOrigin.SAVED_KEPT.value: "the saved model keeps them in their dtype on purpose; save it "
                                  "again without that placement, or build them in code",
    DtypeOrigin.PLACEMENT.value: "drop the float32 group or layer pattern that selects them",
    DtypeOrigin.SAVED.value: "load the model inside the config's scope",
    DtypeOrigin.POLICY.value: "check the layer's own dtype handling",
}


def unreached_line(reach: dict[str, Any], policy: str) -> str:
    """One line: the config reaches (almost) none of the model, which layers, where their
    dtype came from, and the fix."""
    elsewhere = reach["elsewhere"]
    share = reach["parameter_share"] or 0.0
    names = ", ".join(entry["path"] for entry in elsewhere[:_SHOWN_LAYERS]) or "its layers"
    more = len(elsewhere) - _SHOWN_LAYERS
    if more > 0:
        names += f" and {more} more"
    by_origin: dict[str, int] = {}
    for entry in elsewhere:
        by_origin[entry["origin"]] = by_origin.get(entry["origin"], 0) + entry["parameters"]
    origin = max(by_origin, key=by_origin.__getitem__) if by_origin else DtypeOrigin.OUTSIDE.value
    dtype = elsewhere[0]["dtype"] if elsewhere else "float32"
    why = DtypeOrigin(origin).describe(dtype)
    computation, counted = computation_share(reach)
    reached = f"{share:.0%} of the model's parameters"
    if computation is not None:
        reached += f" and {computation:.0%} of its {counted}"
    return (f"{policy} reached {reached}: {names} compute in "
            f"{dtype} ({why}), so this trains in {dtype}, not {reach['dtype']}. "
            f"Fix: {_FIXES[origin]}.")


def unreached_model(model: Any, policy: str,
                    origin_of: Callable[[Any], DtypeOrigin] | None = None) -> str | None:
    """``unreached_line`` for a built model the config's dtype reaches (almost) none of;
    None where it does reach it."""
    reach = precision_reach(model, policy, origin_of or recorded_origin)
    return unreached_line(reach, policy) if reached_none(reach) else None
