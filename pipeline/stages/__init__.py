"""DVC stages: each a thin ``python -m pipeline.stages.<name>`` around library functions."""
