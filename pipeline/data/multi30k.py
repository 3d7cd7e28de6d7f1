"""Multi30k task 1 (Elliott et al. 2016): 29k English captions of Flickr images with German,
French and Czech translations; the project's default data set."""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.data.spec import Corpus, DatasetSpec, RemoteFile, Side

MULTI30K_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
MULTI30K_BASE_URL = f"https://github.com/multi30k/dataset/raw/{MULTI30K_COMMIT}/"
MULTI30K_RAW = "data/task1/raw/{split}.{lang}.gz"

# Published in shared/data/README.md for the files of the local mirror (byte-identical to
# upstream at MULTI30K_COMMIT). The other Multi30k files have no published hash.
MULTI30K_SHA256: dict[str, str] = {
    "data/task1/raw/test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "data/task1/raw/test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "data/task1/raw/test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "data/task1/raw/train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "data/task1/raw/train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "data/task1/raw/train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "data/task1/raw/val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "data/task1/raw/val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "data/task1/raw/val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}

# Task 1 splits and their languages upstream. The statistics in the upstream README (at the
# pinned commit) list train/val/test_2016_flickr for en, de, fr, cs and test_2017_flickr /
# test_2017_mscoco for en, de, fr. test_2018_flickr was first released with the English source
# side only (references held back for a Codalab evaluation); de/fr/cs files exist in later
# upstream history, but we could not confirm they are in the tree at MULTI30K_COMMIT, so those
# sides are marked unverified (allowed, with a warning; a missing file fails the download).
MULTI30K_SPLITS: dict[str, tuple[str, ...]] = {
    "train": ("en", "de", "fr", "cs"),
    "val": ("en", "de", "fr", "cs"),
    "test_2016_flickr": ("en", "de", "fr", "cs"),
    "test_2017_flickr": ("en", "de", "fr"),
    "test_2017_mscoco": ("en", "de", "fr"),
    "test_2018_flickr": ("en", "de", "fr", "cs"),
}
MULTI30K_UNVERIFIED: dict[str, frozenset[str]] = {"test_2018_flickr": frozenset({"de", "fr", "cs"})}


def multi30k_spec(sha256: Mapping[str, str] = MULTI30K_SHA256, base_url: str = MULTI30K_BASE_URL) -> DatasetSpec:
    """Multi30k task 1 (raw, gzip) at ``MULTI30K_COMMIT``; ``sha256`` maps paths to published hashes."""
    splits = {}
    for split, langs in MULTI30K_SPLITS.items():
        sides = {}
        for lang in langs:
            path = MULTI30K_RAW.format(split=split, lang=lang)
            sides[lang] = Side(RemoteFile(path, sha256.get(path)), fmt="gz")
        splits[split] = (Corpus(split, sides, MULTI30K_UNVERIFIED.get(split, frozenset())),)
    return DatasetSpec(
        name="multi30k",
        description="Multi30k task 1 (Elliott et al. 2016/2017, Barrault et al. 2018), github.com/multi30k/dataset",
        base_url=base_url,
        cache_name=f"multi30k-{MULTI30K_COMMIT[:10]}",
        splits=splits,
    )


SPEC = multi30k_spec()
