"""``flows.retrain_mode``: what the retraining flow trains from, scratch or the champion.

The flow owns two params, ``train.init_from`` and ``tokenizer.model_from``:

- ``finetune`` with a champion in the registry: the champion's averaged model (config + weights)
  and SentencePiece model, downloaded from its registered version into
  ``models/init/<model>-v<version>-<sha12>/`` (``model.pt``, ``spm.model``), and the two keys
  pointing at them. The tokenizer stage then copies the champion's tokenizer instead of training
  one on the changed data (the weights' embedding rows are that tokenizer's pieces), and the
  train stage starts from the champion's weights.
- ``scratch``, and ``finetune`` before there is a champion: both keys empty (random weights, a
  tokenizer trained on the data).

The folder's name carries the files' hash, so a new champion is a new params value (DVC reruns
the tokenizer and train stages through their params) and the same champion twice changes nothing.
No Prefect here: the flow calls ``plan_retraining`` in a task, the tests call it directly.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from mlflow.tracking import MlflowClient

from pipeline.config.params import Params
from pipeline.flows.gate import current_champion, version_files
from transformer.checkpoint import atomic_write, file_sha256

INIT_DIR = Path("models/init")
MODEL_FILE, TOKENIZER_FILE = "model.pt", "spm.model"
SCRATCH, FINETUNE = "scratch", "finetune"


@dataclass(frozen=True)
class RetrainPlan:
    """What one retraining trains from: ``mode`` is what runs, ``requested`` what params.yaml asks."""

    requested: str
    mode: str
    init_from: str = ""            # train.init_from (relative to the repository root)
    model_from: str = ""           # tokenizer.model_from
    champion_version: str = ""     # the registry version fine-tuned from
    init_sha256: str = ""          # of init_from's bytes (the train stage tags its run with the same)
    note: str = ""

    def settings(self) -> dict[str, str]:
        return {"train.init_from": self.init_from, "tokenizer.model_from": self.model_from}

    def overrides(self, params: Params) -> list[str]:
        """``key=value`` for each owned key whose params.yaml value differs (for ``dvc exp run -S``)."""
        current = {"train.init_from": params.train.init_from, "tokenizer.model_from": params.tokenizer.model_from}
        return [f"{key}={value}" for key, value in self.settings().items() if current[key] != value]

    def tags(self) -> dict[str, str]:
        """MLflow tags for the challenger's run."""
        return {"retrain.mode": self.mode, "retrain.requested_mode": self.requested,
                "retrain.init_version": self.champion_version or "none",
                "retrain.init_sha256": self.init_sha256 or "none"}

    def describe(self) -> str:
        if self.mode == FINETUNE:
            return (f"fine-tuning champion version {self.champion_version}: train.init_from={self.init_from} "
                    f"(sha256 {self.init_sha256[:12]}), tokenizer.model_from={self.model_from}")
        return "training from scratch" + (f" ({self.note})" if self.note else "")

    def markdown(self) -> str:
        lines = ["", "## Retraining", "", f"- mode: **{self.mode}** (flows.retrain_mode: {self.requested})"]
        if self.mode == FINETUNE:
            lines += [f"- started from champion version {self.champion_version}: `{self.init_from}` "
                      f"(sha256 `{self.init_sha256[:12]}`), tokenizer `{self.model_from}`"]
        if self.note:
            lines += [f"- {self.note}"]
        return "\n".join(lines) + "\n"

    def summary(self) -> dict[str, str]:
        return asdict(self)


def _safe(name: str) -> str:
    """A registered model name as a path component and a plain value for ``dvc exp run -S``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".") or "model"


def fetch_champion(client: MlflowClient, name: str, version: str, root: Path,
                   tracking_uri: str | None = None) -> tuple[Path, Path, str]:
    """Download version ``version`` of ``name`` into ``root/models/init/<name>-v<version>-<sha12>/``
    (each file written atomically; an existing identical folder is left as it is). Returns the model
    and tokenizer paths relative to ``root`` and the sha256 of the model file."""
    with tempfile.TemporaryDirectory(prefix="champion-") as tmp:
        files = version_files(client, name, version, Path(tmp), tracking_uri)
        model_sha, tokenizer_sha = file_sha256(files["model"]), file_sha256(files["tokenizer"])
        key = hashlib.sha256(f"{model_sha}:{tokenizer_sha}".encode()).hexdigest()[:12]
        folder = INIT_DIR / f"{_safe(name)}-v{version}-{key}"
        for source, target, sha in ((files["model"], folder / MODEL_FILE, model_sha),
                                    (files["tokenizer"], folder / TOKENIZER_FILE, tokenizer_sha)):
            if not (root / target).is_file() or file_sha256(root / target) != sha:
                data = source.read_bytes()
                atomic_write(root / target, lambda f, data=data: f.write(data))
    return folder / MODEL_FILE, folder / TOKENIZER_FILE, model_sha


def plan_retraining(client: MlflowClient, params: Params, root: Path, tracking_uri: str | None = None) -> RetrainPlan:
    """The plan for ``params.flows.retrain_mode``; in finetune mode with a champion, its files are
    downloaded into ``root/models/init/`` (see the module docstring)."""
    requested = params.flows.retrain_mode
    if requested == SCRATCH:
        return RetrainPlan(requested, SCRATCH)
    name = params.tracking.registered_model
    champion = current_champion(client, name)
    if champion is None:
        return RetrainPlan(requested, SCRATCH, note=f"no champion of {name} yet: the first model is trained from "
                                                    "scratch (finetune falls back to scratch)")
    model, tokenizer, sha = fetch_champion(client, name, str(champion.version), root, tracking_uri)
    return RetrainPlan(requested, FINETUNE, model.as_posix(), tokenizer.as_posix(), str(champion.version), sha)
