"""One tuning job from options to records, and a whole guarded training: what the user asked for
(``options``: ``TuneOptions``, each option declared once, and what a resumed run keeps; each
value's check in ``option_checks``), every setting resolved once (``plan``) and fitted to the
task's model and device (``model_fit``), the trial loop
(``trial_loop``, its records ``trial_records``), the finalists (``finalists``) re-measured
(``remeasure``; under the memory and balanced objectives ``by_objective``), the confirmation
run (``confirmation_run``) and what it found (``confirmation_findings``), the closing records
(``closing``), the search that ties them together (``search_run``), why a loss scale was
chosen (``loss_scale_why``), the static check of a task file (``task_file``),
``precision-tuner train``'s whole training beside float32 (``guarded_training``), and
``precision-tuner bench``'s rounds of float32 against a config in fresh processes (``bench``).
Imports what stands below it (core, apply, judging, search, records, execution; the worker only
by its module names, run in other processes); never TensorFlow, never ``api`` or ``cli``.
"""
