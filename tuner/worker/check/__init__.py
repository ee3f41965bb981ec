"""The task check, a job's first work in a worker: does the task file keep the contract, and
what is its model (``task_check``; with the device's ceiling and the model's diagnostics taken
on the same model), and a model file that the task loads and that does not load, said in one
line (``model_files``).
"""
