"""DVC stage ``export``: the averaged model as a CTranslate2 model (``models/ctranslate2``), the weights
mapped one to one by ``pipeline.serving.export`` (nothing retrained, nothing quantized: float32
weights, which CTranslate2 converts to the compute type chosen at load, int8 or float32).

Deterministic: the same ``models/model.pt`` and tokenizer give the same bytes (model.bin,
config.json, shared_vocabulary.json, spm.model), so DVC records one hash per averaged model.
"""

from __future__ import annotations

import argparse

from pipeline.config import paths
from pipeline.config.errors import ParamsError
from pipeline.stages.runner import run_stage


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    for needed in (paths.AVERAGED_MODEL, paths.TOKENIZER_MODEL):
        if not needed.is_file():
            raise ParamsError(f"{needed} does not exist: run the earlier stages first (dvc repro)")
    try:
        from pipeline.serving.export import export_ctranslate2
    except ImportError as err:   # the pinned wheel missing: nothing to export with
        raise ParamsError(f"cannot export to CTranslate2 ({err}): pip install -r requirements.txt") from None
    from transformer.checkpoint import load_model

    out = export_ctranslate2(load_model(paths.AVERAGED_MODEL), paths.TOKENIZER_MODEL, paths.CT2_MODEL)
    print(f"exported {paths.AVERAGED_MODEL} to {out} (CTranslate2, float32 weights)")


if __name__ == "__main__":
    run_stage(main)
