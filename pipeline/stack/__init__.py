"""The team's services on one machine, for trying and testing what a team runs on real servers:
PostgreSQL (Debian's), an S3-compatible object store (SeaweedFS), the MLflow tracking server
(PostgreSQL behind it, artifacts proxied to the store, basic auth) and the Prefect server
(PostgreSQL, basic auth). ``python -m pipeline.stack start|stop|status|remote`` (``make stack``,
``make stack-stop``, ``make stack-status``, ``make stack-remote``).

- ``settings``: the folder, the address, the ports (kept from the first start);
- ``secrets``: generated passwords and keys (mode 0600), the PostgreSQL password file;
- ``processes``: start detached, record the PID, stop by that PID and wait, port checks;
- ``postgres``, ``objectstore``, ``mlflow_service``, ``prefect_service``: one service each;
- ``client_env``: the env file a user sources on any machine, and the DVC remote it names.

Nothing in the pipeline's stages imports this package: a clone switches to the team's services
by its environment alone.
"""
