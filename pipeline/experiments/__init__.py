"""Experiments: grids of runs as queued DVC experiments (``sweep``) and their ranking by validation
BLEU from MLflow (``compare``)."""
