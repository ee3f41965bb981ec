"""The data of the artifact precision-tuner exports and users apply (``ConfigData``; users meet it
as ``tuner.apply.config.PrecisionConfig``, which adds the calls that apply it): its fields,
their checks, and its file format. Plain data only: this module never imports TensorFlow, and
the modules that apply a config (scope, loss scaling, the guard) stand on it.

On disk (JSON or YAML)::

    {"schema_version": 1,
     "policy": "mixed_float16",
     "loss_scale": {"kind": "dynamic", "initial_scale": 32768, "growth_steps": 2000,
                    "value": null, "floor": 1.0},
     "epsilon": {"backend": null, "optimizer": 0.0001},
     "float32": {"groups": ["softmax"], "layers": [], "outputs": false},
     "weight_update": "nearest",
     "provenance": {...}}          # optional, informative only

Past 300 lines: the artifact's parts (loss scale, epsilon, float32 placement, the config and
its files) are one schema, each validating itself with its own messages; they change together.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, TypeVar

from tuner.apply.vocabulary import LOSS_SCALE_KINDS, WEIGHT_UPDATES, LossScaleKind, WeightUpdate
from tuner.errors import ConfigError, describe

SCHEMA_VERSION = 1
C = TypeVar("C", bound="ConfigData")   # PrecisionConfig.load() is a PrecisionConfig

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16")
PURE_POLICIES = ("float16", "bfloat16")  # 16-bit weights too
FLOAT32_GROUPS = ("normalization", "softmax", "attention", "embedding")

_COMPUTE_DTYPE = {
    "float32": "float32",
    "mixed_float16": "float16",
    "mixed_bfloat16": "bfloat16",
    "float16": "float16",
    "bfloat16": "bfloat16",
}
_GROUP_ABBREVIATIONS = {"normalization": "norm", "softmax": "softmax", "attention": "attn",
                        "embedding": "embed"}


def compute_dtype_of(policy: str) -> str:
    """The dtype a policy computes in (``mixed_float16`` -> ``float16``)."""
    return _COMPUTE_DTYPE[policy]


def _fail(source: str, key: str, value: object, expected: str) -> ConfigError:
    return ConfigError(f"{source}: invalid `{key}`: expected {expected}. Received: {key}="
                       f"{describe(value)}")


def _check_keys(data: object, allowed: tuple[str, ...], source: str, where: str) -> Mapping:
    if not isinstance(data, Mapping):
        raise _fail(source, where, data, "a mapping")
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ConfigError(f"{source}: unknown key {where + '.' if where else ''}{unknown[0]!r}; "
                          f"allowed keys are {', '.join(allowed)}. Remove or rename it.")
    return data


def _positive_number(source: str, key: str, value: object, *, allow_none: bool) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        expected = "a positive finite number" + (" or null" if allow_none else "")
        raise _fail(source, key, value, expected)
    return float(value)


@dataclass(frozen=True)
class LossScale:
    """How the loss is scaled before gradients are computed (only where compute is float16).

    ``kind="dynamic"``: start at ``initial_scale``, halve on non-finite gradients (never below
    ``floor``), double after ``growth_steps`` finite steps. ``kind="fixed"``: multiply by
    ``value``, always; steps with non-finite gradients are skipped. ``floor``: a scale at or
    below it counts as collapsed.
    """

    kind: LossScaleKind = LossScaleKind.NONE   # a plain string is taken too
    initial_scale: float = 2.0**15
    growth_steps: int = 2000
    value: float | None = None
    floor: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", LossScaleKind.coerced(self.kind))

    def validate(self, source: str = "config") -> None:
        if self.kind not in LOSS_SCALE_KINDS:
            raise _fail(source, "loss_scale.kind", self.kind,
                        f"one of {', '.join(LOSS_SCALE_KINDS)}")
        _positive_number(source, "loss_scale.initial_scale", self.initial_scale, allow_none=False)
        _positive_number(source, "loss_scale.floor", self.floor, allow_none=False)
        if isinstance(self.growth_steps, bool) or not isinstance(self.growth_steps, int) \
                or self.growth_steps < 1:
            raise _fail(source, "loss_scale.growth_steps", self.growth_steps, "an integer >= 1")
        if self.kind.moves and self.initial_scale <= self.floor:
            raise ConfigError(f"{source}: a dynamic loss scale must start above its floor, or it "
                              f"counts as collapsed before the first step. Received: "
                              f"initial_scale={self.initial_scale:g}, floor={self.floor:g}. "
                              "Raise initial_scale or lower floor.")
        if self.kind.fixed:
            if self.value is None:
                raise ConfigError(f"{source}: `loss_scale.value` is required when kind is 'fixed'. "
                                  "Received: value=None. Set it, e.g. value: 1024")
            _positive_number(source, "loss_scale.value", self.value, allow_none=False)
        elif self.value is not None:
            _positive_number(source, "loss_scale.value", self.value, allow_none=False)

    def describe(self) -> str:
        if self.kind.moves:
            return f"dynamic {power_of_two(self.initial_scale)}"
        if self.kind.fixed:
            return f"fixed {power_of_two(self.value)}"
        return "no loss scale"


@dataclass(frozen=True)
class Epsilon:
    """``backend``: ``keras.config.epsilon()``; ``optimizer``: the optimizer's ``epsilon``.

    ``None`` leaves the value as Keras / the user's optimizer has it.
    """

    backend: float | None = None
    optimizer: float | None = None

    def validate(self, source: str = "config") -> None:
        _positive_number(source, "epsilon.backend", self.backend, allow_none=True)
        _positive_number(source, "epsilon.optimizer", self.optimizer, allow_none=True)


@dataclass(frozen=True)
class Float32Placement:
    """Layers that keep float32 compute: by class group and by layer-name/path glob pattern;
    ``outputs``: the model's float outputs cast to float32, so that the loss, the metrics and a
    custom ``train_step`` see float32 predictions (what Keras's mixed precision guide advises:
    a hand-written ``y_true - y_pred`` with 16-bit predictions is a dtype error)."""

    groups: tuple[str, ...] = ()
    layers: tuple[str, ...] = ()
    outputs: bool = False

    def validate(self, source: str = "config") -> None:
        if not isinstance(self.outputs, bool):
            raise _fail(source, "float32.outputs", self.outputs, "true or false")
        for group in self.groups:
            if group not in FLOAT32_GROUPS:
                raise _fail(source, "float32.groups", group, f"one of {', '.join(FLOAT32_GROUPS)}")
        for pattern in self.layers:
            if not isinstance(pattern, str) or not pattern:
                raise _fail(source, "float32.layers", pattern, "a non-empty layer name or glob")

    def describe(self) -> str:
        parts = [_GROUP_ABBREVIATIONS[g] for g in self.groups] + list(self.layers) \
            + (["outputs"] if self.outputs else [])
        return "f32: " + ",".join(parts) if parts else ""


@dataclass(frozen=True)
class ConfigData:
    """A complete precision setting for one model: policy, loss scale, epsilons, placements.
    Made as ``PrecisionConfig`` (tuner.apply.config); the methods here build ``cls``."""

    policy: str = "float32"
    loss_scale: LossScale = field(default_factory=LossScale)
    epsilon: Epsilon = field(default_factory=Epsilon)
    float32: Float32Placement = field(default_factory=Float32Placement)
    # How 16-bit weights take their updates (pure policies only): tuner.apply.weight_update.
    weight_update: WeightUpdate = WeightUpdate.NEAREST   # a plain string is taken too
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "weight_update", WeightUpdate.coerced(self.weight_update))
        self.validate()

    # -- validation ------------------------------------------------------------------------
    def validate(self, source: str = "config") -> None:
        if self.policy not in POLICIES:
            raise _fail(source, "policy", self.policy, f"one of {', '.join(POLICIES)}")
        self.loss_scale.validate(source)
        self.epsilon.validate(source)
        self.float32.validate(source)
        if self.weight_update not in WEIGHT_UPDATES:
            raise _fail(source, "weight_update", self.weight_update,
                        f"one of {', '.join(WEIGHT_UPDATES)}")
        if self.weight_update.wraps and self.policy not in PURE_POLICIES:
            raise ConfigError(
                f"{source}: weight_update only applies where the weights are 16-bit (policy "
                f"float16 or bfloat16), but policy is {self.policy!r}. Received: "
                f"weight_update={self.weight_update.value!r}. Use nearest, or a pure 16-bit "
                "policy.")
        if self.loss_scale.kind.scales and self.compute_dtype != "float16":
            raise ConfigError(
                f"{source}: loss scaling only applies where compute is float16, but policy is "
                f"{self.policy!r}. Received: loss_scale.kind={self.loss_scale.kind.value!r}. "
                "Use kind: "
                "none, or a float16 policy (mixed_float16, float16).")

    # -- properties ------------------------------------------------------------------------
    @property
    def compute_dtype(self) -> str:
        return compute_dtype_of(self.policy)

    @property
    def float16_without_loss_scale(self) -> bool:
        """Computes in float16 with no loss scale: gradients below float16's smallest subnormal
        flush to zero."""
        return self.compute_dtype == "float16" and not self.loss_scale.kind.scales

    @property
    def weights_16bit(self) -> bool:
        """The weights are 16-bit too, not only the compute (float16, bfloat16)."""
        return self.policy in PURE_POLICIES

    def describe(self) -> str:
        """A short readable name, e.g. ``mixed_float16 · dynamic 2^15 · f32: norm,softmax``."""
        parts = [self.policy]
        if self.compute_dtype == "float16":
            parts.append(self.loss_scale.describe())
        if self.epsilon.backend is not None or self.epsilon.optimizer is not None:
            eps = [f"{name} {_short_float(value)}" for name, value in
                   (("eps", self.epsilon.backend), ("opt-eps", self.epsilon.optimizer))
                   if value is not None]
            parts.append(" ".join(eps))
        if self.weight_update.wraps:
            parts.append(f"{self.weight_update} updates")
        if self.float32.describe():
            parts.append(self.float32.describe())
        return " · ".join(parts)

    # -- plain-data round trip -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "policy": self.policy,
            "loss_scale": {"kind": self.loss_scale.kind.value,
                           "initial_scale": self.loss_scale.initial_scale,
                           "growth_steps": self.loss_scale.growth_steps,
                           "value": self.loss_scale.value,
                           "floor": self.loss_scale.floor},
            "epsilon": {"backend": self.epsilon.backend, "optimizer": self.epsilon.optimizer},
            "float32": {"groups": list(self.float32.groups), "layers": list(self.float32.layers),
                        "outputs": self.float32.outputs},
            "weight_update": self.weight_update.value,
        }
        if self.provenance:
            data["provenance"] = dict(self.provenance)
        return data

    get_config = to_dict  # Keras vocabulary

    @classmethod
    def from_dict(cls: type[C], data: object, source: str = "config") -> C:
        data = _check_keys(data, ("schema_version", "policy", "loss_scale", "epsilon", "float32",
                                  "weight_update", "provenance"), source, "")
        version = data.get("schema_version", SCHEMA_VERSION)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise _fail(source, "schema_version", version, "a positive integer")
        if version > SCHEMA_VERSION:
            raise ConfigError(f"{source}: schema_version {version} is newer than this "
                              f"precision-tuner understands ({SCHEMA_VERSION}). Upgrade: "
                              "pip install -U precision-tuner")
        loss_scale = dict(_check_keys(data.get("loss_scale", {}), tuple(LossScale.__annotations__),
                                      source, "loss_scale"))
        if isinstance(loss_scale.get("initial_scale"), int) and \
                not isinstance(loss_scale.get("initial_scale"), bool):
            loss_scale["initial_scale"] = float(loss_scale["initial_scale"])
        epsilon = _check_keys(data.get("epsilon", {}), tuple(Epsilon.__annotations__), source,
                              "epsilon")
        placement = _check_keys(data.get("float32", {}), ("groups", "layers", "outputs"), source,
                                "float32")
        for key in ("groups", "layers"):
            if not isinstance(placement.get(key, []), (list, tuple)):
                raise _fail(source, f"float32.{key}", placement.get(key), "a list")
        provenance = data.get("provenance", {})
        if not isinstance(provenance, Mapping):
            raise _fail(source, "provenance", provenance, "a mapping")
        config = object.__new__(cls)  # validate with the source name before freezing
        for name, value in (("policy", data.get("policy", "float32")),
                            ("loss_scale", LossScale(**loss_scale)),
                            ("epsilon", Epsilon(**epsilon)),
                            ("float32", Float32Placement(tuple(placement.get("groups", ())),
                                                         tuple(placement.get("layers", ())),
                                                         placement.get("outputs", False))),
                            ("weight_update",
                             WeightUpdate.coerced(data.get("weight_update", WeightUpdate.NEAREST))),
                            ("provenance", dict(provenance))):
            object.__setattr__(config, name, value)
        config.validate(source)
        return config

    from_config = from_dict  # Keras vocabulary

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write as JSON (``.json``) or YAML (``.yaml``/``.yml``); atomic, never half-written."""
        path = Path(path)
        text = self.to_yaml() if path.suffix.lower() in (".yaml", ".yml") else self.to_json()
        if path.exists() and not overwrite:
            raise ConfigError(f"refusing to overwrite existing file {str(path)!r}. Pass "
                              "--force (overwrite=True) or choose another path.")
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls: type[C], path: str | os.PathLike) -> C:
        """Load and validate a JSON or YAML config; never unpickles anything."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {str(path)!r}. Check the path, or run "
                              "`precision-tuner export --run-dir DIR` to create one.")
        text = path.read_text()
        try:
            if path.suffix.lower() in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(text)
            else:
                data = json.loads(text)
        except Exception as exc:  # noqa: BLE001 - yaml.YAMLError, json.JSONDecodeError
            first_line = (str(exc).strip().splitlines()[0] if str(exc).strip()
                          else type(exc).__name__)
            raise ConfigError(f"{path}: cannot parse: {first_line}. Fix the syntax.") from None
        return cls.from_dict(data, source=str(path))

    def compile_kwargs(self) -> dict[str, Any]:
        """Extra ``model.compile`` arguments: stop Keras from adding its own loss scaling."""
        return {"auto_scale_loss": False}


def power_of_two(value: float | None) -> str:
    """``2^15`` for a power of two, the number otherwise (``?`` for None)."""
    if value is None:
        return "?"
    exponent = math.log2(value)
    return f"2^{int(exponent)}" if exponent.is_integer() else _short_float(value)


def _short_float(value: float) -> str:
    return f"{value:g}"
