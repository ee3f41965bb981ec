"""The team's tuning service on a Ray cluster: starting and stopping it (``server``, with what it
records about itself in ``service_info``), the job server's client (``job_server``), what a job
and the service agree on (``contract``), and the client that submits, lists, stops and fetches
jobs (``client``). Imports core, ``records`` and ``execution``; never the tune job itself (a
job runs ``precision-tuner tune`` on the cluster).
"""
