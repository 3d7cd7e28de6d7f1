"""The translator as an MLflow pyfunc model: ``predict`` turns source sentences into translations.

Logged with the averaged checkpoint and the SentencePiece model as artifacts and the
``transformer`` and ``pipeline`` packages as code, so ``mlflow.pyfunc.load_model`` needs
nothing from this repository.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
import pandas as pd

PIP_REQUIREMENTS_OF = ("torch", "numpy", "sentencepiece", "pandas", "mlflow")


class TranslatorModel(mlflow.pyfunc.PythonModel):
    """pyfunc wrapper of ``pipeline.translation.Translator`` (beam search, §6.1)."""

    def load_context(self, context: Any) -> None:
        from pipeline.translation import Translator
        from transformer.checkpoint import load_model
        from transformer.tokenizer import Tokenizer

        self.translator = Translator(load_model(context.artifacts["model"]), Tokenizer(context.artifacts["tokenizer"]))

    def predict(self, context, model_input, params=None):  # noqa: ANN001, ANN201 (MLflow reads type hints as a schema)
        """model_input: a DataFrame with a ``text`` column (or one column), a list of str, or a str."""
        if isinstance(model_input, pd.DataFrame):
            column = "text" if "text" in model_input.columns else model_input.columns[0]
            sentences = model_input[column].astype(str).tolist()
        elif isinstance(model_input, str):
            sentences = [model_input]
        else:
            sentences = [str(s) for s in model_input]
        params = params or {}
        self.translator.beam_size = int(params.get("beam_size", self.translator.beam_size))
        self.translator.alpha = float(params.get("alpha", self.translator.alpha))
        return self.translator.translate(sentences)


def _pins() -> list[str]:
    from importlib.metadata import version

    return [f"{name}=={version(name).split('+')[0]}" for name in PIP_REQUIREMENTS_OF]


def log_translator(run_id: str, model_file: Path, tokenizer_file: Path, registered_name: str,
                   beam_size: int, alpha: float) -> str | None:
    """Log the pyfunc model into ``run_id`` and register it; returns the new registry version."""
    from mlflow.models import infer_signature

    import pipeline
    import transformer

    example = pd.DataFrame({"text": ["A man is walking."]})
    signature = infer_signature(example, ["Ein Mann geht."], params={"beam_size": beam_size, "alpha": alpha})
    with mlflow.start_run(run_id=run_id):
        info = mlflow.pyfunc.log_model(
            name="translator", python_model=TranslatorModel(),
            artifacts={"model": str(model_file), "tokenizer": str(tokenizer_file)},
            code_paths=[str(Path(transformer.__file__).parent), str(Path(pipeline.__file__).parent)],
            pip_requirements=_pins(), signature=signature, input_example=example,
            registered_model_name=registered_name,
        )
    return str(info.registered_model_version) if info.registered_model_version is not None else None
