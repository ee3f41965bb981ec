"""Pure decisions from measurements, no TensorFlow and no I/O: whether a trial is stable
(``verdict``, with the loss terms ``terms`` and the learning measure ``learning``), how sure a
speedup is (``noise``), how many steps a trial needs (``sizing``), which config wins
(``decision``), what "best" means (``objective``: the ``Objective`` enum and the memory and
balanced picks), and which gradients float16 flushes (``underflow``). Imports core and
``tuner.apply``'s config data only.
"""
