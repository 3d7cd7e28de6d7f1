"""``python -m pipeline.tracking.replay``: send what a stage could not send to MLflow while the
tracking server was away (``reports/mlflow_unsent.json``) into the same runs. The next stage's run
lookup does the same by itself; this is for when no stage runs next. Exit 1 while some remain."""

from __future__ import annotations

import sys

from pipeline.tracking.buffer import UNSENT_FILE, replay_unsent


def main() -> int:
    if not UNSENT_FILE.is_file():
        print(f"nothing to replay: no {UNSENT_FILE}")
        return 0
    left = replay_unsent()
    if left:
        print(f"{left} run(s) still unsent; kept in {UNSENT_FILE}", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
