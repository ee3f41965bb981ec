"""Pure decisions from measurements, no TensorFlow and no I/O: whether a trial is stable
(``verdict``), how sure a speedup is (``noise``), how many steps a trial needs (``sizing``),
which config wins (``decision``) and what "best" means (``objective``). Imports core and
``tuner.apply`` (config data) only.
"""
