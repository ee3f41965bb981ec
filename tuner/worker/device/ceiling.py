"""The physical ceiling of each precision on the trial's device, timed as dense training steps.

A 16-bit policy can only be as fast as the device's 16-bit arithmetic. This module times the
same dense layer's training step (the matrix product, bias and ReLU forward, and the gradient
products backward) in float32, bfloat16 and float16 on the device trials run on, and reports
each one's speed relative to float32: the limit the picks are read against. The backward
products matter: on this project's 2-core Xeon the float16 forward product runs at float32's
speed while the whole step is 80x slower (TensorFlow emulates the float16 gradient products),
which is what makes float16 trials 70-400x slower per step there.

Three figures per dtype, each float32's step time over the dtype's:

- ``speed``: a 256-wide layer, batch 64. What the skip rule reads (a dtype under half
  float32's speed here is emulated, and cannot win on any model): small enough to take
  milliseconds where a dtype is emulated.
- ``peak``: a 1024-wide layer, batch 1024: large enough for the matrix units to reach their
  throughput, so the limit a pick's speedup is read against (a 256-wide step read 1.1-1.3x
  for bfloat16 on a machine where a model's pick measured 1.48-1.55x). Not timed for a dtype
  the small step already shows emulated (seconds per step, and nothing to learn).
- ``model``: the model's own largest dense-like kernel (its input and output widths) at the
  task's batch size: what the model's biggest products can gain.

Each figure times its dtypes in turns (``_time_steps``), so that the machine's drift falls on
all of them alike: timed one after the other, the first 1024-wide float32 block of a fresh
process read 19-22 ms against 15-16 ms later, and the peak read bfloat16 2.9x to 6.5x from run
to run on one machine (2.4-2.7x in turns). Beside each figure's ``speed``, its ``spread``: the
95% half-width (in logs) of the mean of its turns' paired log ratios, the figure's own noise
(tuner.judging.ceiling_limit reads both).

The model's figure is kept with the device's in the machine's cache
(tuner.worker.device.ceiling_cache), by its shape: the next tune of the same model on the
machine reads it instead of timing it again.

Plain data out.
"""

from __future__ import annotations

import math
import statistics
import time

from tuner.worker.device import ceiling_cache

SIZE = 256                 # a layer big enough to reach the matrix units, small enough to
_BATCH = 64                # take milliseconds even where a dtype is emulated
PEAK_SIZE = 1024           # width and batch of the peak figure's layer
EMULATED_BELOW = 0.5       # a small step under half float32's speed: the dtype is emulated
_MIN_REPEATS = 5
_MIN_TIMED_S = 0.1
# The model's figure is timed once per model and machine, then kept in the machine's cache:
# the device's figures' time per dtype. At digits' largest layer (1024 x 1024, batch 256) on
# this project's 2-core EPYC, bfloat16 read 1.56-1.75x in ten runs at 0.1 s and 1.58-1.85x at
# 0.05 s (0.43 s against 0.27 s per figure); its spread decides whether a dtype is borderline
# (tuner.judging.ceiling_limit), and more turns narrow it.
_MODEL_MIN_TIMED_S = _MIN_TIMED_S
_MAX_TIMED_S = 2.0         # per dtype: an emulated dtype stops early, its few samples suffice
DTYPES = ("float32", "bfloat16", "float16")
# Two-sided 95% Student-t quantiles by degrees of freedom (beyond the table: 10 dof's).
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def _device() -> str:
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else "CPU"


def _step(dtype: str, device: str, batch: int, width_in: int, width_out: int):
    """One training step of a ``width_in`` x ``width_out`` dense layer on ``batch`` rows, in
    ``dtype``, traced and run once: a call runs it again and waits for its gradients."""
    import tensorflow as tf

    with tf.device(device):
        x = tf.cast(tf.random.stateless_uniform((batch, width_in), seed=(1, 2)), dtype)
        step, _ = dense_step(tf, dtype, width_in, width_out)

    def run() -> None:
        with tf.device(device):
            step(x).numpy()   # one scalar: the device's work, waited for, not its copy out

    run()  # trace and warm up
    return run


def dense_step(tf, dtype: str, width_in: int, width_out: int):
    """The timed step as a ``tf.function`` of its inputs (and the layer's kernel and bias):
    forward, backward, and a float32 scalar that depends on every gradient value. On a GPU
    the host waits for that scalar alone: reading the gradients themselves timed their copy
    to the host too (PCIe, half the bytes in 16-bit), not the device's arithmetic."""
    kernel = tf.Variable(tf.cast(tf.random.stateless_uniform((width_in, width_out),
                                                             seed=(3, 4)), dtype))
    bias = tf.Variable(tf.zeros((width_out,), dtype))

    @tf.function
    def step(inputs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.relu(tf.matmul(inputs, kernel) + bias))
        gradients = tape.gradient(loss, [kernel, bias])
        return tf.add_n([tf.reduce_sum(tf.cast(g, tf.float32)) for g in gradients])

    return step, (kernel, bias)


def _time_steps(device: str, dtypes, batch: int = _BATCH, width_in: int = SIZE,
                width_out: int = SIZE, min_timed_s: float = _MIN_TIMED_S
                ) -> tuple[dict[str, float], dict[str, float]]:
    """Median milliseconds per step of each dtype's ``_step``, timed in turns (float32, then
    each other dtype, then float32 again, ...): a shared machine's speed drifts within a
    second (a 1024-wide float32 step read 16 to 24 ms in one process), and in turns the drift
    falls on every dtype alike instead of on whichever was timed in the slow stretch. The
    turns end once each dtype has ``_MIN_REPEATS`` samples and they took ``min_timed_s`` per
    dtype together; a dtype leaves them after ``_MAX_TIMED_S`` (an emulated one: its few
    samples suffice). Returns the medians and each dtype's ``spread`` against float32
    (``_spread``)."""
    runs = {dtype: _step(dtype, device, batch, width_in, width_out) for dtype in dtypes}
    samples: dict[str, list[float]] = {dtype: [] for dtype in runs}
    spent = dict.fromkeys(runs, 0.0)
    turns = list(runs)
    while turns and not (all(len(samples[d]) >= _MIN_REPEATS for d in turns)
                         and sum(spent.values()) >= min_timed_s * len(runs)):
        for dtype in list(turns):
            started = time.perf_counter()
            runs[dtype]()
            took = time.perf_counter() - started
            samples[dtype].append(took * 1000.0)
            spent[dtype] += took
            if spent[dtype] >= _MAX_TIMED_S:
                turns.remove(dtype)
    return ({dtype: statistics.median(values) for dtype, values in samples.items()},
            {dtype: _spread(samples["float32"], values) for dtype, values in samples.items()})


def _spread(float32_ms: list[float], dtype_ms: list[float]) -> float:
    """The 95% half-width, in logs, of the mean log ratio of float32's step to the dtype's
    over the turns both ran (a turn's pair shares the machine's moment); 0 for float32
    itself, and for a dtype with fewer than two pairs (an emulated one: nothing to read)."""
    ratios = [math.log(a / b) for a, b in zip(float32_ms, dtype_ms) if a > 0 and b > 0]
    if float32_ms is dtype_ms or len(ratios) < 2:
        return 0.0
    return (_T95[min(len(ratios) - 1, len(_T95)) - 1] * statistics.stdev(ratios)
            / math.sqrt(len(ratios)))


def _speeds(device: str, dtypes, batch: int, width_in: int, width_out: int,
            min_timed_s: float = _MIN_TIMED_S) -> dict:
    """``{"speed": {dtype: float32_ms / ms}, "spread": {dtype: its noise (_spread)}}``."""
    ms, spread = _time_steps(device, dtypes, batch, width_in, width_out, min_timed_s)
    return {"speed": {dtype: ms["float32"] / value for dtype, value in ms.items()},
            "spread": {dtype: round(value, 4) for dtype, value in spread.items()}}


def measure_ceiling(model_layer: dict | None = None, *, fresh: bool = False) -> dict:
    """``{"device", "size", "ms": {dtype: ms per step}, "speed": {dtype: float32_ms / ms},
    "peak": {"size", "speed"}, "model": {"layer", "shape": [batch, in, out], "speed"}}``;
    ``model_layer``: ``{"layer", "shape"}`` of the model's largest kernel (``largest_kernel``),
    or None (no "model" figure); ``fresh``: time the device's figures even where this process
    or the machine's cache (tuner.worker.device.ceiling_cache) holds them."""
    device = _device()
    ceiling = dict(_device_figures(device, fresh))
    native = ["float32"] + [d for d in DTYPES
                            if d != "float32" and ceiling["speed"][d] >= EMULATED_BELOW]
    if model_layer is not None:
        ceiling["model"] = {**model_layer, **_model_figure(device, native, model_layer["shape"],
                                                           fresh)}
    return ceiling


def _model_figure(device: str, dtypes: list[str], shape: list[int], fresh: bool) -> dict:
    """The speeds at the model's largest layer's ``shape``: from the machine's cache where
    it holds this shape's (``"kept": True``), else timed and kept there."""
    name = "x".join(str(int(d)) for d in shape)
    key = ceiling_cache.machine_key(device)
    kept = None if fresh else ceiling_cache.read(key)
    figure = ((kept or {}).get("models") or {}).get(name)
    if isinstance(figure, dict) and set(dtypes) <= set(figure.get("speed", {})):
        return {**figure, "kept": True}
    batch, width_in, width_out = shape
    figure = _speeds(device, dtypes, batch, width_in, width_out, _MODEL_MIN_TIMED_S)
    ceiling_cache.add_model(key, name, figure)
    return figure


_measured: dict[str, dict] = {}    # device -> its figures, measured once per worker process


def prime() -> float:
    """Time the device's figures now, before any job asks: the service's warm pool has each
    worker do this once at start, one worker at a time, so that no job's first trial waits on
    the timing. Seconds spent."""
    started = time.perf_counter()
    # Timed, not read from the machine's cache: the pool's line says each worker timed them.
    _device_figures(_device(), fresh=True)
    return time.perf_counter() - started


def _device_figures(device: str, fresh: bool = False) -> dict:
    """The device's own figures (the 256-wide step and the peak), timed once per machine: a
    warm worker of the service (tuner.execution.warm_pool) serves job after job on the same
    device, and a later job reads them as ``"reused": True`` (with ``measured_at``, when they
    were taken); a later tune on the machine reads them from its cache
    (tuner.worker.device.ceiling_cache), with ``kept_in`` too."""
    if device in _measured and not fresh:
        return {**_measured[device], "reused": True}
    key = ceiling_cache.machine_key(device)
    kept = None if fresh else ceiling_cache.read(key)
    if kept is not None:   # later asks in this process say where they came from, too
        _measured[device] = {**{k: v for k, v in kept.items() if k != "models"},
                             "kept_in": str(ceiling_cache.cache_path())}
        return {**_measured[device], "reused": True}
    ms, _ = _time_steps(device, DTYPES)
    speed = {dtype: ms["float32"] / value for dtype, value in ms.items()}
    native = ["float32"] + [d for d in DTYPES if d != "float32" and speed[d] >= EMULATED_BELOW]
    _measured[device] = {"device": device, "size": SIZE, "ms": ms, "speed": speed,
                         "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
                         "peak": {"size": PEAK_SIZE, **_speeds(device, native, PEAK_SIZE,
                                                               PEAK_SIZE, PEAK_SIZE)}}
    ceiling_cache.write(key, _measured[device])
    return _measured[device]


def largest_kernel(model, batch_size: int) -> dict | None:
    """The model's largest dense-like kernel as a product: ``{"layer", "shape": [batch, in,
    out]}`` (a convolution's kernel counts as its window's inputs by its filters, per output
    position, so its batch is the task's); None when no layer has a kernel of 2 or more
    dimensions."""
    best = None
    for layer in _layers(model):
        kernel = getattr(layer, "kernel", None)
        shape = tuple(int(d) for d in getattr(kernel, "shape", ()) or ())
        if len(shape) < 2 or not all(shape):
            continue
        width_in, width_out = math.prod(shape[:-1]), shape[-1]
        if best is None or width_in * width_out > best[0]:
            best = (width_in * width_out, layer.name, width_in, width_out)
    if best is None:
        return None
    return {"layer": best[1], "shape": [int(batch_size), best[2], best[3]]}


def _layers(model):
    for layer in getattr(model, "layers", []):
        yield layer
        yield from _layers(layer)
