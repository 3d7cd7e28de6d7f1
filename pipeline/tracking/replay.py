"""``python -m pipeline.tracking.replay``: send what waits for the tracking server in the repository's
``reports/mlflow_unsent.json`` (runs' metrics and tags, then the later stages' records: metrics,
artifacts, the model and its registration), in order, one replay at a time (a file lock). The next
stage and ``make push`` do the same by themselves; this is for when neither runs next.

A record that failed for another reason than the server being away is set aside, with the records
that need it; ``--list`` shows what waits and what is set aside and why, ``--retry ID`` sends a
set-aside record (and those it held back) again, ``--drop ID`` removes them for good.

Exit 0 when nothing waits any more, 1 while something still waits or is set aside (``--keep-going``:
0, for callers that go on anyway, such as ``make push``), with one line saying what; 2 when the
server refuses the credentials (401/403: one line naming them), or for an unknown ID.
"""

from __future__ import annotations

import argparse
import sys

from pipeline.tracking.unsent import on_disk


def _handle(args: argparse.Namespace) -> int:
    from pipeline.tracking.unsent import deferred  # MLflow, only when something waits

    if args.list:
        lines = deferred.listing()
        print("\n".join(lines) if lines else "MLflow: nothing waits and nothing is set aside")
        return 0
    if args.drop:
        dropped = deferred.drop(args.drop)
        if not dropped:
            return _unknown(args.drop)
        for entry in dropped:
            registers = f" (and with it the registration of {entry['registers']!r})" if entry.get("registers") else ""
            print(f"MLflow: dropped the set-aside {on_disk.entry_name(entry)}{registers}; it will never be sent",
                  flush=True)
        return 0
    if args.retry:
        if not deferred.retry(args.retry):
            return _unknown(args.retry)
    else:
        deferred.replay()
    doc = on_disk.load()
    if on_disk.waiting(doc) or doc["set_aside"]:
        deferred.print_waiting(doc)
        return 0 if args.keep_going else 1
    print("MLflow: everything that waited has been sent", flush=True)
    return 0


def _unknown(entry_id: str) -> int:
    print(f"error: nothing set aside has the ID {entry_id!r} (python -m pipeline.tracking.replay --list)",
          file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.tracking.replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep-going", action="store_true", help="exit 0 even while something still waits")
    parser.add_argument("--quiet", action="store_true", help="print nothing when nothing waits")
    actions = parser.add_mutually_exclusive_group()
    actions.add_argument("--list", action="store_true", help="what waits and what is set aside, and why")
    actions.add_argument("--retry", metavar="ID", help="send a set-aside record (and those it held back) again")
    actions.add_argument("--drop", metavar="ID", help="remove a set-aside record (and those it held back) for good")
    args = parser.parse_args(argv)
    file = on_disk.queue_file()
    if not file.is_file():
        if args.retry or args.drop:
            return _unknown(args.retry or args.drop)
        if not args.quiet:
            print(f"MLflow: nothing waits to be sent (no {on_disk.shown(file)})")
        return 0
    from pipeline.tracking.preflight import CredentialsRefused

    try:
        with on_disk.locked():
            return _handle(args)
    except CredentialsRefused as err:   # nothing was dropped: everything waits for the right credentials
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
