"""What a few instrumented float32 steps tell about the task's model before its trials, plain
data out: the diagnostics (``diagnose``; for a model the task compiles itself, read from its
own ``train_step``: ``diagnose_steps``), each layer's numeric ranges (``layer_ranges``), what
they read from layer calls besides gradients (``layer_watch``), and the inputs and targets
16-bit rounding corrupts: float tensors that carry integers (``integer_inputs``), continuous
features a cast erases (``continuous_inputs``), targets a 16-bit output cannot produce
(``output_targets``). The input checks' second half runs in each trial, before it trains.
"""
