"""TF32: on NVIDIA Ampere and newer GPUs (compute capability 8.0 and up), TensorFlow runs
float32 matrix products and convolutions in TensorFloat-32 by default: float32's range with
10 bits of mantissa (bfloat16 has 7, float16 10). A "float32" baseline there is TF32 in its
products, its speed included, and so are the guard's float32 reference passes. ``facts`` says
which applies on this worker's device; ``hold_float32`` turns TF32 off for a run that asks for
IEEE float32 throughout (``--strict-float32``). Plain data out.
"""

from __future__ import annotations

AMPERE = (8, 0)   # the first compute capability with TF32 tensor cores


def facts() -> dict:
    """``{"enabled": TensorFlow's TF32 setting in this process, "supported": a GPU here has
    TF32 units, "applies": both}``."""
    import tensorflow as tf

    supported = False
    for gpu in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        supported = supported or bool(capability and tuple(capability) >= AMPERE)
    enabled = bool(tf.config.experimental.tensor_float_32_execution_enabled())
    return {"enabled": enabled, "supported": supported, "applies": enabled and supported}


def hold_float32(strict: bool) -> None:
    """TF32 off where ``strict`` (float32 products in IEEE float32), else TensorFlow's default
    (on): set before each run, as a worker serves runs of different jobs one after another."""
    import tensorflow as tf

    tf.config.experimental.enable_tensor_float_32_execution(not strict)
