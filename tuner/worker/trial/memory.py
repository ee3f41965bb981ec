"""A trial's memory, two ways.

- :class:`MemoryMeter`: what the process used: the GPU allocator's peak for the trial, else
  the growth of the host's RSS (sampled). On a CPU the latter depends on what ran earlier in
  the worker (an underestimate after the first trial).
- :func:`training_memory`: what the training needs, counted exactly from the model's own
  tensors, the same whatever ran before: weights, gradients (one per trainable weight, in its
  dtype), optimizer state (slots, loss scale, compensation buffers), each by dtype, plus the
  activations the backward pass keeps (every layer call's float outputs in one forward pass of
  a batch, in the dtype they are computed in). Plain data out.
"""

from __future__ import annotations

import threading

from tuner.worker.device.room import rss_bytes
from tuner.worker.task.task_model import one_pass


class MemoryMeter:
    """Peak memory of the trial: the GPU allocator's peak, else host RSS growth (sampled)."""

    def __init__(self) -> None:
        self._gpu = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._baseline = 0
        self._peak = 0

    def start(self) -> None:
        import tensorflow as tf

        gpus = tf.config.list_logical_devices("GPU")
        if gpus:
            self._gpu = gpus[0].name.replace("/device:", "")
            tf.config.experimental.reset_memory_stats(self._gpu)
            return
        self._baseline = self._peak = _rss_bytes()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self._peak = max(self._peak, _rss_bytes())

    def stop(self) -> tuple[int | None, str]:
        if self._gpu is not None:
            import tensorflow as tf

            return int(tf.config.experimental.get_memory_info(self._gpu)["peak"]), "gpu_peak"
        if self._thread is None:
            return None, ""
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, _rss_bytes())
        return self._peak - self._baseline, "host_rss_growth"


def tensor_bytes(tensors) -> int:
    """The bytes of ``tensors`` (variables too), all dtypes together."""
    return sum(_by_dtype(tensors).values())


def _by_dtype(tensors) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for tensor in tensors:
        dtype = getattr(tensor.dtype, "name", str(tensor.dtype))
        count = 1
        for dim in tensor.shape:
            count *= int(dim)
        sizes[dtype] = sizes.get(dtype, 0) + count * _ITEM_BYTES.get(dtype, 4)
    return sizes


_ITEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8,
               "int8": 1, "uint8": 1, "bool": 1}


def training_memory(model, optimizers: list, batch: tuple) -> dict:
    """``{"weights": {dtype: bytes}, "gradients": {...}, "optimizer": {...}, "activations":
    {...}, "total_bytes": n}`` for ``model`` trained by ``optimizers`` on a batch like
    ``batch`` (the activations of its forward pass; of a watched training step, for a model
    without one: tuner.worker.task.task_model.one_pass)."""
    import keras

    from tuner.apply.layers import hook_layer_calls
    from tuner.apply.loss_scaling import optimizer_variables

    state = {id(variable): variable for optimizer in optimizers
             for variable in optimizer_variables(optimizer)}
    outputs = []

    def keep(layer, output) -> None:
        if not isinstance(layer, keras.Model):
            outputs.extend(t for t in keras.tree.flatten(output)
                           if getattr(getattr(t, "dtype", None), "is_floating", False))

    with hook_layer_calls(after=keep):
        one_pass(model, batch, training=True, restore=True)
    memory = {"weights": _by_dtype(model.weights),
              "gradients": _by_dtype(model.trainable_weights),
              "optimizer": _by_dtype(state.values()),
              "activations": _by_dtype(outputs)}
    memory["total_bytes"] = sum(sum(part.values()) for part in memory.values())
    return memory


def _rss_bytes() -> int:
    """This process's resident memory (tuner.worker.device.room); off Linux, its lifetime
    peak."""
    current = rss_bytes()
    if current is not None:
        return current
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
