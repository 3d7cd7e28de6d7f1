"""transformer/tokens.py: the special ids shared by tokenizer, data store and search."""

import pytest

import transformer
from transformer.config import ModelConfig
from transformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

pytestmark = pytest.mark.fast


def test_special_ids():
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert ModelConfig(vocab_size=10).pad_id == PAD_ID
    assert (transformer.PAD_ID, transformer.EOS_ID) == (PAD_ID, EOS_ID)
