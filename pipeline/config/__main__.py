"""``python -m pipeline.config``: check params.yaml before a pipeline starts (``make run`` does)."""

from __future__ import annotations

from pipeline.config.errors import ParamsError, exit_2_on
from pipeline.config.loader import PARAMS
from pipeline.config.params import check


def main(argv: list[str] | None = None) -> None:
    """``python -m pipeline.config [key=value ...]``: check params.yaml (``make run`` does, before
    ``dvc repro``); exit 2 with one line naming the key when a value is bad."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="overrides to check with it, as dvc exp run -S takes them")
    args = parser.parse_args(argv)
    check(PARAMS, args.overrides)
    print(f"{PARAMS}: every section valid", flush=True)


if __name__ == "__main__":
    exit_2_on((ParamsError,), main)
