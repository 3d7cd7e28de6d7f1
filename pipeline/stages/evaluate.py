"""DVC stage 5: translate every configured test set with beam search (§6.1) and score it
with sacrebleu (detokenized BLEU and chrF, with their signatures); draw attention maps."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import sacrebleu
import torch

from pipeline import paths, tracking
from pipeline.attention_plots import plot_attention
from pipeline.io import read_lines, write_json, write_lines
from pipeline.params import Params, ParamsError, load_params, run_stage
from pipeline.translation import Translator
from transformer.checkpoint import CheckpointError, load_checkpoint, model_from_checkpoint
from transformer.precision import default_device
from transformer.search import attention_weights
from transformer.tokenizer import open_tokenizer


def score(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """Corpus BLEU and chrF of detokenized text, sacrebleu's defaults (13a tokenization, cased)."""
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    return {"bleu": round(b.score, 2), "chrf": round(c.score, 2),
            "signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature())}


def load_averaged() -> dict[str, Any]:
    """The averaged model checkpoint (weights, config, the tracking run it belongs to)."""
    for needed in (paths.AVERAGED_MODEL, paths.TOKENIZER_MODEL):
        if not needed.is_file():
            raise ParamsError(f"{needed} does not exist: run the earlier stages first (dvc repro)")
    return load_checkpoint(paths.AVERAGED_MODEL)


def load_translator(params: Params, checkpoint: dict[str, Any], device: torch.device | None = None) -> Translator:
    model = model_from_checkpoint(checkpoint, str(paths.AVERAGED_MODEL)).to(device or default_device())
    try:
        tokenizer = open_tokenizer(paths.TOKENIZER_MODEL)
    except ValueError as err:
        raise ParamsError(str(err)) from None
    if tokenizer.vocab_size != model.config.vocab_size:   # another tokenizer: its ids are not the model's rows
        raise CheckpointError(f"{paths.AVERAGED_MODEL} has a vocabulary of {model.config.vocab_size} but "
                              f"{paths.TOKENIZER_MODEL} has {tokenizer.vocab_size} pieces: the model was trained "
                              "with another tokenizer; rerun the pipeline (dvc repro)")
    e = params.evaluate
    return Translator(model, tokenizer, e.beam_size, e.alpha, e.max_len_b, e.batch_sentences, e.precision)


def draw_attention(translator: Translator, sources: list[str], count: int,
                   out_dir: Path) -> list[Path]:
    """Heatmaps of the first ``count`` test sentences (fixed, so runs compare)."""
    written = []
    tok = translator.tokenizer
    for i, source in enumerate(sources[:count]):
        src_ids = tok.encode([source])[0]
        hyp_ids = translator.translate_ids([src_ids])[0]
        src = translator.source_tensor([src_ids])
        weights = attention_weights(translator.model, src, hyp_ids)
        src_pieces = [tok.sp.id_to_piece(t) for t in src_ids] + ["</s>"]
        tgt_pieces = ["<s>"] + [tok.sp.id_to_piece(t) for t in hyp_ids]
        written += plot_attention(weights, src_pieces, tgt_pieces, out_dir, f"sentence{i + 1}")
    return written


def evaluate(params: Params) -> dict[str, dict[str, Any]]:
    start_all = time.monotonic()
    checkpoint = load_averaged()
    translator = load_translator(params, checkpoint)
    data = params.data
    metrics: dict[str, dict[str, Any]] = {}
    for test_set in data.test_sets:
        src_file, ref_file = paths.corpus_file(test_set, data.src_lang), paths.corpus_file(test_set, data.tgt_lang)
        for f in (src_file, ref_file):
            if not f.is_file():
                raise ParamsError(f"test set {test_set}: {f} does not exist (data.test_sets)")
        sources, references = read_lines(src_file), read_lines(ref_file)
        start = time.monotonic()
        hypotheses = translator.translate(sources)
        seconds = time.monotonic() - start
        write_lines(paths.TRANSLATIONS_DIR / f"{test_set}.{data.tgt_lang}", hypotheses)
        metrics[test_set] = {**score(hypotheses, references), "sentences": len(sources),
                             "decode_seconds": round(seconds, 1)}
        print(f"{test_set}: BLEU {metrics[test_set]['bleu']:.2f}  chrF {metrics[test_set]['chrf']:.2f}  "
              f"({len(sources)} sentences, {seconds:.0f} s)  {metrics[test_set]['signature']}", flush=True)
        if test_set == data.test_sets[0] and params.evaluate.attention_sentences:
            draw_attention(translator, sources, params.evaluate.attention_sentences,
                           paths.ATTENTION_DIR)
    write_json(paths.METRICS, metrics)
    track(params, metrics, time.monotonic() - start_all,
          checkpoint.get("callbacks", {}).get(tracking.RUN_ID_KEY))
    return metrics


def track(params: Params, metrics: dict[str, dict[str, Any]], seconds: float, run_id: str | None) -> None:
    """Log scores, attention maps, translations and the registered pyfunc model into the run."""
    from pipeline.mlflow_model import log_translator

    section = {k: v for k, v in params.flat().items() if k.startswith("evaluate.")}
    run_id = tracking.stage_run(run_id, params.tracking.experiment, section, "evaluate")
    if run_id is None:
        return
    values = {"time/evaluate_seconds": seconds}
    for test_set, m in metrics.items():
        values.update({f"test/{test_set}/bleu": m["bleu"], f"test/{test_set}/chrf": m["chrf"]})
    tracking.log_metrics(run_id, values)
    tracking.log_artifacts(run_id, [paths.ATTENTION_DIR], "attention")
    tracking.log_artifacts(run_id, [paths.TRANSLATIONS_DIR], "translations")
    tracking.log_artifacts(run_id, [Path("params.yaml"), Path("dvc.lock"), paths.METRICS], "run")
    version = tracking.best_effort("model logging", log_translator, run_id, paths.AVERAGED_MODEL,
                             paths.TOKENIZER_MODEL, params.tracking.registered_model,
                             params.evaluate.beam_size, params.evaluate.alpha)
    if version:
        print(f"MLflow: registered model {params.tracking.registered_model!r} version {version} (run {run_id})")
    tracking.finish_run(run_id)


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    evaluate(load_params())


if __name__ == "__main__":
    run_stage(main)
