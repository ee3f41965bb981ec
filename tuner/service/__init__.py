"""The team's tuning service on a Ray cluster: starting and stopping it (``server``) and the
client that submits, lists, stops and fetches jobs (``client``). Imports ``run`` and below.
"""
