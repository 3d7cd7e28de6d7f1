"""pipeline/workers/sweep/fanout.py's pure parts: what a point prints, a repository URL without its
secret (the Prefect and DVC parts run in tests/team/test_sweep_pool.py)."""

from __future__ import annotations

import pytest

from pipeline.experiments.sweep_points import Step
from pipeline.workers.sweep.fanout import Point, describe, redacted

pytestmark = pytest.mark.fast


def test_a_url_loses_its_password_or_token_and_keeps_the_rest():
    assert redacted("https://ci:s3cret@git.example.org:8443/ml/t.git") == "https://***@git.example.org:8443/ml/t.git"
    assert redacted("https://ghp_token@github.com/ml/t.git") == "https://***@github.com/ml/t.git"
    for plain in ("git://10.0.0.1:9418/translator.git", "git@git.example.org:ml/t.git", "/srv/git/t.git",
                  "https://git.example.org/ml/t.git"):
        assert redacted(plain) == plain


def test_each_point_is_described_by_its_values_and_what_happens_to_it():
    points = [Point({"train.lr_scale": 0.5, "train.max_minutes": 8}, {"train.lr_scale": 0.5})]
    (line,) = describe([Step(0, "resume", queue="on-b", why="it crashed on on-b")], points)
    assert line == "  point 0 (train.lr_scale=0.5): resume on on-b (it crashed on on-b)"
