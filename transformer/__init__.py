"""A paper-faithful Transformer ("Attention Is All You Need", Vaswani et al., 2017) in PyTorch.

Standalone: depends on torch and numpy (and sentencepiece for ``transformer.tokenizer``).

The names below are loaded from their modules on first use (PEP 562), so that importing one
module (``transformer.training.trainer``) does not run the others (``transformer.search``): the pipeline's
DVC stages depend on exactly the files they run.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "average_checkpoints": "checkpoint", "load_checkpoint": "checkpoint", "load_model": "checkpoint",
    "save_checkpoint": "checkpoint",
    "PRESETS": "config", "ModelConfig": "config", "build_config": "config",
    "CheckpointError": "errors", "ConfigError": "errors", "NonFiniteLossError": "errors",
    "OutOfMemoryError": "errors",
    "AttentionWeights": "model", "DecoderCache": "model", "Transformer": "model",
    "SearchResult": "search", "beam_search": "search", "greedy_search": "search",
    "BOS_ID": "tokens", "EOS_ID": "tokens", "PAD_ID": "tokens", "UNK_ID": "tokens",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'transformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
