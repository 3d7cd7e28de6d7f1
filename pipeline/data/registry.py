"""The registry: every data set the pipeline can fetch, by the name ``data.dataset`` gives.

Adding a data set is one new module (its ``DatasetSpec``, see ``multi30k.py``) and one line here.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.data import multi30k, wmt14
from pipeline.data.spec import TRAIN_SPLIT, DataError, DatasetSpec

REGISTRY: dict[str, DatasetSpec] = {
    "multi30k": multi30k.SPEC,
    "wmt14_en_de": wmt14.WMT14_EN_DE,
    "wmt14_en_fr": wmt14.WMT14_EN_FR,
}


def get_spec(name: str) -> DatasetSpec:
    """The registry entry ``name``; ``DataError`` naming the known ones if there is none."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise DataError(f"data.dataset {name!r} is not in the registry (known: {', '.join(REGISTRY)})") from None


def check_data_params(dataset: str, src_lang: str, tgt_lang: str, valid_set: str, test_sets: Sequence[str]) -> None:
    """Check the ``data`` section's choices against the registry; ``ValueError`` whose message
    starts with the params.yaml key."""
    spec = REGISTRY.get(dataset)
    if spec is None:
        raise ValueError(f"data.dataset {dataset!r} is not in the registry (known: {', '.join(REGISTRY)})")
    for key, lang in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        if lang not in spec.languages:
            raise ValueError(f"data.{key} {lang!r} is not a language of {spec.name} "
                             f"(known: {', '.join(spec.languages)})")

    def check_eval(key: str, split: str) -> None:
        if split == TRAIN_SPLIT:
            raise ValueError(f"{key}: {TRAIN_SPLIT} is the training split; choose one of {', '.join(spec.eval_splits)}")
        if split not in spec.splits:
            raise ValueError(f"{key}: {split!r} is not a split of {spec.name} (known: {', '.join(spec.eval_splits)})")
        for lang in (src_lang, tgt_lang):
            if lang not in spec.split_languages(split):
                raise ValueError(f"{key}: {split} has no {lang} side in {spec.name}")

    check_eval("data.valid_set", valid_set)
    seen: set[str] = set()
    for split in test_sets:
        if split in seen:
            raise ValueError(f"data.test_sets: {split} is listed twice")
        seen.add(split)
        check_eval("data.test_sets", split)
