"""The translation server (``make serve-model``): MLflow's ``/invocations`` format on FastAPI and
uvicorn, batched across requests, the registry's champion swapped in live.

- ``model_source``: which registered version to serve, its files read directly (no pyfunc loader:
  a live swap must not pile each version's bundled code onto ``sys.path``), loaded with the
  version's engine (CTranslate2 from its export, else our search) and warmed;
- ``batcher``: inference threads (one a CTranslate2 replica) that take the queued sentences up to
  a token budget, grouped by version and decoding settings, and answer each request with its own
  sentences; a bounded queue, per-request deadlines, and the health of the inference side;
- ``requests``: MLflow's request and error formats, and the same checks (400s) as the pyfunc model;
- ``metrics``: Prometheus metrics (prometheus_client);
- ``app``: the HTTP endpoints; ``__main__``: the command.
"""
