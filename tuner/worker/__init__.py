"""The worker side: everything that runs inside a TensorFlow process, for either executor — the
process's start (``process``, ``startup``), a trial (``trial``, its timed ``steps``, its
``validation``), live models kept for the re-measurement and the confirmation (``live``,
``live_models``), the task check and device ceiling (``probe``, ``ceiling``; a model file
that does not load, said in one line: ``model_files``), diagnostics and the
input checks (``diagnose``, ``diagnose_steps``, ``layer_ranges``, ``integer_inputs``,
``continuous_inputs``), failure classification and memory, and, each as its own process, a
whole guarded training (``guarded_train``) and one timed measurement of ``precision-tuner
bench`` (``bench``). Only here and in ``tuner.apply`` (what a user's own process
imports) may TensorFlow and Keras be imported; modules here import them inside the functions
that run in the worker, so the executors can name those functions for their processes without
loading either."""
