"""The team's tuning service on a Ray cluster: starting and stopping it (``server``, with what it
records about itself in ``service_info``), what it admits (``limits``: the jobs it runs at once,
a job's size, a submitter's queued jobs), its book of jobs on its disk, which outlives a restart
(``job_book``), the job server's client (``job_server``) and the book's, through MLflow's
artifact proxy (``intake``), what a job and the service agree on (``contract``), and the client
that submits, lists, stops and fetches jobs (``client``). Imports core, ``records`` and
``execution``; never the tune job itself (a job runs ``precision-tuner tune`` on the cluster).
"""
