"""DVC stage ``tune``: choose the decoding engine, its beam size, length penalty alpha and stopping rule,
and CTranslate2's compute type, on the validation set (§6.1: "chosen after experimentation on the
development set"), never on a test set.

Each engine of ``tune.engines`` decodes ``data.valid_set`` (its first ``tune.max_sentences`` sentences;
0 = all) with evaluate's length limit, batch and precision, at every point of its own grid:

- ``torch`` (our search): ``tune.beam_sizes`` x ``tune.alphas`` (GNMT's length penalty) x ``tune.stoppings``;
- ``ctranslate2`` (the export stage's model of the same weights): ``tune.beam_sizes`` x ``tune.ct2_alphas``
  (its own penalty, |Y| ** alpha, so its own grid) with its own stopping rule (``fairseq``), in float32
  (the export's weights as they are); then its chosen point once more in each compute type that
  ``COMPUTE_TYPES`` prefers to float32 (int8).

Greedy search (beam 1) has neither alpha nor stopping rule, so an engine decodes beam 1 once, with
its smallest alpha and the first rule listed.

The rules, in this order:

1. an engine's point: the highest validation BLEU (sacrebleu, to 0.01 as reported; for a model of the
   literature's text form, ``tokenizer.text_form`` ``lc_norm_tok``, ``bleu_lc_tok`` of its hypotheses as
   written, ``pipeline.scoring.measure``, and the reports say ``"measure": "bleu_lc_tok"``); ties go to the
   smaller beam size, then to the smaller alpha, then to fairseq's stopping rule before the exact one
   (the cheaper search, the milder length bonus, the earlier stop);
2. CTranslate2's compute type: the first of ``COMPUTE_TYPES`` (int8, then float32) whose BLEU at
   that point is at least float32's less ``COMPUTE_TOLERANCE`` (0.2; a tie is within);
3. the engine: the first of ``ENGINE_PREFERENCE`` (ctranslate2, the faster on CPU, then torch) whose
   chosen BLEU (at its chosen compute type) is at least torch's less ``ENGINE_TOLERANCE`` (0.3; a tie
   is within). Without torch in ``tune.engines`` nothing holds CTranslate2 to torch: it is chosen, and
   the console says that check was skipped.

Where CTranslate2 cannot decode (not installed, no export, or it cannot load on this device: a CUDA
the wheel does not support) the stage says so in one line and searches torch only, the engine every
caller then falls back to; a compute type it cannot load is skipped with one line. No time enters a
choice.

Writes (docs/metrics.md)

- ``reports/tune.json``, the DVC metric, what ``dvc metrics show`` prints::

    {"chosen": {"beam_size", "alpha", "stopping", "engine", "compute_type"},   # what evaluate's null
                                                    # settings take; compute_type null with torch
     "valid_bleu": <sacreBLEU of the chosen point on data.valid_set>}

- in ``reports/tune/`` (a DVC output): ``scores.json``, the detail (``valid_set``, ``sentences``, the
  ``rule``, ``chosen`` with its BLEU, chrF and length ratio (and, for Multi30k, ``bleu_lc_tok``, the
  literature's BLEU, reported and never choosing, with ``bleu_lc_tok_description``), the sacreBLEU
  ``signature``, ``engines`` (each engine searched: its own ``chosen`` point and BLEU), ``skipped``
  (an engine of tune.engines that could not decode here, and why) and the whole ``grid``: every
  decode's engine, compute type, settings, BLEU, chrF and length ratio); ``<valid_set>.<tgt_lang>``,
  the validation translations of the chosen point, which the evaluate stage reuses; ``run.json``,
  the model's hash and the settings (engine and compute type included) they were decoded with;

and logs ``tune.*`` params, ``valid_bleu``, each engine's, the grid as a table and the decoding
times into the model's MLflow run (found by the model's sha256), which it tags as the run tune
logged into. Times never go into the files: they are DVC outputs, and follow from the model and
params alone.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from pipeline import tracking
from pipeline.config import paths
from pipeline.config.data import DataParams
from pipeline.config.decoding import COMPUTE_TYPES, TUNED, EvaluateParams, TuneParams
from pipeline.config.loader import Sections, load_sections
from pipeline.config.tracking import TrackingParams
from pipeline.data.references import tokenized_references
from pipeline.data.text_files import read_lines
from pipeline.scoring.literature_bleu import literature_score
from pipeline.scoring.measure import Scorer, measure_name, scorer_for
from pipeline.scoring.reports import LITERATURE_KEY, TUNE_DIR, TUNE_RUN, TUNE_SCORES
from pipeline.scoring.sacrebleu_scores import score
from pipeline.serving.ct2_translator import EngineUnavailable
from pipeline.serving.decoding import TUNE_REPORT
from pipeline.serving.engine import AnyTranslator
from pipeline.serving.stage_translator import build_translator, load_averaged, split_files
from pipeline.stages.runner import run_stage
from pipeline.text.names import text_form_of
from transformer.atomic import write_json, write_lines
from transformer.checkpoint import file_sha256

ENGINE_PREFERENCE = ("ctranslate2", "torch")   # CTranslate2 first: 2.8x faster a sentence on CPU (issue #36)
ENGINE_TOLERANCE = 0.3       # BLEU the chosen engine may lose to torch's chosen point
COMPUTE_TOLERANCE = 0.2      # BLEU a compute type may lose to float32 at CTranslate2's chosen point
SEARCHED_IN = "float32"      # CTranslate2's grid: the export's weights as they are
CT2_STOPPING = "fairseq"     # CTranslate2's own rule (pipeline.config.decoding.DecodingConfig)
RULE = ("each engine: highest validation BLEU; ties: the smaller beam size, then the smaller alpha, then the "
        f"fairseq stopping rule before the exact one; CTranslate2's compute type: the first of "
        f"{', '.join(COMPUTE_TYPES)} within {COMPUTE_TOLERANCE} BLEU of float32; the engine: the first of "
        f"{', '.join(ENGINE_PREFERENCE)} within {ENGINE_TOLERANCE} BLEU of torch")
CHEAPER_FIRST = {"fairseq": 0, "exact": 1}   # of two stopping rules, the one that stops sooner
SETTINGS = TUNED                             # a chosen point's settings: reports/tune.json's "chosen"
SCORES = ("bleu", "chrf", "length_ratio")
Point = tuple[int, float, str]               # beam size, alpha, stopping rule
Key = tuple[str, str | None, int, float, str]   # engine, compute type, beam size, alpha, stopping rule


def grid(tune: TuneParams, engine: str = "torch") -> list[Point]:
    """Every (beam size, alpha, stopping rule) of ``engine``'s grid, ascending; beam 1 (greedy: no
    length penalty, no stopping rule) once."""
    alphas = sorted(tune.alphas if engine == "torch" else tune.ct2_alphas)
    stoppings = tune.stoppings if engine == "torch" else [CT2_STOPPING]
    return [(beam, alpha, stopping) for beam in sorted(tune.beam_sizes)
            for alpha in (alphas[:1] if beam == 1 else alphas)
            for stopping in (stoppings[:1] if beam == 1 else stoppings)]


def choose(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Rule 1: the highest BLEU (to 0.01); ties go to the smaller beam size, then the smaller alpha,
    then the stopping rule that stops sooner."""
    return min(points, key=lambda p: (-round(p["bleu"], 2), p["beam_size"], p["alpha"],
                                      CHEAPER_FIRST[p["stopping"]]))


def within(bleu: float, reference: float, tolerance: float) -> bool:
    """``bleu`` at most ``tolerance`` below ``reference`` (both to 0.01: rounded, so that 0.2 is 0.2)."""
    return round(bleu - reference, 2) >= -tolerance


def choose_compute_type(bleus: dict[str, float]) -> str:
    """Rule 2: the first of ``COMPUTE_TYPES`` among ``bleus`` (compute type -> BLEU at CTranslate2's
    chosen point, float32's among them) within ``COMPUTE_TOLERANCE`` of float32's."""
    return next(c for c in COMPUTE_TYPES if c in bleus and within(bleus[c], bleus[SEARCHED_IN], COMPUTE_TOLERANCE))


def choose_engine(bleus: dict[str, float]) -> str:
    """Rule 3: the first of ``ENGINE_PREFERENCE`` among ``bleus`` (engine -> its chosen point's BLEU)
    within ``ENGINE_TOLERANCE`` of torch's; without torch, the first searched (nothing to hold it to)."""
    searched = [e for e in ENGINE_PREFERENCE if e in bleus]
    if "torch" not in bleus:
        return searched[0]
    return next(e for e in searched if within(bleus[e], bleus["torch"], ENGINE_TOLERANCE))


def key(point: dict[str, Any]) -> Key:
    return point["engine"], point["compute_type"], point["beam_size"], point["alpha"], point["stopping"]


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


class Search:
    """The decodes made so far, in order: each one's scores (the report's grid), its translations
    and, apart (the machine's, not the model's), its time in seconds."""

    def __init__(self, sources: list[str], references: list[str], scorer: Scorer = score) -> None:
        self.sources, self.references, self.scorer = sources, references, scorer
        self.grid: list[dict[str, Any]] = []
        self.outputs: dict[Key, list[str]] = {}
        self.times: list[float] = []

    def run(self, translator: AnyTranslator, points: list[Point], engine: str,
            compute_type: str | None = None) -> list[dict[str, Any]]:
        """Decode the sources at every point with ``translator`` (``engine`` at ``compute_type``);
        returns those points' scores."""
        scored = []
        for beam_size, alpha, stopping in points:
            start = time.monotonic()
            hypotheses = translator.translate(self.sources, beam_size, alpha, stopping)
            seconds = time.monotonic() - start
            s = self.scorer(hypotheses, self.references)
            point = {"engine": engine, "compute_type": compute_type, "beam_size": beam_size, "alpha": alpha,
                     "stopping": stopping, **{k: s[k] for k in SCORES}}
            scored.append(point)
            self.outputs[key(point)] = hypotheses
            self.times.append(round(seconds, 2))
            print(f"{engine:<11} {compute_type or '':<7} beam {beam_size}  alpha {alpha:<4g}  stopping {stopping:<7}  "
                  f"BLEU {s['bleu']:6.2f}  chrF {s['chrf']:6.2f}  length ratio {s['length_ratio']:.3f}  "
                  f"({seconds:.1f} s)", flush=True)
        self.grid += scored
        return scored


def describe(point: dict[str, Any]) -> str:
    """``ctranslate2 int8 (beam 4, alpha 1.2, stopping fairseq)``"""
    engine = " ".join(filter(None, (point["engine"], point["compute_type"])))
    return f"{engine} (beam {point['beam_size']}, alpha {point['alpha']:g}, stopping {point['stopping']})"


def search_torch(search: Search, checkpoint: dict[str, Any], params: Sections) -> dict[str, Any]:
    """Torch's grid; returns its chosen point (rule 1)."""
    t = params.tune
    translator = build_translator(checkpoint, params, beam_size=1, alpha=0.0, engine="torch")   # set per call
    points = grid(t)
    print(f"tuning torch: beam sizes {sorted(t.beam_sizes)} x alphas {sorted(t.alphas)} x stopping {t.stoppings}, "
          f"{len(points)} decodes", flush=True)
    return choose(search.run(translator, points, "torch"))


def search_ct2(search: Search, checkpoint: dict[str, Any], params: Sections, translator: AnyTranslator,
               ) -> dict[str, Any]:
    """CTranslate2's grid in float32 (``translator``), then its chosen point in each compute type
    preferred to float32; returns the chosen point at its chosen compute type (rules 1 and 2)."""
    t = params.tune
    points = grid(t, "ctranslate2")
    print(f"tuning ctranslate2 ({SEARCHED_IN}): beam sizes {sorted(t.beam_sizes)} x alphas {sorted(t.ct2_alphas)} "
          f"x stopping {CT2_STOPPING} (its own), {len(points)} decodes", flush=True)
    best = choose(search.run(translator, points, "ctranslate2", SEARCHED_IN))
    by_type = {SEARCHED_IN: best}
    for compute_type in COMPUTE_TYPES[:COMPUTE_TYPES.index(SEARCHED_IN)]:   # those preferred to float32
        try:
            other = build_translator(checkpoint, params, engine="ctranslate2", compute_type=compute_type,
                                     stopping=CT2_STOPPING, fallback=False)
        except EngineUnavailable as err:
            print(f"tune: CTranslate2 {compute_type} skipped: CTranslate2 {err}", flush=True)
            continue
        by_type[compute_type] = search.run(other, [(best["beam_size"], best["alpha"], best["stopping"])],
                                           "ctranslate2", compute_type)[0]
    chosen = choose_compute_type({c: p["bleu"] for c, p in by_type.items()})
    bleus = ", ".join(f"{c} {p['bleu']:.2f}" for c, p in by_type.items())
    print(f"ctranslate2's compute type: {chosen} (BLEU {bleus}; the first of {', '.join(COMPUTE_TYPES)} within "
          f"{COMPUTE_TOLERANCE} of {SEARCHED_IN}'s)", flush=True)
    return by_type[chosen]


def tune(params: Sections) -> dict[str, Any]:
    record_run = tracking.enabled()
    if record_run:
        tracking.check_credentials()   # 401/403: one line and exit 2, before any work
    start_all = time.monotonic()
    data, e, t = params.data, params.evaluate, params.tune
    checkpoint = load_averaged()
    src_file, ref_file = split_files(data.valid_set, "data.valid_set", params)
    sources = read_lines(src_file)
    # The BLEU that chooses: sacreBLEU, or bleu_lc_tok for a model of the literature's text form.
    form = text_form_of(checkpoint, str(paths.AVERAGED_MODEL))
    scorer, references = scorer_for(form, data.valid_set, data.tgt_lang, read_lines(ref_file))
    if t.max_sentences:
        sources, references = sources[:t.max_sentences], references[:t.max_sentences]
    print(f"tuning on {data.valid_set} ({len(sources)} sentences): engines {', '.join(t.engines)}"
          + ("" if form.is_raw else f"; text form {form.name}: {LITERATURE_KEY} chooses"), flush=True)
    engines, skipped, ct2 = list(t.engines), {}, None
    if "ctranslate2" in engines:
        try:
            ct2 = build_translator(checkpoint, params, engine="ctranslate2", compute_type=SEARCHED_IN,
                                   stopping=CT2_STOPPING, fallback=False)
        except EngineUnavailable as err:   # the engine every caller falls back to is searched instead
            print(f"tune: CTranslate2 {err}: searching torch only", flush=True)
            engines, skipped = ["torch"], {"ctranslate2": str(err)}
    search = Search(sources, references, scorer)
    per_engine = {}
    if "torch" in engines:
        per_engine["torch"] = search_torch(search, checkpoint, params)
    if ct2 is not None:
        per_engine["ctranslate2"] = search_ct2(search, checkpoint, params, ct2)
    chosen = per_engine[choose_engine({name: p["bleu"] for name, p in per_engine.items()})]
    seconds = time.monotonic() - start_all
    best = search.outputs[key(chosen)]
    signature = scorer(best, references)["signature"]
    # After the choice: it never ranks (a model of the literature's form was chosen by it: nothing to add).
    measured = {} if form.literature else literature(best, data.valid_set, data.tgt_lang)
    report = {"valid_set": data.valid_set, "sentences": len(sources), "rule": RULE,
              **({"measure": measure_name(form)} if not form.is_raw else {}),
              "chosen": {**{k: chosen[k] for k in (*SETTINGS, *SCORES)},
                         **{k: v for k, v in measured.items() if k == LITERATURE_KEY},
                         **({LITERATURE_KEY: chosen["bleu"]} if form.literature else {})},
              **{k: v for k, v in measured.items() if k != LITERATURE_KEY},
              "signature": signature,
              "engines": {name: {"chosen": {k: p[k] for k in (*SETTINGS, *SCORES)}} for name, p in per_engine.items()},
              "skipped": skipped, "grid": search.grid}
    write_lines(TUNE_DIR / f"{data.valid_set}.{data.tgt_lang}", best)

    model_sha256 = file_sha256(paths.AVERAGED_MODEL)
    write_json(TUNE_SCORES, report)
    write_json(TUNE_REPORT, headline(report))
    write_json(TUNE_RUN, {"model_sha256": model_sha256, "valid_set": data.valid_set, "sentences": len(sources),
                          **{k: chosen[k] for k in SETTINGS},
                          "max_len_b": e.max_len_b, "batch_sentences": e.batch_sentences, "precision": e.precision})
    # Both engines' val BLEU, whichever is chosen (issue #36: the chosen one within 0.3 of torch's).
    print(f"{data.valid_set} BLEU of each engine's choice: "
          + "; ".join(f"{describe(p)} {p['bleu']:.2f}" for p in per_engine.values()), flush=True)
    if "torch" in per_engine:
        held = (f"the first of {', '.join(e for e in ENGINE_PREFERENCE if e in per_engine)} within "
                f"{ENGINE_TOLERANCE} of torch's {per_engine['torch']['bleu']:.2f}")
    else:
        held = "tune.engines lists no torch: the check against torch's BLEU is skipped"
    print(f"chosen: {describe(chosen)}, BLEU {chosen['bleu']:.2f} on {data.valid_set} ({held}) in {seconds:.0f} s",
          flush=True)
    if LITERATURE_KEY in measured:
        print(f"{data.valid_set}: {LITERATURE_KEY} {measured[LITERATURE_KEY]:.2f} with the chosen settings "
              f"(reported, never choosing): {measured[LITERATURE_KEY + '_description']}", flush=True)
    if record_run:
        record(params, chosen, report, model_sha256, seconds, search.times)
    return report


def record(params: Sections, chosen: dict[str, Any], report: dict[str, Any], model_sha256: str, seconds: float,
           times: list[float]) -> None:
    """Log the grid and the choice into the model's run (a child run when ``tune`` params changed), and
    tag it as the run that evaluate logs into."""
    from pipeline.tracking.unsent import deferred
    from pipeline.tracking.unsent.records import tune as sender

    section = {k: v for k, v in params.flat().items() if k.startswith("tune.")}
    section.update({f"tune.chosen_{k}": chosen[k] for k in SETTINGS})
    # Sent now, or kept in the unsent queue while the tracking server is away (pipeline.tracking.unsent.records.tune).
    deferred.submit(sender, {"experiment": params.tracking.experiment, "section": section,
                             "model_sha256": model_sha256, "report": report, "seconds": seconds, "times": times,
                             "timestamp": int(time.time() * 1000)},
                    files={"tune.json": TUNE_REPORT, "scores.json": TUNE_SCORES})


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    tune(load_sections(DataParams, TuneParams, EvaluateParams, TrackingParams))


if __name__ == "__main__":
    run_stage(main)
