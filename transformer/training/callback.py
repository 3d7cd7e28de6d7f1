"""How a caller observes a training (§5) without the Trainer knowing it: the pipeline's tracking,
curves and tests are ``TrainerCallback`` subclasses."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .trainer import Trainer


class TrainerCallback:
    """Hooks the pipeline uses to observe training; every method is optional."""

    def on_train_start(self, trainer: Trainer) -> None: ...
    def on_log(self, step: int, metrics: dict[str, float]) -> None: ...
    def on_validate(self, step: int, metrics: dict[str, float]) -> None: ...
    def on_checkpoint(self, step: int, path: Path) -> None: ...
    def on_train_end(self, trainer: Trainer) -> None: ...
    def checkpoint_state(self) -> dict[str, Any]:
        """Extra (plain) values to store in each checkpoint, e.g. a tracking run id."""
        return {}
