"""Prefect flows around the DVC pipeline: they run the stages as tasks (retries, logs,
artifacts), serve the scheduled retraining, and guard the registry's champion. They never
re-implement a stage.

    python -m pipeline.flows run [--set key=value ...]   # the training pipeline once
    python -m pipeline.flows retrain                     # incoming data, pipeline, promotion gate
    python -m pipeline.flows serve                       # the retraining flow on params.yaml's cron

Modules: ``stages`` (DVC commands as tasks), ``gate`` (paired bootstrap and promotion, no
Prefect), ``finetune`` (``flows.retrain_mode``: scratch or the champion's weights and tokenizer,
no Prefect), ``pipelines`` (the flows), ``serving`` (which Prefect API; the served deployment).
"""

from __future__ import annotations

from typing import Any

__all__ = ["retraining", "training_pipeline"]


def __getattr__(name: str) -> Any:
    # Lazy: importing the package (e.g. for ``python -m pipeline.flows --help``) does not import Prefect.
    if name in __all__:
        from pipeline.flows import pipelines

        return getattr(pipelines, name)
    raise AttributeError(f"module 'pipeline.flows' has no attribute {name!r}")
