"""What the ceiling probe times: the device's arithmetic, waited for through one scalar. On a
GPU, reading the gradients themselves timed their copy to the host as well (the old probe's
``gradient.numpy()`` for every gradient); on a CPU that read is no transfer, so the difference
cannot be timed here: what is pinned is that no gradient leaves the step."""

import numpy as np
import pytest


@pytest.mark.parametrize("shape", [(1024, 64, 64), (64, 256, 256), (16, 512, 512)])
def test_the_timed_step_hands_the_host_one_scalar_whatever_the_gradients_size(shape):
    import tensorflow as tf

    from tuner.worker.device.ceiling import dense_step

    batch, width_in, width_out = shape
    for dtype in ("float32", "bfloat16", "float16"):
        step, (kernel, bias) = dense_step(tf, dtype, width_in, width_out)
        x = tf.cast(tf.random.stateless_uniform((batch, width_in), seed=(1, 2)), dtype)
        outputs = step.get_concrete_function(x).structured_outputs
        assert outputs.shape == () and outputs.dtype == tf.float32, (shape, dtype)
        # It depends on every gradient value: the sum of both gradients, as the tape gives them.
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.relu(tf.matmul(x, kernel) + bias))
        expected = sum(float(tf.reduce_sum(tf.cast(g, tf.float32)))
                       for g in tape.gradient(loss, [kernel, bias]))
        assert np.isclose(float(step(x)), expected, rtol=1e-3), (shape, dtype)
