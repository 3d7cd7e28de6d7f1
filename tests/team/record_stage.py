"""A stand-in stage for ``test_tracking_queue``'s sweep point: writes its output and hands an
average record (``params.yaml``'s ``point`` section names the experiment and the sha256s) to the
unsent queue's own code, as the pipeline's stages do at their end."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from pipeline.tracking.unsent import deferred
from pipeline.tracking.unsent.records import average


def main() -> None:
    point = yaml.safe_load(Path("params.yaml").read_text())["point"]
    Path("out.txt").write_text(f"{point['value']}\n")
    deferred.submit(average, {"experiment": point["experiment"], "section": {"average.last_n": 1},
                              "checkpoint_sha256": point["checkpoint"], "model_sha256": point["model"],
                              "timestamp": int(time.time() * 1000), "metrics": {"average/checkpoints_used": 1}})


if __name__ == "__main__":
    main()
