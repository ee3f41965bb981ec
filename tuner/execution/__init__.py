"""Where trials run: which executor a tune needs (``choice``: the local worker for one trial at
a time on this machine, Ray for trials side by side), the ``Executor`` base class (``base``),
one local subprocess (``local``), a pool of Ray actors (``ray_pool``), what a Ray worker on
another node needs of a task, its code and data file (``task_shipping``), and the watchdog that
cleans up after a killed driver (``watchdog``). Hands plain ``TrialSpec``s to ``tuner.worker``
and gets plain ``TrialResult``s back; never imports TensorFlow itself.
"""
