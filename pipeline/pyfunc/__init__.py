"""The translator as an MLflow pyfunc version, from the evaluate stage's run to the registry: the
file MLflow logs as the model (``mlflow_model_code``: models from code, nothing pickled), the code a
version carries (``model_code``: the import closure of the model class), logging and registering a
version with its model card (``log_version``), and the evaluate stage's record that does it, sent at
once or from the unsent queue (``evaluate_record``).

The model class itself, ``pipeline.serving.mlflow_model.TranslatorModel``, stays where every
registered version names it (a cloudpickled one by its import path; one from code loaded beside
today's code resolves it there). Above ``serving`` and ``tracking`` in the folder order: it logs
serving's model into tracking's store.
"""
