"""The worker side: everything that runs inside a TensorFlow process, for either executor, in
sub-packages by role, each importing only those listed before it:

- ``task``: the user's task in the worker (``task_loader``, ``task_model``, a fresh Keras
  state before each use: ``keras_state``);
- ``device``: each precision's speed on the device, the ceiling (``ceiling``, kept per machine:
  ``ceiling_cache``);
- ``diagnostics``: a few instrumented float32 steps (``diagnose``, ``diagnose_steps``,
  ``layer_ranges``, ``layer_watch``) and the inputs and targets 16-bit rounding corrupts
  (``integer_inputs``, ``continuous_inputs``, ``output_targets``);
- ``trial``: one trial (``trial``, its timed ``steps``, its ``validation``, its ``memory``, an
  error read into a failure: ``error_reading``) and the models kept alive for the
  re-measurement and the confirmation (``live_models``, ``live``);
- ``check``: the task check (``task_check``; a model file that does not load: ``model_files``);
- ``process``: the process's start-up (``startup``) and its one face, the ``TrialWorker``
  both executors call (``trial_worker``);
- ``programs``: what the driver starts with ``python -m``: the local worker (``serve``), one
  measurement of ``precision-tuner bench`` (``one_measurement``), one whole training of
  ``precision-tuner train`` (``one_training``).

The rules these apply are ``tuner.judging``'s (the early stop, the layers' risk, an erased
feature's words). Only here and in ``tuner.apply`` (what a user's own process imports) may
TensorFlow and Keras be imported; modules here import them inside the functions that run in
the worker, so the executors can import the worker's face without loading either.
"""
