"""transformer/errors.py: the errors callers catch, defined apart from the code that raises them and
re-exported there, so old imports and new ones catch the same class."""

import ast
from pathlib import Path

import pytest

import transformer
from transformer import checkpoint, config, errors
from transformer.training import train_config, trainer

pytestmark = pytest.mark.fast


def test_one_class_each_wherever_it_is_imported_from():
    assert config.ConfigError is errors.ConfigError is transformer.ConfigError
    assert checkpoint.CheckpointError is trainer.CheckpointError is errors.CheckpointError
    assert train_config.OutOfMemoryError is trainer.OutOfMemoryError is errors.OutOfMemoryError
    assert train_config.NonFiniteLossError is trainer.NonFiniteLossError is errors.NonFiniteLossError
    assert issubclass(errors.ConfigError, ValueError) and errors.ConfigError("m", "d_model").fields == ("d_model",)


def test_the_errors_module_imports_nothing_but_annotations():
    """What lets the stage runner catch these without loading torch or the model."""
    tree = ast.parse(Path(errors.__file__).read_text(encoding="utf-8"))
    imported = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert [ast.unparse(node) for node in imported] == ["from __future__ import annotations"]
