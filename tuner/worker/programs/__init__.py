"""The worker's programs, each started by the driver as ``python -m`` in a process of its own:
the local executor's worker (``serve``), one measurement of ``precision-tuner bench``
(``one_measurement``) and one whole training of ``precision-tuner train`` (``one_training``).
"""
