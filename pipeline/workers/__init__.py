"""The retraining flow on a team's workers: a Prefect deployment of ``team-retraining`` to a
``process`` work pool whose code is the project's git repository at a pinned commit, run by
``prefect worker start`` on another machine (a GPU box) in a workspace of its own.

- ``workspace``: the deployment's pull steps (fetch and check out the pinned commit in the
  worker's ``TEAM_WORKSPACE`` clone, which keeps outputs, checkpoints and the DVC cache between runs).
- ``flow``: the flow a worker runs (the team's DVC remote, the retraining flow with stages that pull
  first, ``dvc push --run-cache``, the results committed to a branch of the repository).
- ``results``: that commit and its push.
- ``deploy`` and ``python -m pipeline.workers deploy``: the work pool and the deployment.

docs/team.md says how a team runs them.
"""
