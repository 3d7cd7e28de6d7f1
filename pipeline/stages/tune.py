"""DVC stage ``tune``: choose the beam size, the length penalty alpha and the beam search's stopping rule on
the validation set (§6.1: "chosen after experimentation on the development set"), never on a test set.

Every point of ``tune.beam_sizes`` x ``tune.alphas`` x ``tune.stoppings`` decodes ``data.valid_set``
(its first ``tune.max_sentences`` sentences; 0 = all) with evaluate's length limit, batch and
precision. Greedy search (beam 1) has neither alpha nor stopping rule, so beam 1 is decoded once,
with the smallest alpha and the first rule listed.

The rule: the highest validation BLEU (sacrebleu, to 0.01 as reported); ties go to the smaller
beam size, then to the smaller alpha, then to fairseq's stopping rule before the exact one (the
cheaper search, the milder length bonus, the earlier stop).

Writes (docs/metrics.md)

- ``reports/tune.json``, the DVC metric, what ``dvc metrics show`` prints::

    {"chosen": {"beam_size", "alpha", "stopping"},   # what evaluate's null settings take
     "valid_bleu": <sacreBLEU of the chosen point on data.valid_set>}

- in ``reports/tune/`` (a DVC output): ``scores.json``, the detail (``valid_set``, ``sentences``, the
  ``rule``, ``chosen`` with its BLEU, chrF and length ratio (and, for Multi30k, ``bleu_lc_tok``, the
  literature's BLEU, reported and never choosing, with ``bleu_lc_tok_description``), the sacreBLEU
  ``signature`` and the whole ``grid``: every point's settings, BLEU, chrF and length ratio);
  ``<valid_set>.<tgt_lang>``, the validation translations with the chosen settings, which the
  evaluate stage reuses; ``run.json``, the model's hash and the settings they were decoded with;

and logs ``tune.*`` params, ``valid_bleu``, the grid as a table and the decoding times into the
model's MLflow run (found by the model's sha256), which it tags as the run tune logged into. Times
never go into the files: they are DVC outputs, and follow from the model and params alone.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from pipeline import tracking
from pipeline.config import paths
from pipeline.config.data import DataParams
from pipeline.config.decoding_sections import EvaluateParams, TuneParams
from pipeline.config.loader import Sections, load_sections
from pipeline.config.tracking import TrackingParams
from pipeline.data.references import tokenized_references
from pipeline.data.text_files import read_lines
from pipeline.scoring.literature_bleu import literature_score
from pipeline.scoring.reports import LITERATURE_KEY, TUNE_DIR, TUNE_RUN, TUNE_SCORES
from pipeline.scoring.sacrebleu_scores import score
from pipeline.serving.decoding import TUNE_REPORT
from pipeline.serving.split_decoding import build_translator, load_averaged, split_files
from pipeline.serving.translator import Translator
from pipeline.stages.runner import run_stage
from transformer.atomic import write_json, write_lines
from transformer.checkpoint import file_sha256

RULE = ("highest validation BLEU; ties: the smaller beam size, then the smaller alpha, then the fairseq "
        "stopping rule before the exact one")
CHEAPER_FIRST = {"fairseq": 0, "exact": 1}   # of two stopping rules, the one that stops sooner
SETTINGS = ("beam_size", "alpha", "stopping")   # a grid point's settings: reports/tune.json's "chosen"
Point = tuple[int, float, str]               # beam size, alpha, stopping rule


def grid(tune: TuneParams) -> list[Point]:
    """Every (beam size, alpha, stopping rule), ascending; beam 1 (greedy: no length penalty, no
    stopping rule) once."""
    alphas = sorted(tune.alphas)
    return [(beam, alpha, stopping) for beam in sorted(tune.beam_sizes)
            for alpha in (alphas[:1] if beam == 1 else alphas)
            for stopping in (tune.stoppings[:1] if beam == 1 else tune.stoppings)]


def choose(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The rule: the highest BLEU (to 0.01); ties go to the smaller beam size, then the smaller alpha,
    then the stopping rule that stops sooner."""
    return min(points, key=lambda p: (-round(p["bleu"], 2), p["beam_size"], p["alpha"],
                                      CHEAPER_FIRST[p["stopping"]]))


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """``reports/tune.json`` from ``reports/tune/scores.json``: the chosen settings and their BLEU."""
    return {"chosen": {k: report["chosen"][k] for k in SETTINGS}, "valid_bleu": report["chosen"]["bleu"]}


def literature(hypotheses: list[str], valid_set: str, lang: str) -> dict[str, Any]:
    """The literature's BLEU (``bleu_lc_tok``) of the chosen point's translations of the first
    ``len(hypotheses)`` validation sentences, and its description; {} where the data set has no
    tokenized references. Computed after the choice, for the chosen point only: it never ranks."""
    found = tokenized_references(valid_set)
    if found is None:
        return {}
    references, url = found
    return literature_score(hypotheses, references[:len(hypotheses)], lang, url)


def search(translator: Translator, sources: list[str], references: list[str], points: list[Point],
           ) -> tuple[list[dict[str, Any]], dict[Point, list[str]], list[float]]:
    """Decode ``sources`` at every grid point; returns the points' scores, their translations and,
    apart (the machine's, not the model's), their decoding times in seconds."""
    scored, outputs, times = [], {}, []
    for beam_size, alpha, stopping in points:
        start = time.monotonic()
        hypotheses = translator.translate(sources, beam_size, alpha, stopping)
        seconds = time.monotonic() - start
        s = score(hypotheses, references)
        scored.append({"beam_size": beam_size, "alpha": alpha, "stopping": stopping, "bleu": s["bleu"],
                       "chrf": s["chrf"], "length_ratio": s["length_ratio"]})
        outputs[(beam_size, alpha, stopping)] = hypotheses
        times.append(round(seconds, 2))
        print(f"beam {beam_size}  alpha {alpha:<4g}  stopping {stopping:<7}  BLEU {s['bleu']:6.2f}  "
              f"chrF {s['chrf']:6.2f}  length ratio {s['length_ratio']:.3f}  ({seconds:.1f} s)", flush=True)
    return scored, outputs, times


def tune(params: Sections) -> dict[str, Any]:
    record_run = tracking.enabled()
    start_all = time.monotonic()
    data, e, t = params.data, params.evaluate, params.tune
    checkpoint = load_averaged()
    src_file, ref_file = split_files(data.valid_set, "data.valid_set", params)
    sources, references = read_lines(src_file), read_lines(ref_file)
    if t.max_sentences:
        sources, references = sources[:t.max_sentences], references[:t.max_sentences]
    translator = build_translator(checkpoint, params, beam_size=1, alpha=0.0)   # each grid point's set per call
    pairs = grid(t)
    print(f"tuning on {data.valid_set} ({len(sources)} sentences): beam sizes {sorted(t.beam_sizes)} x alphas "
          f"{sorted(t.alphas)} x stopping {t.stoppings}, {len(pairs)} decodes", flush=True)
    points, outputs, times = search(translator, sources, references, pairs)
    chosen = choose(points)
    seconds = time.monotonic() - start_all
    best = outputs[(chosen["beam_size"], chosen["alpha"], chosen["stopping"])]
    signature = score(best, references)["signature"]
    measured = literature(best, data.valid_set, data.tgt_lang)   # after the choice: it never ranks
    report = {"valid_set": data.valid_set, "sentences": len(sources), "rule": RULE,
              "chosen": {**{k: chosen[k] for k in (*SETTINGS, "bleu", "chrf", "length_ratio")},
                         **{k: v for k, v in measured.items() if k == LITERATURE_KEY}},
              **{k: v for k, v in measured.items() if k != LITERATURE_KEY},
              "signature": signature, "grid": points}
    write_lines(TUNE_DIR / f"{data.valid_set}.{data.tgt_lang}", best)

    model_sha256 = file_sha256(paths.AVERAGED_MODEL)
    write_json(TUNE_SCORES, report)
    write_json(TUNE_REPORT, headline(report))
    write_json(TUNE_RUN, {"model_sha256": model_sha256, "valid_set": data.valid_set, "sentences": len(sources),
                          "beam_size": chosen["beam_size"], "alpha": chosen["alpha"], "stopping": chosen["stopping"],
                          "max_len_b": e.max_len_b, "batch_sentences": e.batch_sentences, "precision": e.precision})
    print(f"chosen: beam {chosen['beam_size']}, alpha {chosen['alpha']:g}, stopping {chosen['stopping']} (BLEU "
          f"{chosen['bleu']:.2f} on {data.valid_set}; {RULE}) in {seconds:.0f} s", flush=True)
    if LITERATURE_KEY in measured:
        print(f"{data.valid_set}: {LITERATURE_KEY} {measured[LITERATURE_KEY]:.2f} with the chosen settings "
              f"(reported, never choosing): {measured[LITERATURE_KEY + '_description']}", flush=True)
    if record_run:
        record(params, chosen, report, model_sha256, seconds, times)
    return report


def record(params: Sections, chosen: dict[str, Any], report: dict[str, Any], model_sha256: str, seconds: float,
           times: list[float]) -> None:
    """Log the grid and the choice into the model's run (a child run when ``tune`` params changed), and
    tag it as the run that evaluate logs into."""
    from pipeline.tracking import deferred
    from pipeline.tracking.records import tune as sender

    section = {k: v for k, v in params.flat().items() if k.startswith("tune.")}
    section.update({"tune.chosen_beam_size": chosen["beam_size"], "tune.chosen_alpha": chosen["alpha"],
                    "tune.chosen_stopping": chosen["stopping"]})
    # Sent now, or kept in the unsent queue while the tracking server is away (pipeline.tracking.records.tune).
    deferred.submit(sender, {"experiment": params.tracking.experiment, "section": section,
                             "model_sha256": model_sha256, "report": report, "seconds": seconds, "times": times,
                             "timestamp": int(time.time() * 1000)},
                    files={"tune.json": TUNE_REPORT, "scores.json": TUNE_SCORES})


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    tune(load_sections(DataParams, TuneParams, EvaluateParams, TrackingParams))


if __name__ == "__main__":
    run_stage(main)
