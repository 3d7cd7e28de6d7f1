"""The unsent queue: what could not reach the tracking server waits here instead of being lost.

- ``on_disk``: the queue's file (``reports/mlflow_unsent.json``), its lock, its entries;
- ``buffer``: a training's background logger, and its runs' metrics and tags it could not send;
- ``deferred``: a stage's whole record, sent now or kept with its files, replayed in order, set aside
  with its reason when it fails for another reason than the server being away;
- ``records``: the senders of the training's and the later stages' records (the evaluate stage's,
  which registers the model, is ``pipeline.pyfunc.evaluate_record``).

``python -m pipeline.tracking.replay`` sends what waits (``--list``, ``--retry ID``, ``--drop ID``).
"""
