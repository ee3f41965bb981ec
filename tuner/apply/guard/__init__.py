"""The precision guard: a Keras callback that watches a user's whole training under a config
and repairs it when 16-bit training fails (``callback``: ``PrecisionGuard``, its checks and its
repair ladder), the per-step loss and its noise (``watch``), the host-memory snapshot of
weights and optimizer state and the last training batch kept for diagnosis (``state``), the
cause of a failure found on that batch, each repair verified before it is kept (``cause``),
each 16-bit layer's output against its float32 computation, which finds the layers that
fail silently (``fidelity``), the kept batch's loss against float32's, which finds a
precision loss no layer shows (``precision_loss``), the smallest set of layers whose float32
brings the model back (``float32_set``), each optimizer's loss scale and the largest scale
at which a step applies (``scales``), the kinds of failure (``failures``), what it
records (``events``), what it reads from Keras (``readings``), and what a guarded training
reports: its MLflow record and the lines of ``precision-tuner train``'s training (``report``).
"""
