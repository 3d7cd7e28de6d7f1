"""DVC stage 4: average the last N checkpoints into one model (§6.1)."""

from __future__ import annotations

import argparse

from pipeline import paths
from pipeline.params import ParamsError, load_params, run_stage
from transformer.checkpoint import average_checkpoints, save_checkpoint
from transformer.trainer import list_checkpoints


def average(last_n: int) -> list[str]:
    checkpoints = list_checkpoints(paths.CHECKPOINT_DIR)
    if not checkpoints:
        raise ParamsError(f"no checkpoints in {paths.CHECKPOINT_DIR}: run the train stage first")
    chosen = checkpoints[-last_n:]
    averaged = average_checkpoints(chosen)
    # The newest checkpoint's extra state (e.g. the tracking run) travels with the model.
    save_checkpoint(paths.AVERAGED_MODEL, averaged)
    return [str(p) for p in chosen]


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    params = load_params()
    chosen = average(params.average.last_n)
    print(f"averaged {len(chosen)} checkpoint(s) into {paths.AVERAGED_MODEL}: {', '.join(chosen)}")


if __name__ == "__main__":
    run_stage(main)
