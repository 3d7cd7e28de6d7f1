"""The MLOps product around the ``transformer`` package: params, data, DVC stages, tracking, flows."""
