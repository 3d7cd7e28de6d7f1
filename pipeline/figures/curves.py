"""Training curves for ``dvc plots``: CSV files rewritten atomically, their rows kept in
each checkpoint so that a resumed run continues the same curves.

The files are DVC outputs, so they hold only what follows from the data and params: the speed
(target tokens/s) is a property of the machine and goes to the console and MLflow, not here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from transformer.atomic import write_text
from transformer.training.callback import TrainerCallback

# Metrics of the machine, not of the model: printed and tracked, never written to the curves.
MACHINE_METRICS = frozenset({"train/target_tokens_per_s"})


class CurveWriter(TrainerCallback):
    """Writes ``train_curve.csv`` and ``valid_curve.csv`` and prints a progress line per log."""

    def __init__(self, train_csv: Path, valid_csv: Path, echo: bool = True) -> None:
        self.files = {"train": train_csv, "valid": valid_csv}
        self.rows: dict[str, list[dict[str, float]]] = {"train": [], "valid": []}
        self.echo = echo

    def restore(self, state: dict[str, Any]) -> None:
        """The rows a checkpoint kept, written out at once: a training resumed at its length logs
        nothing more, and DVC deleted the files before running the stage."""
        self.rows = {k: [dict(r) for r in v] for k, v in state.get("curves", self.rows).items()}
        for kind in self.files:
            self._write(kind)

    def checkpoint_state(self) -> dict[str, Any]:
        return {"curves": self.rows}

    def history(self) -> list[tuple[int, dict[str, float]]]:
        """Every point so far as (step, metrics named as the trainer named them, e.g. ``train/loss``)."""
        return [(int(row["step"]), {f"{kind}/{k}": v for k, v in row.items() if k != "step"})
                for kind, rows in self.rows.items() for row in rows]

    def _write(self, kind: str) -> None:
        rows = self.rows[kind]
        if not rows:
            return
        columns = list(rows[0])
        lines = [",".join(columns)] + [",".join(f"{r[c]:.6g}" for c in columns) for r in rows]
        write_text(self.files[kind], "\n".join(lines) + "\n")

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        self.rows["train"].append({"step": step, **{k.split("/", 1)[1]: v for k, v in metrics.items()
                                                    if k not in MACHINE_METRICS}})
        self._write("train")
        if self.echo:
            print(f"step {step:>6}  epoch {metrics['train/epoch']:.0f}  loss {metrics['train/loss']:.3f}  "
                  f"ppl {metrics['train/ppl']:.2f}  lr {metrics['train/lr']:.2e}  "
                  f"{metrics['train/target_tokens_per_s']:,.0f} tok/s", file=sys.stderr, flush=True)

    def on_validate(self, step: int, metrics: dict[str, float]) -> None:
        self.rows["valid"].append({"step": step, **{k.split("/", 1)[1]: v for k, v in metrics.items()}})
        self._write("valid")
        if self.echo:
            print(f"step {step:>6}  valid loss {metrics['valid/loss']:.3f}  ppl {metrics['valid/ppl']:.2f}",
                  file=sys.stderr, flush=True)
