"""MLflow: the one place that talks to the tracking store and the model registry, one module per
concern, so that a stage imports (and DVC reruns it for) only what it uses:

- ``store``: which store (``MLFLOW_TRACKING_URI`` or the embedded SQLite one), the client, experiments;
- ``tags``: what a run is tagged and named with (commit, data hashes, device);
- ``buffer``: offline buffering, so that logging never slows or stops training, and the replay of
  what could not be sent (``python -m pipeline.tracking.replay``);
- ``links``: a stage finds its run by the sha256 of the files it reads (nothing DVC hashes holds a run id);
- ``callback``: the trainer's hooks, one run per training;
- ``runs``: the later stages' records (the training run, or a child run when their params differ);
- ``model_card``: what a registered version says about itself;
- ``preflight``: before any stage runs, a tracking server's answer to the credentials given.

Imports nothing itself.
"""
