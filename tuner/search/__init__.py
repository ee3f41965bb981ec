"""What to try: search spaces as data (``space``) and their YAML files (``space_files``),
which layers a float32 placement selects in a model (``layer_matches``), and the proposer that
asks Optuna for the next config (``proposer``). Imports core, ``apply`` and ``judging``.
"""
