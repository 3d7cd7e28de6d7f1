"""``python -m pipeline.tracking.replay``: send what waits for the tracking server in
``reports/mlflow_unsent.json`` (runs' metrics and tags, then the later stages' records: metrics,
artifacts, the model and its registration), in order, one replay at a time (a file lock). The next
stage and ``make push`` do the same by themselves; this is for when neither runs next.

Exit 0 when nothing waits any more, 1 while something still does (``--keep-going``: 0, for callers
that go on anyway, such as ``make push``), with one line saying what.
"""

from __future__ import annotations

import argparse
import sys

from pipeline.tracking import unsent
from pipeline.tracking.unsent import UNSENT_FILE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.tracking.replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep-going", action="store_true", help="exit 0 even while something still waits")
    parser.add_argument("--quiet", action="store_true", help="print nothing when nothing waits")
    args = parser.parse_args(argv)
    if not UNSENT_FILE.is_file():
        if not args.quiet:
            print(f"MLflow: nothing waits to be sent (no {UNSENT_FILE})")
        return 0
    from pipeline.tracking import deferred  # MLflow, only when something waits

    with unsent.locked():
        left = deferred.replay()
        if left:
            deferred.print_waiting()
        else:
            print("MLflow: everything that waited has been sent", flush=True)
    return 0 if args.keep_going or not left else 1


if __name__ == "__main__":
    sys.exit(main())
