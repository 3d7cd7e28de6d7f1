"""DVC stage ``evaluate``: translate every configured test set and the validation set with beam search
(§6.1) and score them with sacrebleu (detokenized BLEU and chrF, with their signatures); draw
attention maps.

Beam size, alpha, stopping rule, engine and compute type are ``evaluate.beam_size`` / ``evaluate.alpha``
/ ``evaluate.stopping`` / ``evaluate.engine`` / ``evaluate.compute_type`` where set, else the tune stage's
choice on the validation set (``reports/tune.json``; ``pipeline.serving.decoding.decoding_settings``);
``reports/metrics.json`` records which (``decoding``). The engine is ``torch`` (our search) or
``ctranslate2`` (the export stage's model of the same weights, at its compute type); where CTranslate2
cannot decode here the stage decodes with torch, says so, and records torch. The validation set's
translations (``reports/translations/<valid_set>.*``, copied from the tune stage when it decoded the
whole set with the same settings and engine) are what the promotion gate judges; the test sets' are
only reported. Attention maps are our model's, over the chosen engine's translations.

A model of the literature's text form (``tokenizer.text_form`` ``lc_norm_tok``, ``pipeline.text.forms``)
writes lowercased, Moses-tokenized text: every ``bleu`` below is then ``bleu_lc_tok`` of its hypotheses as
written against the ``lc.norm.tok`` references (``pipeline.scoring.measure``; the signature says so, and
``scores.json`` has ``"measure": "bleu_lc_tok"``), chrF is lowercased, and no sacreBLEU is reported.

Writes (docs/metrics.md), no time in either (a DVC output follows from the deps and params alone):

- ``reports/metrics.json``, the DVC metric, what ``dvc metrics show`` prints::

    {"test": {<test set>: {"bleu", "bleu_ci95", "chrf"}},   # sacreBLEU (ci95: the half-width of the 95%
                                                   # interval of its bootstrap, 1000 resamples); WMT sets add
                                                   # "bleu_tok_compound_split", Multi30k sets "bleu_lc_tok"
                                                   # (the literature's) and its "bleu_lc_tok_ci95"
     "dev": {<valid_set>: {"bleu", "chrf"}},       # what the promotion gate judges (+ "bleu_lc_tok")
     "decoding": {"beam_size", "alpha", "stopping",    # the settings used, and who decoded:
                  "engine", "compute_type"}}       # torch (compute_type null) or ctranslate2

- ``reports/evaluate/scores.json``, a DVC output: the same keys and every detail, per set
  ``length_ratio``, ``sentences``, the sacreBLEU ``signature`` and ``chrf_signature`` (test sets),
  the paper's BLEU's or the literature's BLEU's description, ``translated_by`` (validation: this stage
  or the tune stage); under ``decoding`` also ``<setting>_from`` (params, tune, or ``fallback`` where the
  engine could not load), ``max_len_b`` and ``precision``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from pipeline import tracking
from pipeline.config import paths
from pipeline.config.data import DataParams
from pipeline.config.decoding import TUNED, EvaluateParams
from pipeline.config.loader import Sections, load_sections
from pipeline.config.tracking import TrackingParams
from pipeline.data.references import tokenized_references
from pipeline.data.text_files import read_lines
from pipeline.scoring.literature_bleu import literature_score
from pipeline.scoring.measure import scorer_for
from pipeline.scoring.paper_bleu import bleu_tok_compound_split
from pipeline.scoring.reports import (
    DECODING,
    DEV,
    EVALUATE_SCORES,
    LITERATURE_KEY,
    TEST,
    TUNE_DIR,
    TUNE_RUN,
    scores_of_dev_sets,
    scores_of_test_sets,
)
from pipeline.scoring.sacrebleu_scores import BOOTSTRAP_RESAMPLES
from pipeline.serving.decoding import ChosenDecoding, decoding_settings
from pipeline.serving.engine import AnyTranslator
from pipeline.serving.stage_translator import build_translator, load_averaged, split_files
from pipeline.serving.translator import Translator
from pipeline.stages.runner import run_stage
from pipeline.text.names import text_form_of
from transformer.atomic import write_json, write_lines
from transformer.checkpoint import file_sha256
from transformer.search import attention_weights

PAPER_KEY = "bleu_tok_compound_split"
# reports/metrics.json's per-set scores and decoding settings; the rest is reports/evaluate/scores.json's.
HEADLINE_SCORES = ("bleu", "bleu_ci95", "chrf", PAPER_KEY, LITERATURE_KEY, f"{LITERATURE_KEY}_ci95")
HEADLINE_DECODING = ("beam_size", "alpha", "stopping", "engine", "compute_type")
FALLBACK = "fallback"   # the engine's source where CTranslate2 could not decode here and torch did


def paper_score(hypotheses: list[str], references: list[str], lang: str) -> dict[str, Any]:
    """The WMT score the paper reports (tokenized BLEU with compound splitting, Table 2), under its own
    name beside sacreBLEU's: the two differ by points and must never be compared with each other."""
    result = bleu_tok_compound_split(hypotheses, references, lang)
    return {PAPER_KEY: round(result.score, 2), f"{PAPER_KEY}_description": result.description}


def literature(hypotheses: list[str], split: str, lang: str, bootstrap: int = 0) -> dict[str, Any]:
    """The literature's BLEU of ``split`` (``bleu_lc_tok``: lowercased, Moses-tokenized, against
    upstream's ``lc.norm.tok`` references of the references stage) and its description; {} where the
    data set publishes no such references. Reported only, never compared with sacreBLEU."""
    found = tokenized_references(split)
    if found is None:
        return {}
    references, url = found
    return literature_score(hypotheses, references, lang, url, bootstrap)


def headline(detail: dict[str, Any]) -> dict[str, Any]:
    """``reports/metrics.json`` from ``reports/evaluate/scores.json``: per set its BLEU and chrF (and
    the paper's or the literature's BLEU where measured), and the decoding settings used."""
    def pick(scores: dict[str, Any]) -> dict[str, Any]:
        return {k: scores[k] for k in HEADLINE_SCORES if k in scores}

    return {TEST: {name: pick(m) for name, m in scores_of_test_sets(detail).items()},
            DEV: {name: pick(m) for name, m in scores_of_dev_sets(detail).items()},
            DECODING: {k: detail[DECODING][k] for k in HEADLINE_DECODING}}


def draw_attention(translator: AnyTranslator, ours: Translator, sources: list[str], count: int,
                   out_dir: Path) -> list[Path]:
    """Heatmaps of the first ``count`` test sentences (fixed, so runs compare): ``translator``'s
    translation (the chosen engine's) with our model's attention over it (teacher-forced, ``ours``)."""
    # Imported here: matplotlib costs ~2.6 s of every evaluate process, needed only when maps are drawn.
    from pipeline.figures.attention_plots import plot_attention

    written = []
    tok = translator.tokenizer
    for i, source in enumerate(sources[:count]):
        src_ids = tok.encode([source])[0]
        hyp_ids = translator.translate_ids([src_ids])[0]
        src = ours.source_tensor([src_ids])
        weights = attention_weights(ours.model, src, hyp_ids)
        src_pieces = [tok.sp.id_to_piece(t) for t in src_ids] + ["</s>"]
        tgt_pieces = ["<s>"] + [tok.sp.id_to_piece(t) for t in hyp_ids]
        written += plot_attention(weights, src_pieces, tgt_pieces, out_dir, f"sentence{i + 1}")
    return written


def tune_record() -> dict[str, Any]:
    """``reports/tune/run.json``: what the tune stage decoded (model hash, settings, sentences) and
    the MLflow run it logged into; {} when there is none."""
    try:
        return json.loads(TUNE_RUN.read_text())
    except (OSError, ValueError):
        return {}


def tuned_translations(params: Sections, decoding: ChosenDecoding, sentences: int,
                       model_sha256: str) -> list[str] | None:
    """The tune stage's translations of the validation set when they are exactly what this stage
    would decode (same model, whole set, same settings); else None."""
    record, e = tune_record(), params.evaluate
    wanted = {"model_sha256": model_sha256, "valid_set": params.data.valid_set, "sentences": sentences,
              **{k: getattr(decoding, k) for k in TUNED}, "max_len_b": e.max_len_b,
              "batch_sentences": e.batch_sentences, "precision": e.precision}
    if any(record.get(k) != v for k, v in wanted.items()):
        return None
    file = TUNE_DIR / f"{params.data.valid_set}.{params.data.tgt_lang}"
    lines = read_lines(file) if file.is_file() else []
    return lines if len(lines) == sentences else None


def evaluate(params: Sections) -> dict[str, Any]:
    record_run = tracking.enabled()
    if record_run:
        tracking.check_credentials()   # 401/403: one line and exit 2, before any work
    start_all = time.monotonic()
    data, e = params.data, params.evaluate
    checkpoint = load_averaged()
    test_files = {t: split_files(t, "data.test_sets", params) for t in data.test_sets}
    valid_files = split_files(data.valid_set, "data.valid_set", params)
    decoding = decoding_settings(e)
    form = text_form_of(checkpoint, str(paths.AVERAGED_MODEL))   # which BLEU scores (pipeline.scoring.measure)
    translator = build_translator(checkpoint, params, **decoding.settings)   # the model and tokenizer checked
    if translator.decoding.engine != decoding.engine:   # CTranslate2 could not decode here (one warning line)
        decoding = ChosenDecoding({**decoding.settings, "engine": "torch", "compute_type": None},
                            {**decoding.sources, "engine": FALLBACK, "compute_type": FALLBACK})
    print(f"decoding: beam {decoding.beam_size} ({decoding.beam_size_from}), alpha {decoding.alpha:g} "
          f"({decoding.alpha_from}), stopping {decoding.stopping} ({decoding.stopping_from}), engine "
          f"{decoding.engine}{f' {decoding.compute_type}' if decoding.compute_type else ''} ({decoding.engine_from})",
          flush=True)
    tests: dict[str, dict[str, Any]] = {}   # scores only: decoding times go to MLflow and the console
    decode_seconds: dict[str, float] = {}
    paths.ATTENTION_DIR.mkdir(parents=True, exist_ok=True)   # a DVC output, even with attention_sentences 0
    for test_set, (src_file, ref_file) in test_files.items():
        sources = read_lines(src_file)
        scorer, references = scorer_for(form, test_set, data.tgt_lang, read_lines(ref_file))
        start = time.monotonic()
        hypotheses = translator.translate(sources)
        seconds = time.monotonic() - start
        write_lines(paths.TRANSLATIONS_DIR / f"{test_set}.{data.tgt_lang}", hypotheses)
        tests[test_set] = {**scorer(hypotheses, references, BOOTSTRAP_RESAMPLES), "sentences": len(sources)}
        decode_seconds[test_set] = seconds
        m = tests[test_set]
        print(f"{test_set}: BLEU {m['bleu']:.2f} ± {m['bleu_ci95']:.2f}  chrF {m['chrf']:.2f}  "
              f"({len(sources)} sentences, {seconds:.0f} s)  {m['signature']}", flush=True)
        if form.literature:   # bleu is bleu_lc_tok already, and there is no other BLEU to measure
            pass
        elif data.dataset.startswith("wmt"):
            tests[test_set].update(paper_score(hypotheses, references, data.tgt_lang))
            print(f"{test_set}: {PAPER_KEY} {tests[test_set][PAPER_KEY]:.2f}, as the paper measured BLEU "
                  f"(not sacreBLEU): {tests[test_set][PAPER_KEY + '_description']}", flush=True)
        if not form.literature:
            tests[test_set].update(literature(hypotheses, test_set, data.tgt_lang, BOOTSTRAP_RESAMPLES))
        if LITERATURE_KEY in tests[test_set] and not form.literature:
            print(f"{test_set}: {LITERATURE_KEY} {tests[test_set][LITERATURE_KEY]:.2f} "
                  f"± {tests[test_set][LITERATURE_KEY + '_ci95']:.2f}, "
                  f"{tests[test_set][LITERATURE_KEY + '_description']}", flush=True)
        if test_set == data.test_sets[0] and e.attention_sentences:
            ours = translator if isinstance(translator, Translator) else build_translator(checkpoint, params,
                                                                                          engine="torch")
            draw_attention(translator, ours, sources, e.attention_sentences, paths.ATTENTION_DIR)

    # The validation set: what the promotion gate compares (never a test set).
    sources = read_lines(valid_files[0])
    scorer, references = scorer_for(form, data.valid_set, data.tgt_lang, read_lines(valid_files[1]))
    start = time.monotonic()
    model_sha256 = file_sha256(paths.AVERAGED_MODEL)
    hypotheses = tuned_translations(params, decoding, len(sources), model_sha256)
    source = "tune" if hypotheses is not None else "evaluate"
    if hypotheses is None:
        hypotheses = translator.translate(sources)
    seconds = time.monotonic() - start
    write_lines(paths.TRANSLATIONS_DIR / f"{data.valid_set}.{data.tgt_lang}", hypotheses)
    scores = scorer(hypotheses, references)   # the signatures are the test sets'
    dev = {**{k: scores[k] for k in ("bleu", "chrf", "length_ratio", "measure") if k in scores},
           "sentences": len(sources),
           "translated_by": source,
           **({LITERATURE_KEY: scores["bleu"]} if form.literature
              else literature(hypotheses, data.valid_set, data.tgt_lang))}
    if source == "evaluate":
        decode_seconds[data.valid_set] = seconds
    print(f"{data.valid_set} (validation): BLEU {dev['bleu']:.2f}  chrF {dev['chrf']:.2f}  ({len(sources)} "
          f"sentences, {'from the tune stage' if source == 'tune' else f'{seconds:.0f} s'})"
          + (f"  {LITERATURE_KEY} {dev[LITERATURE_KEY]:.2f}" if LITERATURE_KEY in dev else ""), flush=True)
    detail = {TEST: tests, DEV: {data.valid_set: dev},
              DECODING: {**decoding.as_dict(), "max_len_b": e.max_len_b, "precision": e.precision}}
    write_json(EVALUATE_SCORES, detail)
    write_json(paths.METRICS, headline(detail))

    if record_run:
        track(params, detail, decoding, time.monotonic() - start_all, model_sha256, decode_seconds)
    return detail


def track(params: Sections, metrics: dict[str, Any], decoding: ChosenDecoding, seconds: float, model_sha256: str,
          decode_seconds: dict[str, float] | None = None) -> None:
    """Log scores (``metrics``: ``reports/evaluate/scores.json``), the decoding settings (tags),
    attention maps, translations and the registered pyfunc model (whose settings carry the beam
    size, alpha, stopping rule, engine and compute type used; with the CTranslate2 export) into the
    run that the tune stage logged into (the model's, or its child), else the model's own run."""
    from pipeline.pyfunc import evaluate_record as record
    from pipeline.tracking.sweep_point import in_sweep
    from pipeline.tracking.unsent import deferred

    section = {k: v for k, v in params.flat().items() if k.startswith("evaluate.")}
    values = {"time/evaluate_seconds": seconds,
              **{f"time/decode_seconds/{name}": t for name, t in (decode_seconds or {}).items()}}
    for test_set, m in scores_of_test_sets(metrics).items():
        values.update({f"test/{test_set}/bleu": m["bleu"], f"test/{test_set}/chrf": m["chrf"]})
        for key in ("bleu_ci95", PAPER_KEY, LITERATURE_KEY, f"{LITERATURE_KEY}_ci95"):
            if key in m:
                values[f"test/{test_set}/{key}"] = m[key]
    for dev_set, m in metrics[DEV].items():
        values.update({f"dev/{dev_set}/bleu": m["bleu"], f"dev/{dev_set}/chrf": m["chrf"]})
        if LITERATURE_KEY in m:   # reported, never ranking: valid_bleu ranks (sacreBLEU; for a model of the
            # literature's text form bleu_lc_tok itself: pipeline.scoring.measure)
            values[f"dev/{dev_set}/{LITERATURE_KEY}"] = m[LITERATURE_KEY]
    # What a sweep ranks runs by: val BLEU with the settings this run's model is registered with.
    values["valid_bleu"] = metrics[DEV][params.data.valid_set]["bleu"]
    # A sweep's point logs its model unregistered: the sweep's winner is registered by `make sweep-apply`.
    registers = "" if in_sweep() else params.tracking.registered_model
    # Sent now, or kept with copies of its files (the model pinned by its sha256) in the unsent queue
    # while the tracking server is away; the registration happens when it is sent.
    files = {"attention": paths.ATTENTION_DIR, "translations": paths.TRANSLATIONS_DIR,
             "params.yaml": Path("params.yaml"), "dvc.lock": Path("dvc.lock"), "metrics.json": paths.METRICS,
             "scores.json": EVALUATE_SCORES,
             record.MODEL: paths.AVERAGED_MODEL, record.TOKENIZER: paths.TOKENIZER_MODEL,
             record.CORPUS_STATS: paths.CORPUS_DIR / "stats.json",
             record.CT2_MODEL: paths.CT2_MODEL}   # the export, carried by the version (its engine, or a later one)
    deferred.submit(record, {"experiment": params.tracking.experiment, "section": section,
                                 "model_sha256": model_sha256,
                                 "tuned": tune_record().get("model_sha256") == model_sha256,
                                 "decoding": decoding.as_dict(), "values": values,
                                 "registered_model": registers,
                                 "timestamp": int(time.time() * 1000)},
                    files=files, pinned={record.MODEL: model_sha256}, registers=registers or None)


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    evaluate(load_sections(DataParams, EvaluateParams, TrackingParams))


if __name__ == "__main__":
    run_stage(main)
