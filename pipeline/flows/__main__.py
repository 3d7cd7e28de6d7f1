"""``python -m pipeline.flows run|retrain|serve``: see pipeline/flows/__init__.py and docs/flows.md."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.flows", description=__doc__)
    parser.add_argument("--workdir", type=Path, default=Path("."),
                        help="the repository root holding dvc.yaml and params.yaml (default: .)")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the training pipeline once (the DVC stages as Prefect tasks)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="parameter override, repeatable: runs `dvc exp run -S KEY=VALUE ...`")
    commands.add_parser("retrain", help="run the retraining flow once (incoming data, pipeline, promotion gate)")
    commands.add_parser("serve", help="serve the retraining flow on params.yaml's flows.schedule_cron")
    args = parser.parse_args(argv)
    root = args.workdir.resolve()

    from prefect.settings import PREFECT_API_URL

    from pipeline.config.errors import ParamsError
    from pipeline.flows import pipelines, serving
    from pipeline.flows.preflight import PrefectPreflightError, check_prefect_server
    from pipeline.tracking.preflight import PreflightError, check_tracking_server

    try:
        flows = pipelines.params_of(root).flows
        print(f"tracking: {check_tracking_server(pipelines.tracking_uri(root))}", flush=True)
        if PREFECT_API_URL.value():   # a server of the team's (else a local one, started here if needed)
            print(f"orchestration: {check_prefect_server(PREFECT_API_URL.value())}", flush=True)
    except (ParamsError, PreflightError, PrefectPreflightError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with serving.prefect_api(root, start_server=args.command == "serve") as api:
        print(f"Prefect API: {api}", flush=True)
        if args.command == "serve":
            try:
                serving.serve_retraining(root, flows)
            except KeyboardInterrupt:
                print("stopped serving; the deployment is paused until served again", flush=True)
            return 0
        if args.command == "run":
            state = pipelines.training_pipeline(workdir=str(root), overrides=args.set or None, return_state=True)
        else:
            state = pipelines.retraining(workdir=str(root), return_state=True)
        if not state.is_completed():
            print(f"error: {state.name}: {state.message}", file=sys.stderr)
            return 1
        print(json.dumps(state.result(), indent=2))
        return 0


if __name__ == "__main__":
    sys.exit(main())
