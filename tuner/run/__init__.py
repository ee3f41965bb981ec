"""One tuning job from flags to records: the plan (``plan``), the trial loop (``trial_loop``),
the re-measurement of the finalists (``remeasure``), the confirmation run (``confirm``), the
job that ties them together (``job``), and the static check of a task file (``task_file``); and a whole training under an
exported config with the precision guard, float32 beside it (``guarded_training``).
Imports everything below it (core, apply, judging, search, records, worker data, execution).
"""
