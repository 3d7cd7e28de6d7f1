"""Where stages read and write, relative to the repository root (DVC runs stages there)."""

from pathlib import Path

CORPUS_DIR = Path("data/corpus")
DOWNLOAD_CACHE = Path("data/cache")
TOKENIZER_MODEL = Path("data/tokenizer/spm.model")
TOKENS_DIR = Path("data/tokens")
CHECKPOINT_DIR = Path("models/checkpoints")
AVERAGED_MODEL = Path("models/model.pt")
CT2_MODEL = Path("models/ctranslate2")   # the export stage's CTranslate2 model of AVERAGED_MODEL
REPORTS_DIR = Path("reports")
TRAIN_CURVE = REPORTS_DIR / "train_curve.csv"
VALID_CURVE = REPORTS_DIR / "valid_curve.csv"
TRAIN_METRICS = REPORTS_DIR / "train_metrics.json"
METRICS = REPORTS_DIR / "metrics.json"
TRANSLATIONS_DIR = REPORTS_DIR / "translations"
ATTENTION_DIR = REPORTS_DIR / "attention"


def corpus_file(split: str, lang: str) -> Path:
    return CORPUS_DIR / f"{split}.{lang}"


def token_store(split: str) -> Path:
    return TOKENS_DIR / split
