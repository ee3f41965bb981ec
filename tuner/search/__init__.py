"""What to try: search spaces as data (``space``), the walks over their conditional tree of
dimensions (``dimensions``: sampling, the grid, its size), their YAML files (``space_files``),
which layers a float32 placement selects in a model (``layer_matches``), the proposer that asks
Optuna for the next config (``proposer``) and a study resumed after its space changed
(``study_versions``). Imports core, ``apply`` and ``judging``.
"""
