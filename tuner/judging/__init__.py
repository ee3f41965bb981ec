"""Pure decisions from measurements, no TensorFlow and no I/O: whether a trial is stable
(``verdict``, with the loss terms ``terms`` and the learning measure ``learning``), how sure a
speedup is (``noise``), how many steps a trial needs (``sizing``), when a run stops before
them (``early_stop``), which config wins (``decision``), what "best" means (``objective``: the
``Objective`` enum and the memory and balanced picks), which gradients float16 flushes
(``underflow``), which layers float16 puts at risk and which loss scale to start from
(``layer_risk``), which input feature a 16-bit cast erases worst and how it is said
(``erasure``), whether a proposed config is worth training (``worth_training``), and which
16-bit dtypes the device's ceiling says cannot win at the model's scale (``ceiling_limit``).
Imports core and ``tuner.apply``'s config data only.
"""
