"""A sweep fanned out over a work pool's workers: each grid point one flow run of the sweep's
deployment (``team-sweep-point/<sweep>``), pinned to one commit; each worker runs its point as a DVC
experiment in its workspace, tracks it into the team's MLflow server (tagged with the sweep) and
pushes it (``dvc exp push``: the git ref to the repository, the outputs to the DVC remote).

- ``deploy``: the sweep's deployment and its crash detection.
- ``flow``: the point's flow, as a worker runs it.
- ``fanout``: submit the points, follow them to the end.
- ``pipeline.experiments.sweep_points``: names, the points' flow runs, what a rerun does with each.
- ``python -m pipeline.workers.sweep``: the command (``make sweep POOL=...``).
"""
