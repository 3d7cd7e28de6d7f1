"""``python -m pipeline.experiments.apply --sweep NAME`` (``make sweep-apply SWEEP=NAME``): the winner of
a sweep, run on a work pool or here (``make sweep``), into this clone.

1. The winner: the sweep's run with the best validation BLEU on the tracking server (``valid_bleu``,
   the decoding chosen on val; test scores never choose), and its DVC experiment (tag
   ``sweep.experiment``).
2. ``dvc exp pull origin <experiment>`` (a pool sweep's: its git ref from the repository, its outputs
   from the DVC remote), then ``dvc exp apply <experiment>``: params.yaml, dvc.lock and the outputs are the point's.
3. Its model, logged by the point and not registered, is registered as a version of
   ``tracking.registered_model`` whose model card names the sweep, the point and the run (the
   champion alias is not moved: the promotion gate moves it).
4. What to commit: params.yaml and dvc.lock; a clean clone of that commit then has every output with
   ``make pull`` (the point pushed them) and ``dvc status`` is clean.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from typing import Any

from pipeline.config.overrides import dvc_executable


class ApplyError(RuntimeError):
    pass


def dvc(*args: str) -> None:
    print("$ dvc " + " ".join(args), flush=True)
    proc = subprocess.run([dvc_executable(), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        raise ApplyError(f"dvc {' '.join(args)} failed (exit {proc.returncode}): {detail[0]}")


def local_experiments() -> set[str]:
    """The DVC experiments of this clone (a local sweep's are here already)."""
    proc = subprocess.run([dvc_executable(), "exp", "list", "--all-commits", "--name-only"], capture_output=True,
                          text=True)
    return {line.strip() for line in proc.stdout.splitlines() if line.strip()} if proc.returncode == 0 else set()


def winner(experiment: str, sweep: str) -> dict[str, str]:
    """The sweep's finished run with the best validation BLEU: its run id, score, point, grid values
    and DVC experiment."""
    from pipeline.experiments.sweep_points import ranked_runs
    from pipeline.scoring.reports import RANK_METRIC

    runs = ranked_runs(experiment, sweep)
    # The experiment holds a point's last attempt to finish: of two runs of one point (an attempt whose
    # push failed, then another), only the newest finished one is that experiment's.
    newest: dict[str, Any] = {}
    for _, run in runs.iterrows():
        name = run.get("tags.sweep.experiment")
        if run["status"] == "FINISHED" and isinstance(name, str) and (
                name not in newest or run["start_time"] > newest[name]["start_time"]):
            newest[name] = run
    for _, run in runs.iterrows():
        score = run.get(f"metrics.{RANK_METRIC}")
        name = run.get("tags.sweep.experiment")
        if isinstance(name, str) and newest.get(name) is not None and newest[name]["run_id"] == run["run_id"] \
                and score is not None and not math.isnan(score):
            return {"run_id": run["run_id"], "score": f"{score:.2f}", "experiment": name,
                    "point": str(run.get("tags.sweep.point", "?")), "values": str(run.get("tags.sweep.overrides", ""))}
    raise ApplyError(f"no finished run of sweep {sweep!r} in experiment {experiment!r} has {RANK_METRIC} and a DVC "
                     "experiment: `make compare SWEEP=...` shows its runs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.experiments.apply", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", required=True, help="the sweep (make sweep's name)")
    parser.add_argument("--git-remote", default="origin", help="the repository the points pushed to (default origin)")
    parser.add_argument("--no-register", action="store_true", help="apply only; register nothing")
    args = parser.parse_args(argv)

    from pipeline.config import paths
    from pipeline.config.errors import ParamsError
    from pipeline.config.params import load_params
    from pipeline.pyfunc.log_version import register_logged
    from pipeline.scoring.reports import EVALUATE_SCORES, RANK_METRIC
    from pipeline.tracking.preflight import PreflightError, check_tracking_server

    try:
        print(f"tracking: {check_tracking_server()}", flush=True)
        best = winner(load_params().tracking.experiment, args.sweep)
        print(f"winner of sweep {args.sweep}: point {best['point']} ({best['values']}), {RANK_METRIC} {best['score']}, "
              f"run {best['run_id']}, DVC experiment {best['experiment']}", flush=True)
        if best["experiment"] not in local_experiments():   # a pool sweep's: on the repository
            dvc("exp", "pull", args.git_remote, best["experiment"])
        dvc("exp", "apply", best["experiment"])
        version = ""
        if not args.no_register:
            name = load_params().tracking.registered_model   # the applied params.yaml's
            version = register_logged(best["run_id"], name, paths.AVERAGED_MODEL, EVALUATE_SCORES,
                                      paths.CORPUS_DIR / "stats.json")
            print(f"registered {name!r} version {version}: its model card names sweep {args.sweep}, point "
                  f"{best['point']} and run {best['run_id']} (champion unchanged: the promotion gate moves it)",
                  flush=True)
    except (ApplyError, ParamsError, PreflightError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:   # noqa: BLE001 (the tracking server's answer: MlflowException, a bad tag)
        print(f"error: {type(err).__name__}: {' '.join(str(err).split())[:400]}", file=sys.stderr)
        return 2
    changed = subprocess.run(["git", "status", "--porcelain", "--", "params.yaml", "dvc.lock"], capture_output=True,
                             text=True).stdout.split()
    files = [f for f in ("params.yaml", "dvc.lock") if f in changed]
    if files:
        print(f"\nnow commit it:\n  git add {' '.join(files)}\n  git commit -m 'sweep {args.sweep}: point "
              f"{best['point']} ({best['experiment']}, {RANK_METRIC} {best['score']})'\n  git push\n"
              "a clean clone of that commit then: make pull (its outputs are on the remote)", flush=True)
    else:
        print("\nparams.yaml and dvc.lock are already the winner's: nothing to commit", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
