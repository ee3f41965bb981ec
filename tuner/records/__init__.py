"""What a job writes and shows: trial rows and the summary (``results``), the run directory
(``run_store``), MLflow (``mlflow_records``, its stores ``mlflow_stores`` and texts
``mlflow_text``), the terminal/Markdown report (``report``), plots (``plots``), the time
breakdown (``timing``) and the diagnostics' report (``diagnostics_report``). Imports core,
``apply`` and ``judging``; never the search, the run or TensorFlow.
"""
