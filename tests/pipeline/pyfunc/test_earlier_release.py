"""A version registered by an earlier release still loads and translates: logged by the code of
``dc0e5c2`` (``git archive`` of this repository's history: its own ``log_translator``, model class
and code list), then loaded with ``mlflow.pyfunc.load_model``

- in a fresh process, as ``mlflow models serve`` does: the version's own code first on ``sys.path``;
- in this process, where today's ``pipeline`` is imported (the server's and the gate's case): the
  version's files are read by today's model class.

Both translate as today's translator does with the settings the version records. Moving modules
(``pipeline.config.decoding``, ``transformer.training``) must keep this. Real MLflow, a SQLite store."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from pipeline.config.decoding import DecodingConfig
from pipeline.serving.translator import load_translator

from ..conftest import REPO
from ..serving.test_mlflow_server import NAME, SOURCES, registered_in_temp_store

pytestmark = pytest.mark.service

EARLIER = "dc0e5c2618f1d9b0ff465ad33c35641b5932f3d3"   # before transformer/training/ and config/decoding.py
SETTINGS = {"beam_size": 2, "alpha": 1.5}   # other than versions 1 and 2's: a version of its own

LOG_WITH_EARLIER_CODE = """
import sys
from pathlib import Path
from pipeline.serving.model_logging import log_translator
root = Path(sys.argv[1])
print(log_translator(sys.argv[2], root / "model.pt", root / "spm.model", sys.argv[3], {settings},
                     metrics_file=root / "scores.json", corpus_stats_file=root / "missing-stats.json"))
"""

LOAD_IN_A_FRESH_PROCESS = """
import json, sys
import mlflow
import pandas as pd
model = mlflow.pyfunc.load_model(sys.argv[1])
print(json.dumps(list(model.predict(pd.DataFrame({"text": json.loads(sys.argv[2])})))))
"""


def earlier_code(into: Path) -> Path:
    """``pipeline/`` and ``transformer/`` as they were at ``EARLIER``."""
    known = subprocess.run(["git", "cat-file", "-e", f"{EARLIER}^{{commit}}"], cwd=REPO, capture_output=True)
    if known.returncode != 0:   # a shallow clone, or a copy without its history
        pytest.skip(f"this checkout's history has no {EARLIER[:7]} (git fetch --unshallow)")
    archive = subprocess.run(["git", "archive", "--format=tar", EARLIER, "pipeline", "transformer"], cwd=REPO,
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


@pytest.fixture(scope="module")
def earlier_version(tmp_path_factory) -> tuple[str, str, Path, Path]:
    """(store URI, the version the earlier code registered, checkpoint, tokenizer)."""
    root, uri, run_id, model_file, tokenizer_file = registered_in_temp_store(tmp_path_factory, "earlier")
    code = earlier_code(tmp_path_factory.mktemp("earlier-code"))
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    logged = subprocess.run([sys.executable, "-c", LOG_WITH_EARLIER_CODE.format(settings=SETTINGS), str(root), run_id,
                             NAME], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert logged.returncode == 0, logged.stdout[-3000:] + logged.stderr[-3000:]
    version = logged.stdout.strip().splitlines()[-1]
    newest = max(int(v.version) for v in MlflowClient(uri, uri).search_model_versions(f"name = '{NAME}'"))
    assert version == str(newest) and int(version) > 1, logged.stdout   # a version of its own, not an earlier one
    return uri, version, model_file, tokenizer_file


def expected(model_file: Path, tokenizer_file: Path) -> list[str]:
    """Today's translator with the settings the earlier evaluate stage registered (the run's max_len_b 12)."""
    decoding = DecodingConfig(**SETTINGS, max_len_b=12, stopping="exact")
    return load_translator(model_file, tokenizer_file, decoding, device="cpu").translate(SOURCES)


def test_the_version_carries_the_earlier_code(earlier_version, tmp_path):
    uri, version, _, _ = earlier_version
    local = Path(mlflow.artifacts.download_artifacts(f"models:/{NAME}/{version}", dst_path=str(tmp_path),
                                                     tracking_uri=uri))
    code = local / "code"
    assert (code / "pipeline" / "serving" / "decoding.py").is_file()
    assert not (code / "pipeline" / "config" / "decoding.py").exists()   # today's layout is not what it carries
    assert "class DecodingConfig" in (code / "pipeline" / "serving" / "decoding.py").read_text()


def test_an_earlier_version_loads_in_a_fresh_process_with_its_own_code(earlier_version, tmp_path):
    uri, version, model_file, tokenizer_file = earlier_version
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1")
    loaded = subprocess.run([sys.executable, "-c", LOAD_IN_A_FRESH_PROCESS, f"models:/{NAME}/{version}",
                             json.dumps(SOURCES)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert json.loads(loaded.stdout.strip().splitlines()[-1]) == expected(model_file, tokenizer_file)


def test_an_earlier_version_loads_beside_todays_code(earlier_version, monkeypatch):
    uri, version, model_file, tokenizer_file = earlier_version
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setattr(sys, "path", list(sys.path))   # MLflow puts the version's code first and leaves it there
    import pipeline.serving.mlflow_model  # noqa: F401  (today's, already imported as in the server)
    model = mlflow.pyfunc.load_model(f"models:/{NAME}/{version}")
    assert list(model.predict(pd.DataFrame({"text": SOURCES}))) == expected(model_file, tokenizer_file)
    python_model = model.unwrap_python_model()
    assert python_model.translator.decoding == DecodingConfig(**SETTINGS, max_len_b=12, stopping="exact")
    # Today's model class read the earlier version's files (the version's code did not replace it).
    assert Path(sys.modules[type(python_model).__module__].__file__).is_relative_to(REPO / "pipeline")
