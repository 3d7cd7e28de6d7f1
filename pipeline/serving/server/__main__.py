"""``python -m pipeline.serving.server`` (``make serve-model``): serve the registry's champion of
``tracking.registered_model`` (without one, the newest version) from the store that
``MLFLOW_TRACKING_URI`` names (else the embedded ``mlflow.db``), on 127.0.0.1 by default::

    make serve-model MODEL_PORT=5001
    curl -s http://127.0.0.1:5001/invocations -H 'Content-Type: application/json' \\
         -d '{"dataframe_records": [{"text": "Two dogs play in the snow."}]}'

The version decodes with its own engine (its registered settings: CTranslate2 from its export, or
our PyTorch search; ``--engine`` forces one, for comparisons). It is ready (``/health/ready``) once
loaded and warmed, and not ready while the inference side cannot answer (``--stall-seconds``);
nothing to serve, or a version that fails to load at start, is one ``error:`` line and exit 2.
SIGTERM (or Ctrl-C): stop accepting, answer what is queued within ``--drain-seconds``, exit 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
import uvicorn

from pipeline.config.decoding import ENGINES
from pipeline.config.errors import ParamsError
from pipeline.config.loader import PARAMS
from pipeline.config.params import load_params
from pipeline.serving.mlflow_model import MAX_SENTENCES
from pipeline.serving.mlflow_server import DEFAULT_PORT, HOST, ServingError
from pipeline.serving.server.app import ServerSettings, ServerState, create_app
from pipeline.serving.server.batcher import Batcher
from pipeline.serving.server.metrics import ServerMetrics
from pipeline.serving.server.model_source import load_version, wanted_version


def cores() -> int:
    """The cores this process may run on (its affinity, which a container or taskset narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_threads() -> int:
    """Torch's threads (our search): one core is left to the event loop (HTTP, JSON, tokenizing):
    with every core in torch's threads, the loop waits for them and a lone request's latency
    doubles (docs/benchmarks.md)."""
    return max(1, cores() - 1)


def default_ct2_threads(n: int | None = None) -> tuple[int, int]:
    """CTranslate2's (inter_threads, intra_threads) on ``n`` cores (default: ``cores()``): one
    replica a core, one thread each (inter x intra = the cores). Several requests' batches then
    decode at once, one a core, without OpenMP's threads waiting on each other (a step of this
    model is too small to split well), and the event loop's short turns find a core between two
    steps (docs/benchmarks.md, measured against (1, cores) and (1, 1))."""
    n = n or cores()
    return n, 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.serving.server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", help="registered model (default: tracking.registered_model of params.yaml)")
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--poll-seconds", type=float, default=30.0, help="registry poll interval (live swap)")
    parser.add_argument("--deadline-seconds", type=float, default=30.0,
                        help="a request not started within this is answered 503, undecoded")
    parser.add_argument("--max-queue-sentences", type=int, default=512,
                        help="beyond this, 429 (a request of more sentences alone: 413)")
    parser.add_argument("--max-batch-tokens", type=int, default=4096, help="source pieces per decoded batch")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20, help="a larger body gets 413 unparsed")
    parser.add_argument("--threads", type=int, default=default_threads(),
                        help="torch threads of our search (default: this process's cores less one)")
    inter, intra = default_ct2_threads()
    parser.add_argument("--inter-threads", type=int, default=inter,
                        help=f"CTranslate2's batches decoded at once (default here: {inter}, one a core)")
    parser.add_argument("--intra-threads", type=int, default=intra,
                        help=f"CTranslate2's threads per batch (default here: {intra})")
    parser.add_argument("--engine", choices=ENGINES,
                        help="decode with this engine whatever the version says (a comparison; default: the "
                             "version's own)")
    parser.add_argument("--stall-seconds", type=float, default=60.0,
                        help="not ready (503) when a batch decodes longer than this, or requests wait and no batch "
                             "finished for this long; a started request is answered 504 past it")
    parser.add_argument("--batch-wait-ms", type=float, default=2.0,
                        help="a free CTranslate2 replica waits this long for more requests while fewer are queued than "
                             "the other replicas decode (never when alone or all are free)")
    parser.add_argument("--drain-seconds", type=float, default=30.0, help="on SIGTERM, time to answer the queue")
    parser.add_argument("--decode-delay-ms", type=float, default=0.0, help=argparse.SUPPRESS)   # tests: a slow decode
    args = parser.parse_args(argv)
    if min(args.threads, args.inter_threads, args.intra_threads, args.max_queue_sentences) < 1 \
            or args.stall_seconds <= 0:
        parser.error("--threads, --inter-threads, --intra-threads and --max-queue-sentences must be at least 1, "
                     "--stall-seconds above 0")
    if args.max_queue_sentences < MAX_SENTENCES:
        print(f"warning: --max-queue-sentences {args.max_queue_sentences} is below the {MAX_SENTENCES} sentences a "
              "request may hold: a larger request is answered 413 (split it)", file=sys.stderr, flush=True)
    if args.inter_threads * args.intra_threads > cores():
        print(f"warning: CTranslate2's {args.inter_threads} x {args.intra_threads} threads are more than the "
              f"{cores()} cores: they will wait on each other", file=sys.stderr, flush=True)
    threads = (args.inter_threads, args.intra_threads)

    from mlflow.exceptions import MlflowException

    from pipeline.tracking import store
    from pipeline.tracking.preflight import require_tracking_server

    require_tracking_server()   # a refusing or silent server is named as such, not as "no version"
    try:
        name = args.name or (load_params(PARAMS).tracking.registered_model if Path(PARAMS).is_file()
                             else "transformer")
        version, why, run_id = wanted_version(store.client(), name)
        model = load_version(store.tracking_uri(), name, version, why, run_id, threads=threads, engine=args.engine)
    except (ParamsError, ServingError, MlflowException, ValueError, OSError) as err:
        print(f"error: {getattr(err, 'message', err)}", file=sys.stderr)
        return 2
    # Tokenizing runs on the event loop, decoding on the inference thread: torch's threads are its.
    torch.set_num_threads(args.threads)
    metrics = ServerMetrics()
    # One inference thread a CTranslate2 replica (a version of our search uses one of them).
    batcher = Batcher(args.max_queue_sentences, args.max_batch_tokens, args.threads, metrics.on_batch,
                      workers=args.inter_threads, stall_seconds=args.stall_seconds,
                      batch_wait_s=args.batch_wait_ms / 1000)
    if args.decode_delay_ms:
        decode = batcher._decode

        def slow_decode(group):   # noqa: ANN001, ANN202
            time.sleep(args.decode_delay_ms / 1000)
            decode(group)
        batcher._decode = slow_decode   # type: ignore[method-assign]
    settings = ServerSettings(name, store.tracking_uri(), args.poll_seconds, args.deadline_seconds,
                              args.max_body_bytes, args.drain_seconds, args.stall_seconds, threads, args.engine)
    state = ServerState(settings, model, batcher, metrics)
    state.set_current(model)
    engine = model.label if model.engine == "ctranslate2" else f"{model.label}, {args.threads} thread(s)"
    print(f"serving {name} version {version} ({why}; run {run_id}) with {engine} from {store.tracking_uri()}\n"
          f"  POST http://{args.host}:{args.port}/invocations  "
          """{"dataframe_records": [{"text": "Two dogs play in the snow."}]}""", flush=True)
    # uvicorn handles SIGTERM and SIGINT (stop accepting, finish requests in flight, then the app's
    # shutdown decodes what is queued) and raises the signal again once done; caught here, so that a
    # drained server exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    uvicorn.run(create_app(state), host=args.host, port=args.port, log_level="warning",
                timeout_graceful_shutdown=int(args.drain_seconds))
    print("stopped: the queue is answered", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
