"""The physical ceiling of each precision on the trial's device: a dense layer's training step.

A 16-bit policy can only be as fast as the device's 16-bit arithmetic. The probe times the same
dense layer's training step (the matrix product, bias and ReLU forward, and the gradient
products backward) in float32, bfloat16 and float16 on the device trials run on, and reports
each one's speed relative to float32: the limit the picks are read against. The backward
products matter: on this project's 2-core Xeon the float16 forward product runs at float32's
speed while the whole step is 80x slower (TensorFlow emulates the float16 gradient products),
which is what makes float16 trials 70-400x slower per step there. Plain data out.
"""

from __future__ import annotations

import statistics
import time

SIZE = 256                 # a layer big enough to reach the matrix units, small enough to
_BATCH = 64                # take milliseconds even where a dtype is emulated
_MIN_REPEATS = 5
_MIN_TIMED_S = 0.1
_MAX_TIMED_S = 2.0         # per dtype: an emulated dtype stops early, its few samples suffice
DTYPES = ("float32", "bfloat16", "float16")


def _device() -> str:
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else "CPU"


def _time_step(dtype: str, device: str) -> float:
    """Median milliseconds of one training step of a SIZE x SIZE dense layer in ``dtype``."""
    import tensorflow as tf

    with tf.device(device):
        x = tf.cast(tf.random.stateless_uniform((_BATCH, SIZE), seed=(1, 2)), dtype)
        kernel = tf.Variable(tf.cast(tf.random.stateless_uniform((SIZE, SIZE), seed=(3, 4)),
                                     dtype))
        bias = tf.Variable(tf.zeros((SIZE,), dtype))

        @tf.function
        def step(inputs):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.nn.relu(tf.matmul(inputs, kernel) + bias))
            return tape.gradient(loss, [kernel, bias])

        def run() -> None:
            for gradient in step(x):
                gradient.numpy()

        run()  # trace and warm up
        samples: list[float] = []
        began = time.perf_counter()
        while True:
            started = time.perf_counter()
            run()
            samples.append((time.perf_counter() - started) * 1000.0)
            spent = time.perf_counter() - began
            if spent >= _MAX_TIMED_S or (len(samples) >= _MIN_REPEATS and spent >= _MIN_TIMED_S):
                return statistics.median(samples)


def measure_ceiling() -> dict:
    """``{"device", "size", "ms": {dtype: ms per step}, "speed": {dtype: float32_ms / ms}}``."""
    device = _device()
    ms = {dtype: _time_step(dtype, device) for dtype in DTYPES}
    return {"device": device, "size": SIZE, "ms": ms,
            "speed": {dtype: ms["float32"] / value for dtype, value in ms.items()}}
