"""pipeline/serving/decoding.py: what one request may set, the tune stage's choice and where each
evaluate setting came from (the settings themselves: tests/pipeline/config/test_decoding.py)."""

from __future__ import annotations

import json

import pytest

from pipeline.config import decoding as settings
from pipeline.config.decoding import DecodingConfig
from pipeline.config.errors import ParamsError, TuneReportMissing
from pipeline.serving import decoding
from pipeline.serving.decoding import RequestError, decoding_settings, request_settings

pytestmark = pytest.mark.fast


# ----------------------------------------------------------------------------- one request


def test_a_request_sets_only_what_it_gives():
    served = DecodingConfig(beam_size=2, alpha=1.0, max_len_b=12, stopping="fairseq")
    assert request_settings(served, None) == request_settings(served, {}) == served
    got = request_settings(served, {"beam_size": 1, "max_len_b": 99, "other": "x"})   # not request settings: ignored
    assert got == served.replace(beam_size=1)
    # JSON clients send numbers as they like: 5.0 and "5" are the beam size 5; an integer alpha is a float
    assert request_settings(served, {"beam_size": 5.0, "alpha": 2}).per_request() == {
        "beam_size": 5, "alpha": 2.0, "stopping": "fairseq"}
    assert request_settings(served, {"beam_size": "5", "alpha": "0.5", "stopping": "exact"}).per_request() == {
        "beam_size": 5, "alpha": 0.5, "stopping": "exact"}
    # The served version's own settings are not a request's: a beam over the request limit still serves.
    wide = DecodingConfig(beam_size=settings.MAX_BEAM + 4, alpha=12.0)
    assert request_settings(wide, {}) == wide


@pytest.mark.parametrize("params, message", [
    ({"beam_size": 99}, "params: beam_size must be between 1 and 16, got 99"),
    ({"beam_size": 0}, "params: beam_size must be between 1 and 16, got 0"),
    ({"beam_size": 4.5}, "params: beam_size must be an integer, got float 4.5"),
    ({"beam_size": True}, "params: beam_size must be an integer, got bool True"),
    ({"beam_size": [4]}, "params: beam_size must be an integer, got list [4]"),
    ({"alpha": 10.5}, "params: alpha must be between 0 and 10, got 10.5"),
    ({"alpha": -1}, "params: alpha must be between 0 and 10, got -1.0"),
    ({"alpha": "nan"}, "params: alpha must be a number, got str 'nan'"),
    ({"alpha": "x"}, "params: alpha must be a number, got str 'x'"),
    ({"stopping": "soon"}, "params: stopping must be one of exact, fairseq, got str 'soon'"),
])
def test_a_bad_request_param_says_why(params, message):
    with pytest.raises(RequestError) as err:
        request_settings(DecodingConfig(), params)
    assert str(err.value) == message


def test_request_limits_bound_what_a_request_costs():
    widest = request_settings(DecodingConfig(), {"beam_size": settings.MAX_BEAM, "alpha": settings.ALPHA_RANGE[1]})
    assert (widest.beam_size, widest.alpha) == (16, 10.0)
    assert request_settings(DecodingConfig(), {"beam_size": 1, "alpha": 0}).alpha == 0.0


# ----------------------------------------------------------------------------- the tune stage's choice


def test_decoding_settings_follow_tune_for_null_keys(tmp_path):
    report = tmp_path / "tune.json"
    report.write_text(json.dumps({"chosen": {"beam_size": 4, "alpha": 1, "stopping": "fairseq", "engine": "torch",
                                             "compute_type": None}, "valid_bleu": 39.1}))
    d = decoding_settings({"beam_size": None, "alpha": None, "stopping": None}, report)
    assert d.as_dict() == {"beam_size": 4, "alpha": 1.0, "stopping": "fairseq", "engine": "torch", "compute_type": None,
                           "beam_size_from": "tune", "alpha_from": "tune", "stopping_from": "tune",
                           "engine_from": "tune", "compute_type_from": "tune"}
    assert isinstance(d.alpha, float)           # 1 in JSON: the alpha 1.0, as the tune stage decoded it
    d = decoding_settings({"beam_size": 1, "alpha": None, "stopping": "exact"}, report)
    assert (d.beam_size, d.alpha, d.stopping, d.beam_size_from, d.alpha_from) == (1, 1.0, "exact", "params", "tune")
    assert d.applied_to(DecodingConfig(max_len_b=8)) == DecodingConfig(beam_size=1, alpha=1.0, max_len_b=8)
    with pytest.raises(AttributeError, match="Decoding has no 'beam'"):
        d.beam   # noqa: B018
    # a report from before tune chose the engine: decoded by torch, no compute type
    report.write_text(json.dumps({"chosen": {"beam_size": 4, "alpha": 1.5, "stopping": "exact"}}))
    assert (decoding_settings({}, report).engine, decoding_settings({}, report).compute_type) == ("torch", None)


def tune_reports(tmp_path, chosen_engine: str = "ctranslate2"):
    """reports/tune.json choosing ``chosen_engine`` and the detail beside it with each engine's own point."""
    points = {"torch": {"beam_size": 4, "alpha": 1.5, "stopping": "exact", "engine": "torch", "compute_type": None,
                        "bleu": 39.37},
              "ctranslate2": {"beam_size": 5, "alpha": 1.2, "stopping": "fairseq", "engine": "ctranslate2",
                              "compute_type": "int8", "bleu": 39.39}}
    report = tmp_path / "tune.json"
    settings = {k: v for k, v in points[chosen_engine].items() if k != "bleu"}
    report.write_text(json.dumps({"chosen": settings, "valid_bleu": points[chosen_engine]["bleu"]}))
    (tmp_path / "tune").mkdir(exist_ok=True)
    engines = {e: {"chosen": p} for e, p in points.items()}
    (tmp_path / "tune" / "scores.json").write_text(json.dumps({"engines": engines}))
    assert decoding.tune_detail(report) == tmp_path / "tune" / "scores.json"
    return report


def test_the_engine_and_compute_type_follow_tune_and_each_engine_has_its_own_choice(tmp_path):
    report = tune_reports(tmp_path)
    d = decoding_settings({}, report)
    assert (d.engine, d.compute_type, d.beam_size, d.alpha, d.stopping) == ("ctranslate2", "int8", 5, 1.2, "fairseq")
    assert d.applied_to(DecodingConfig()) == DecodingConfig(beam_size=5, alpha=1.2, stopping="fairseq",
                                                            engine="ctranslate2", compute_type="int8")
    assert decoding_settings({"compute_type": "float32"}, report).compute_type == "float32"   # a value wins
    # evaluate.engine torch: torch's own chosen point (its alpha is GNMT's), no compute type
    d = decoding_settings({"engine": "torch"}, report)
    assert d.as_dict() == {"beam_size": 4, "alpha": 1.5, "stopping": "exact", "engine": "torch", "compute_type": None,
                           "beam_size_from": "tune", "alpha_from": "tune", "stopping_from": "tune",
                           "engine_from": "params", "compute_type_from": "params"}
    assert decoding_settings({"engine": "torch", "alpha": 0.6}, report).alpha == 0.6
    # the other way round: tune chose torch, evaluate asks for CTranslate2
    d = decoding_settings({"engine": "ctranslate2"}, tune_reports(tmp_path, "torch"))
    assert (d.engine, d.compute_type, d.beam_size, d.alpha, d.stopping) == ("ctranslate2", "int8", 5, 1.2, "fairseq")


def test_settings_that_cannot_decode_together_are_one_line_errors(tmp_path):
    report = tune_reports(tmp_path)
    with pytest.raises(ParamsError, match=r"^evaluate: engine ctranslate2 \(tune\), stopping exact \(params\) cannot "
                                          "decode together: stopping exact is our search's rule"):
        decoding_settings({"stopping": "exact"}, report)
    torch_report = tune_reports(tmp_path, "torch")
    with pytest.raises(ParamsError, match="^evaluate.compute_type int8 is CTranslate2's, but the engine is torch "
                                          r"\(from tune\)"):
        decoding_settings({"compute_type": "int8"}, torch_report)
    (tmp_path / "tune" / "scores.json").write_text(json.dumps({"engines": {"torch": {}}}))
    with pytest.raises(ParamsError, match="^evaluate.engine ctranslate2 is not the tune stage's choice .torch. and "
                                          ".*scores.json holds no choice of its own for it: set evaluate.beam_size"):
        decoding_settings({"engine": "ctranslate2"}, torch_report)
    # every setting given: nothing read (torch needs no compute type)
    given = {"beam_size": 2, "alpha": 0.6, "stopping": "exact", "engine": "torch"}
    assert decoding_settings(given, tmp_path / "missing.json").compute_type is None


def test_a_missing_report_is_tune_report_missing_a_corrupt_one_a_params_error(tmp_path):
    given = {"beam_size": 5, "alpha": 0.6, "stopping": "exact", "engine": "torch"}
    assert decoding_settings(given, tmp_path / "missing.json").alpha_from == "params"   # not read
    with pytest.raises(TuneReportMissing, match="missing.json does not exist: evaluate.stopping null means"):
        decoding_settings({**given, "stopping": None}, tmp_path / "missing.json")
    report = tmp_path / "tune.json"
    for corrupt in ("{not json", "[]", json.dumps({"chosen": {"beam_size": 4, "alpha": 1.5}}),
                    json.dumps({"chosen": {"beam_size": 4, "alpha": None, "stopping": "exact"}}),
                    json.dumps({"chosen": {"beam_size": 4, "alpha": 1.5, "stopping": "soon"}}),
                    json.dumps({"chosen": {"beam_size": 4, "alpha": 1.5, "stopping": "fairseq",
                                           "engine": "ctranslate2", "compute_type": None}}),
                    json.dumps({"chosen": {"beam_size": 4, "alpha": 1.5, "stopping": "exact",
                                           "engine": "ctranslate2", "compute_type": "int8"}})):
        report.write_text(corrupt)
        with pytest.raises(ParamsError) as err:
            decoding_settings({**given, "alpha": None}, report)
        assert not isinstance(err.value, TuneReportMissing)
        assert "holds no valid choice" in str(err.value) and "\n" not in str(err.value)
