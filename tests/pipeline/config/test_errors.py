"""pipeline/config/errors.py: a missing tune report is a ParamsError callers may fall back from; a
corrupt one is a plain ParamsError, never a fallback."""

from __future__ import annotations

import pytest

from pipeline.config.decoding import EvaluateParams
from pipeline.config.errors import ParamsError, TuneReportMissing
from pipeline.serving.decoding import decoding_settings

pytestmark = pytest.mark.fast


def test_a_missing_report_is_tune_report_missing(tmp_path):
    with pytest.raises(TuneReportMissing, match="tune.json does not exist: evaluate.beam_size and evaluate.alpha"):
        decoding_settings(EvaluateParams(stopping="exact"), tmp_path / "tune.json")
    assert issubclass(TuneReportMissing, ParamsError)   # uncaught, the stage runner's one line and exit 2


@pytest.mark.parametrize("text", ["{not json", '{"chosen": {"beam_size": 0, "alpha": 1, "stopping": "exact"}}',
                                  '{"chosen": {"beam_size": 4, "alpha": 1.5}}', "[]"])
def test_a_corrupt_report_is_an_error_not_a_fallback(tmp_path, text):
    report = tmp_path / "tune.json"
    report.write_text(text)
    with pytest.raises(ParamsError, match="holds no valid choice") as err:
        decoding_settings(EvaluateParams(), report)
    assert not isinstance(err.value, TuneReportMissing)
