"""A paper-faithful Transformer ("Attention Is All You Need", Vaswani et al., 2017) in PyTorch.

Standalone: depends on torch and numpy only (sentencepiece is the pipeline's business).
"""

from .checkpoint import average_checkpoints, load_checkpoint, load_model, save_checkpoint
from .config import PRESETS, ConfigError, ModelConfig, build_config
from .model import AttentionWeights, DecoderCache, Transformer
from .search import SearchResult, beam_search, greedy_search
from .tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__all__ = [
    "PRESETS", "ConfigError", "ModelConfig", "build_config", "Transformer", "DecoderCache",
    "AttentionWeights", "beam_search", "greedy_search", "SearchResult", "average_checkpoints",
    "load_checkpoint", "load_model", "save_checkpoint", "PAD_ID", "UNK_ID", "BOS_ID", "EOS_ID",
]
