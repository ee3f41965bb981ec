"""Where each layer's dtype came from, and the scope's rule for a dtype that a saved file wrote.

Keras gives a layer the global dtype policy only when its constructor is handed no ``dtype``.
Every way of getting a model without writing its code hands one: ``keras.models.load_model``
(.keras and legacy .h5), ``model_from_json``, ``Model.from_config``, ``clone_model`` and a
custom layer's own ``from_config`` all end in ``cls.from_config(config)``, which calls
``cls(**config)`` with the dtype the layer was saved with. So under a scope (or Keras's own
``set_global_policy``) a float32-saved model stays float32, and a "16-bit" trial of it trains in
float32 and looks slow.

The rule (``config_dtype``): a layer constructed by a ``from_config`` (or inside the
constructor of a layer that one constructs: an LSTM passes its dtype down to its cell), whose
dtype is *the saved model's own*, takes the scope's policy instead, before it builds, so its
variables take the policy's variable dtype and the saved weights load into them (cast). A layer
saved in a dtype other than the model's own (a float32 softmax kept in a mixed model) keeps it:
someone placed it. The saved model's own dtype is the one most of its layers carry (a tie goes
to the 16-bit one: a model half in float32 is a mixed model with placements), read from the
outermost config being deserialised, or, for ``clone_model``, from the model being cloned.

Why the call stack: it is the one place that sees every deserialisation path, a custom layer's
own ``from_config`` included, and the entry points a task imported before the scope opened
(``from keras.models import load_model``), which no patch of those functions would reach. What
it reads is Python's, not Keras's: frame names and their ``self``/``config``/``model`` locals.
A sublayer that a deserialised model's code builds with ``dtype="float32"`` written in it,
while the model was saved all in float32, follows the model (the two cannot be told apart);
the config's float32 placements still apply to it.

``DtypeOrigin`` names the answer for each layer, so that a config that reaches no layer can say
why (``tuner.apply.reach``).
"""

from __future__ import annotations

import enum
import weakref
from collections import Counter
from typing import Any

# Keras's deserialisation frames, and the locals that hold what they deserialise, are named in
# tuner.apply.keras_internals (CONFIG_FRAMES, CONFIG_LOCALS, CLONE_FRAME, CLONE_LOCAL).
_FLOAT_POLICIES = ("float32", "float16", "bfloat16", "mixed_float16", "mixed_bfloat16",
                   "float64")
_PLAIN_POLICY_CLASSES = ("DTypePolicy", "FloatDTypePolicy", "Policy")


class DtypeOrigin(str, enum.Enum):
    """Where a layer's dtype policy came from, as a scope saw the layer constructed."""

    POLICY = "policy"          # no dtype given, or the config's own: the config's policy
    SAVED = "saved"            # the saved model's own dtype, replaced by the config's policy
    SAVED_KEPT = "saved_kept"  # saved in a dtype other than the saved model's own: kept
    CODE = "code"              # dtype= written in the code that constructs it: kept
    PLACEMENT = "placement"    # moved to float32 by the config's float32 placements
    OUTSIDE = "outside"        # constructed before the scope opened (or in another one)

    def describe(self, dtype: str) -> str:
        return {
            DtypeOrigin.POLICY: f"took the config's policy ({dtype})",
            DtypeOrigin.SAVED: f"their saved dtype, replaced by the config's ({dtype})",
            DtypeOrigin.SAVED_KEPT: f"saved as {dtype}, unlike the rest of the saved model, "
                                    "so kept",
            DtypeOrigin.CODE: f"dtype={dtype!r} in the code that constructs them",
            DtypeOrigin.PLACEMENT: "a float32 placement of the config",
            DtypeOrigin.OUTSIDE: f"built as {dtype} before the config's scope opened",
        }[self]


# Every scope records here where each layer it saw constructed got its dtype, so that a reader
# outside the scope (the guard, at the start of fit) can say why a layer is not 16-bit.
_ORIGINS: "weakref.WeakKeyDictionary[Any, DtypeOrigin]" = weakref.WeakKeyDictionary()


def record_origin(layer: Any, origin: DtypeOrigin) -> None:
    _ORIGINS[layer] = origin


def origin_of(layer: Any) -> DtypeOrigin:
    """Where ``layer``'s dtype came from, as the last scope that touched it recorded; a layer
    no scope saw was built outside every scope."""
    return _ORIGINS.get(layer, DtypeOrigin.OUTSIDE)


def policy_name(dtype: Any) -> str | None:
    """The plain policy name a ``dtype`` argument or a saved ``dtype`` entry stands for; None
    for none, a quantized policy or a policy map (those are left as they are)."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        return dtype
    if isinstance(dtype, dict):
        if dtype.get("class_name") not in _PLAIN_POLICY_CLASSES:
            return None
        name = (dtype.get("config") or {}).get("name")
        return name if isinstance(name, str) else None
    if getattr(dtype, "quantization_mode", None) is not None:
        return None
    import keras

    if isinstance(dtype, keras.DTypePolicy) and type(dtype).__name__ != "DTypePolicyMap":
        return dtype.name
    name = getattr(dtype, "name", None)  # a tf.DType or a NumPy dtype
    return name if isinstance(name, str) else None


def own_dtype(dtypes: list[str]) -> str | None:
    """The dtype most of a model's layers carry; a tie goes to a 16-bit one."""
    counts = Counter(name for name in dtypes if name in _FLOAT_POLICIES)
    if not counts:
        return None
    top = max(counts.values())
    tied = sorted(name for name, count in counts.items() if count == top)
    return next((name for name in tied if name != "float32"), tied[0])


def saved_layer_dtypes(config: Any) -> list[str]:
    """The dtype policy of every layer in a serialised model config, at any depth (input layers
    aside: their dtype is the input's, not a policy)."""
    found: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            inner = node.get("config")
            if isinstance(inner, dict) and "class_name" in node:
                if node.get("class_name") != "InputLayer" \
                        and not str(node.get("class_name")).startswith("__"):
                    name = policy_name(inner.get("dtype"))
                    if name is not None:
                        found.append(name)
            for value in node.values():
                visit(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                visit(value)

    visit(config)
    return found


def model_layer_dtypes(model: Any) -> list[str]:
    """The dtype policy names of a built model's layers (input layers aside)."""
    import keras

    from tuner.apply.layers import layer_paths

    return [name for layer, _ in layer_paths(model)
            if not isinstance(layer, keras.layers.InputLayer)
            and (name := policy_name(layer.dtype_policy)) is not None]


class SavedDtypes:
    """One scope's reading of the call stack: is a layer being constructed from a config, and
    what is the saved model's own dtype there. The own dtype is worked out once per saved
    model (its config or the cloned model, held while the scope lives)."""

    def __init__(self) -> None:
        self._own: dict[int, tuple[Any, str | None]] = {}

    def config_dtype(self, layer: Any, caller: Any) -> tuple[bool, str | None]:
        """``(from_config, own)``: whether ``layer``, whose ``Layer.__init__`` was called from
        the frame ``caller``, is being constructed from a config, and the saved model's own
        dtype there."""
        import keras

        from tuner.apply.keras_internals import CONFIG_FRAMES

        frame = caller
        while frame is not None:
            owner = frame.f_locals.get("self")
            if owner is layer or (frame.f_code.co_name == "__init__"
                                  and isinstance(owner, keras.layers.Layer)):
                frame = frame.f_back
                continue
            break
        if frame is None or frame.f_code.co_name not in CONFIG_FRAMES:
            return False, None
        return True, self._own_dtype(frame)

    def _own_dtype(self, frame: Any) -> str | None:
        from tuner.apply.keras_internals import (
            CLONE_FRAME,
            CLONE_LOCAL,
            CONFIG_FRAMES,
            CONFIG_LOCALS,
        )

        # Functional's from_config pops the layer list out of ``config`` into its local
        # ``functional_config`` before it builds the layers: read whichever holds them.
        configs: list[dict] = []
        clone_source = None
        while frame is not None:
            name = frame.f_code.co_name
            if name in CONFIG_FRAMES:
                for local in CONFIG_LOCALS:
                    config = frame.f_locals.get(local)
                    if isinstance(config, dict):
                        configs.append(config)
                        break
            elif name == CLONE_FRAME and hasattr(frame.f_locals.get(CLONE_LOCAL), "dtype_policy"):
                clone_source = frame.f_locals[CLONE_LOCAL]
            frame = frame.f_back
        if clone_source is not None:
            return self._remember(clone_source, lambda: own_dtype(
                model_layer_dtypes(clone_source)) or policy_name(clone_source.dtype_policy))
        for config in reversed(configs):  # the outermost config that still lists its layers
            dtypes = saved_layer_dtypes(config)
            if dtypes:
                return self._remember(config, lambda: own_dtype(dtypes))
        if configs:
            return policy_name(configs[-1].get("dtype"))
        return None

    def _remember(self, source: Any, work: Any) -> str | None:
        known = self._own.get(id(source))
        if known is not None and known[0] is source:
            return known[1]
        own = work()
        self._own[id(source)] = (source, own)
        return own


def constructor_dtype(policy: str, saved: SavedDtypes, layer: Any, kwargs: dict,
                      caller: Any) -> DtypeOrigin:
    """Where the ``dtype`` handed to ``layer``'s constructor (its ``Layer.__init__``, called
    from the frame ``caller`` with ``kwargs``) comes from; a saved model's own dtype is
    replaced by ``policy`` in ``kwargs``, before the layer exists."""
    import keras

    given = kwargs.get("dtype")
    if given is None or isinstance(layer, keras.layers.InputLayer):
        return DtypeOrigin.POLICY
    name = policy_name(given)
    if name == policy:
        return DtypeOrigin.POLICY
    from_config, own = saved.config_dtype(layer, caller)
    if not from_config:
        return DtypeOrigin.CODE
    if name is not None and name == own:
        kwargs["dtype"] = policy
        return DtypeOrigin.SAVED
    return DtypeOrigin.SAVED_KEPT
