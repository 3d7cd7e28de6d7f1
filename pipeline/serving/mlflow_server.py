"""Serve the registered translator with MLflow's own scoring server: ``make serve-model-mlflow`` (=
``python -m pipeline.serving.mlflow_server``), the MLflow-native path beside ``make serve-model``
(``pipeline.serving.server``: batched across requests, the champion swapped live).

The version served is the registry's ``champion`` (the promotion gate's choice) of
``tracking.registered_model``, or, before there is one, its latest version. MLflow's own
scoring server runs it (``mlflow models serve``) in this environment (``--env-manager local``:
no virtualenv or conda is built, nothing is downloaded) on 127.0.0.1 by default::

    make serve-model-mlflow MODEL_PORT=5001
    curl -s http://127.0.0.1:5001/invocations -H 'Content-Type: application/json' \\
         -d '{"dataframe_records": [{"text": "Two dogs play in the snow."}]}'
    # {"predictions": ["Zwei Hunde spielen im Schnee."]}
    # also {"inputs": {"text": [...]}} and, per request, {"params": {"beam_size": 1}}

A bad input (empty text, a number, an over-long sentence; see ``pipeline.serving.mlflow_model``) gets
a 400 with a message saying what is wrong; malformed JSON gets the server's own 400. The
version is resolved once, at start: moving the alias later does not change a running server.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from pipeline.config.errors import ParamsError
from pipeline.config.loader import PARAMS
from pipeline.config.params import load_params
from pipeline.tracking import store

HOST = "127.0.0.1"
DEFAULT_PORT = 5001            # 5000 is `make ui`'s
DEFAULT_TIMEOUT_S = 60


class ServingError(RuntimeError):
    """Nothing to serve; the message says why."""


def served_version(client: MlflowClient, name: str) -> tuple[ModelVersion, str]:
    """The version to serve and why: the ``champion`` alias, else the newest READY version."""
    try:
        return client.get_model_version_by_alias(name, store.CHAMPION_ALIAS), f"alias {store.CHAMPION_ALIAS}"
    except MlflowException:
        pass
    try:
        versions = [v for v in client.search_model_versions(f"name = '{name}'") if v.status == "READY"]
    except MlflowException:
        versions = []
    if not versions:
        raise ServingError(f"registered model {name!r} has no version in {store.tracking_uri()}: "
                           "train and evaluate one first (make run)")
    latest = max(versions, key=lambda v: int(v.version))
    return latest, f"latest version: no {store.CHAMPION_ALIAS} alias yet"


def serve_command(model_uri: str, host: str = HOST, port: int = DEFAULT_PORT, workers: int = 1,
                  timeout: int = DEFAULT_TIMEOUT_S) -> list[str]:
    """``mlflow models serve`` of ``model_uri`` with this environment's Python (``--env-manager local``)."""
    return [sys.executable, "-m", "mlflow", "models", "serve", "--model-uri", model_uri, "--env-manager", "local",
            "--host", host, "--port", str(port), "--workers", str(workers), "--timeout", str(timeout)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", help="registered model (default: tracking.registered_model of params.yaml)")
    parser.add_argument("--version", help="serve this version instead of the champion / latest")
    parser.add_argument("--host", default=HOST, help=f"interface to bind (default: {HOST}, this machine only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default: {DEFAULT_PORT}")
    parser.add_argument("--workers", type=int, default=1, help="server processes, each with its own model copy")
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S, help="seconds per request")
    parser.add_argument("--dry-run", action="store_true", help="print the command and exit")
    args = parser.parse_args(argv)
    from pipeline.tracking.preflight import require_tracking_server

    require_tracking_server()   # a refusing or silent server is named as such, not as "no version"
    try:
        name = args.name or (load_params(PARAMS).tracking.registered_model if Path(PARAMS).is_file()
                             else "transformer")
        client = store.client()
        if args.version:
            version, why = client.get_model_version(name, args.version), "asked for"
        else:
            version, why = served_version(client, name)
    except (ParamsError, ServingError, MlflowException) as err:
        print(f"error: {getattr(err, 'message', err)}", file=sys.stderr)
        sys.exit(2)
    uri = f"models:/{name}/{version.version}"
    command = serve_command(uri, args.host, args.port, args.workers, args.timeout)
    print(f"serving {name} version {version.version} ({why}; run {version.run_id}) from {store.tracking_uri()}\n"
          f"  POST http://{args.host}:{args.port}/invocations  "
          """{"dataframe_records": [{"text": "Two dogs play in the snow."}]}""", flush=True)
    if args.dry_run:
        print(" ".join(command))
        return
    # The server reads the registry through MLFLOW_TRACKING_URI and starts `uvicorn` through PATH: this
    # environment's, also when it is not activated. exec: Ctrl-C and signals reach the server directly.
    env = {**os.environ, "MLFLOW_TRACKING_URI": store.tracking_uri(),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    os.execve(sys.executable, command, env)


if __name__ == "__main__":
    main()
