"""The worker process: what it does once at its start (``startup``: the frameworks imported,
then kept out of the collector's way), and its one face, the ``TrialWorker`` both executors
call (``trial_worker``): a Ray actor is one, the local worker program serves one.
"""
