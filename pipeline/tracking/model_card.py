"""The model card of a registered version (``register_version``): its description, which the MLflow
UI shows, says what the model is, what it was trained on, how long and on what hardware, its scores
with their sacreBLEU signatures, the decoding settings and where they came from, and its limits;
tags on the version carry the same figures for search (``bleu.test_2016_flickr``, ``preset``, ...).

The tags travel in the request that creates the version: set one by one (``set_model_version_tag``,
MLflow has no batch call for a version's tags) they cost two requests each (the tag and the client's
check that the model is no prompt), ~140 requests for a card on a team's server.

A version is tagged with what makes it that version: the model file's sha256 (``model_sha256``)
and, with the decoding settings, ``identity_sha256``; registering the same bytes from the same run
with the same settings again (a forced re-evaluation, a retry after a lost response) finds that
version (``existing_version``) instead of making an identical second one."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from collections.abc import Mapping
from typing import Any

import mlflow

from pipeline.scoring.reports import LITERATURE_KEY, LITERATURE_LABEL, TEST
from pipeline.tracking.failures import best_effort
from pipeline.tracking.store import client

# What each data set's text is: the card's domain limit. Unknown data sets get a generic line.
DOMAINS = {
    "multi30k": "image captions (Flickr30k photo descriptions): short, literal, present-tense descriptions of "
                "everyday scenes; expect much weaker output on news, dialogue, technical or legal text",
    "wmt14": "news, parliament proceedings and web text (WMT 2014: Europarl, Common Crawl, News Commentary); "
             "weaker on conversational, medical or technical text",
}
DESCRIPTION_LIMIT = 5000   # MLflow's SQL store column for a model version's description
MODEL_SHA_TAG, IDENTITY_TAG = "model_sha256", "identity_sha256"


def identity_tags(model_sha256: str, decoding: Mapping[str, Any]) -> dict[str, str]:
    """The version's identity: the model file's sha256, and the sha256 of it with the decoding
    settings (sorted JSON), so that one tag compares both."""
    settings = json.dumps({"model_sha256": model_sha256, "decoding": dict(decoding)}, sort_keys=True, default=str)
    return {MODEL_SHA_TAG: model_sha256, IDENTITY_TAG: hashlib.sha256(settings.encode()).hexdigest()}


def existing_version(name: str, run_id: str, identity: Mapping[str, str]) -> str | None:
    """The (first) version of ``name`` registered from ``run_id`` with the same identity tags, if any."""
    found = client().search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    same = [int(v.version) for v in found if v.tags.get(IDENTITY_TAG) == identity[IDENTITY_TAG]]
    return str(min(same)) if same else None


def _number(value: Any, digits: int = 0) -> str:
    try:
        return f"{float(value):,.{digits}f}"
    except (TypeError, ValueError):
        return "unknown"


def _plain(value: Any) -> str:
    """A number as a tag value ("1234", "56.7"); "" when there is none."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return ""
    return str(int(number)) if number.is_integer() else f"{number:.1f}"


def _duration(seconds: Any) -> str:
    try:
        s = int(round(float(seconds)))
    except (TypeError, ValueError):
        return "unknown"
    h, rest = divmod(s, 3600)
    return (f"{h} h " if h else "") + f"{rest // 60} min {rest % 60} s"


def scores_of_test_sets(metrics: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The test sets' entries of the evaluate stage's ``reports/evaluate/scores.json`` (its ``test``
    mapping): those with a BLEU score and its signature."""
    tests = metrics.get(TEST) or {}
    return {k: v for k, v in tests.items() if isinstance(v, Mapping) and "bleu" in v and "signature" in v}


def _engine(decoding: Mapping[str, Any], origin: str) -> str:
    """Who decodes, in words: ``CTranslate2 (int8; <origin>)`` or ``our PyTorch search (fp32; <origin>)``;
    versions registered before the engine was a setting decoded with ours."""
    if "engine" not in decoding:
        origin = "registered before the engine was a setting"
    if decoding.get("engine") == "ctranslate2":
        return f"CTranslate2 ({decoding.get('compute_type')}; {origin})"
    return f"our PyTorch search ({decoding.get('precision', 'fp32')}; {origin})"


def model_card(name: str, version: str, run: Any, *, metrics: Mapping[str, Any], decoding: Mapping[str, Any],
               model_config: Mapping[str, Any], corpus_stats: Mapping[str, Any] | None = None,
               updates: int | None = None) -> tuple[str, dict[str, str]]:
    """The model card of a registered version of ``run``'s model: (markdown description, tags).

    Args:
        run: the MLflow run (params, tags and metrics of train, average and evaluate).
        metrics: the evaluate stage's ``reports/evaluate/scores.json`` (``test`` and ``dev`` scores,
            signatures).
        decoding: beam_size, alpha, max_len_b, precision, engine, compute_type (and ``*_from``: where
            each came from).
        model_config: the checkpoint's ``model_config``.
        corpus_stats: ``data/corpus/stats.json`` of the download stage (cleaning counts, sources).
        updates: training updates, when the run lacks ``train/updates`` (runs before it was logged).
    """
    p, t, m = run.data.params, run.data.tags, run.data.metrics
    preset, dataset, pair = p.get("model.preset", "custom"), t.get("dataset", "unknown"), t.get("language_pair", "")
    src, tgt = (pair.split("-") + ["?", "?"])[:2]
    cfg = model_config
    updates = m.get("train/updates", updates)
    epochs = m.get("train/epochs")
    scores = scores_of_test_sets(metrics)
    dev = next(iter((metrics.get("dev") or {}).items()), None)
    # The literature's BLEU (Multi30k): a column of its own where measured, never mixed with sacreBLEU's.
    # A model of the literature's text form: its BLEU *is* that measure (pipeline.scoring.measure), no column twice.
    written = any(v.get("measure") == LITERATURE_KEY for v in scores.values())
    literature = any(LITERATURE_KEY in v for v in scores.values()) and not written
    lit_head, lit_rule = (" BLEU lc.tok (the literature's) |", "---:|") if literature else ("", "")

    def with_ci(v: Mapping[str, Any], key: str) -> str:   # "38.19 ± 0.86": the 95% bootstrap interval
        return f"{v[key]:.2f}" + (f" ± {v[key + '_ci95']:.2f}" if key + "_ci95" in v else "")

    def lit_cell(v: Mapping[str, Any]) -> str:
        return (f" {with_ci(v, LITERATURE_KEY)} |" if LITERATURE_KEY in v else " - |") if literature else ""

    def origin(key: str) -> str:
        where = decoding.get(f"{key}_from") or t.get(f"decoding.{key}_from")
        return {"tune": "tuned on the validation set (reports/tune.json)",
                "params": f"params.yaml evaluate.{key}",
                "fallback": "CTranslate2 could not load where evaluate ran"}.get(where, where or f"evaluate.{key}")

    lines = [
        f"# {name} version {version}", "",
        f"A Transformer (Vaswani et al. 2017) that translates {src} to {tgt}: preset `{preset}`, "
        f"{_number(p.get('derived.parameters'))} parameters, a shared SentencePiece vocabulary of "
        f"{_number(p.get('derived.vocab_size', cfg.get('vocab_size')))} pieces (d_model {cfg.get('d_model')}, "
        f"{cfg.get('n_encoder_layers')}+{cfg.get('n_decoder_layers')} layers, {cfg.get('n_heads')} heads, "
        f"{cfg.get('max_positions')} positions).", "",
        "## Scores", "",
        f"| test set | BLEU | chrF | sentences |{lit_head}", f"|---|---:|---:|---:|{lit_rule}",
        *[f"| {s} | {with_ci(v, 'bleu')} | {v.get('chrf', float('nan')):.2f} | {v.get('sentences', '?')} |"
          f"{lit_cell(v)}"
          for s, v in scores.items()],
        "",
        *[f"- {s}: {'BLEU lc.tok' if written else 'sacreBLEU'} `{v['signature']}`"
          + (f", chrF `{v['chrf_signature']}`" if v.get("chrf_signature") else "") for s, v in scores.items()],
    ]
    if written:
        lines.append("- BLEU is the literature's BLEU lc.tok itself: this model writes lowercased, Moses-tokenized "
                     "text (tokenizer.text_form lc_norm_tok), scored as written against upstream's lc.norm.tok "
                     "references; it has no cased score")
    elif literature:
        lines.append(f"- BLEU lc.tok: {LITERATURE_LABEL}; the measure of published Multi30k results, "
                     "not comparable with sacreBLEU's")
    if any("bleu_ci95" in v for v in scores.values()):
        lines.append("- ±: half-width of the 95% confidence interval from sacreBLEU's bootstrap resampling of the "
                     "test sentences (1000 resamples, seeded)")
    if dev:
        lines.append(f"- validation ({dev[0]}, the development set that chose decoding and promotion): "
                     f"BLEU {dev[1].get('bleu', float('nan')):.2f}"
                     + (f" (BLEU lc.tok {dev[1][LITERATURE_KEY]:.2f}, reported only)"
                        if LITERATURE_KEY in dev[1] and not written else ""))
    lines += [
        "", "## Decoding", "",
        f"Beam size {decoding.get('beam_size')} ({origin('beam_size')}), length penalty alpha "
        f"{decoding.get('alpha')} ({origin('alpha')}), stopping rule {decoding.get('stopping', 'exact')} "
        f"({origin('stopping')}), output up to source length + {decoding.get('max_len_b')} "
        f"pieces, {_engine(decoding, origin('engine'))}. The served model uses these unless a request's "
        "`params` set `beam_size` / `alpha` / `stopping`.",
        "", "## Training data", "",
    ]
    train_split = (corpus_stats or {}).get("splits", {}).get("train", {})
    cleaning = ""
    if train_split:
        dropped = ", ".join(f"{k} {v:,}" for k, v in train_split.get("dropped", {}).items() if v) or "none"
        cleaning = f" of {train_split.get('raw', 0):,} raw (dropped: {dropped})"
    lines.append(f"Data set `{dataset}`, {pair}: {_number(p.get('derived.train_pairs'))} training pairs after "
                 f"cleaning{cleaning}; validation set `{p.get('data.valid_set', '?')}`, test sets "
                 f"{', '.join(f'`{s}`' for s in scores) or 'none'}.")
    hashes = {k.removeprefix("data.md5."): v for k, v in t.items() if k.startswith("data.md5.")}
    if hashes:
        lines.append("Data hashes (dvc.lock md5): " + ", ".join(f"`{k}` {v}" for k, v in sorted(hashes.items())) + ".")
    for source in (corpus_stats or {}).get("sources", [])[:4]:
        lines.append(f"- source {source.get('url')} (sha256 {str(source.get('sha256'))[:16]}...)")
    commit = t.get("git.commit", "unknown")
    used = m.get("average/checkpoints_used")
    averaged = (f"the average of the last {int(used)} checkpoint(s) (average.last_n {p.get('average.last_n', '?')})"
                if used is not None else f"checkpoint average of the last {p.get('average.last_n', '?')}")
    # Lineage of a sweep's winner (its run's sweep tags, pipeline.tracking.sweep_point).
    lineage = ([f"Chosen by the sweep `{t['sweep']}` on validation BLEU: point {t.get('sweep.point', '?')} "
                f"(overrides `{t.get('sweep.overrides', '{}')}`), DVC experiment `{t.get('sweep.experiment', '?')}`."]
               if t.get("sweep") else [])
    lines += [
        "", "## Training", "",
        f"{_number(updates)} updates, {_number(epochs)} complete epochs, {_duration(m.get('time/train_seconds'))} "
        f"of training wall time on {t.get('device', 'unknown')} ({t.get('device.name', 'unknown device')}, "
        f"{t.get('device.processes', '1')} process(es)), torch {t.get('torch.version', 'unknown')}, training "
        f"precision {t.get('train.precision_used', p.get('train.precision', 'unknown'))}; {averaged}. "
        f"MLflow run `{run.info.run_id}` ({run.info.run_name}), git commit "
        f"`{commit[:12]}`{' with local changes' if t.get('git.dirty') == 'true' else ''}.",
        *lineage,
        "", "## Limits", "",
        f"- Domain: {DOMAINS.get(dataset, f'the text of {dataset}; other domains will be translated worse')}.",
        ("- Casing: trained on the Multi30k literature's lowercased, punctuation-normalized, Moses-tokenized text; "
         "the served model prepares input so and answers in lowercase, detokenized." if written else
         "- Casing: trained on cased, untokenized text (never lowercased) and scored cased (sacreBLEU "
         "`case:mixed`); write input with normal casing and punctuation."),
        f"- Length: training sources were at most {p.get('data.max_words', '?')} words "
        + (f"and {t['data.train_src_tokens.max']} pieces (99% within {t['data.train_src_tokens.p99']}); "
           if "data.train_src_tokens.max" in t else "; ")
        + f"the model has {_number(cfg.get('max_positions', 1) - 1)} source positions and longer input is "
          "refused by the served model; quality drops well before that on sentences longer than those seen.",
        f"- One sentence per input: {src} in, {tgt} out; other languages are not recognised.",
    ]
    description = "\n".join(lines) + "\n"
    if len(description) > DESCRIPTION_LIMIT:
        description = description[:DESCRIPTION_LIMIT - 20] + "\n\n(truncated)\n"

    tags = {
        "preset": str(preset), "dataset": dataset, "language_pair": pair,
        "params": str(p.get("derived.parameters", "unknown")), "vocab_size": str(p.get("derived.vocab_size", "")),
        "train_pairs": str(p.get("derived.train_pairs", "")), "train.updates": _plain(updates),
        "train.epochs": _plain(epochs), "train.seconds": _plain(m.get("time/train_seconds")),
        "device": t.get("device", "unknown"), "device.name": t.get("device.name", "unknown"),
        "torch.version": t.get("torch.version", "unknown"), "git.commit": commit,
        "params.hash": t.get("params.hash", ""), "run_name": run.info.run_name or "",
        **{f"decoding.{k}": str(v) for k, v in decoding.items()},
        **{k: t[k] for k in ("sweep", "sweep.point", "sweep.experiment") if t.get(k)},
        **{f"data.md5.{k}": v for k, v in hashes.items()},
    }
    for s, v in scores.items():
        tags.update({f"bleu.{s}": f"{v['bleu']:.2f}",
                     f"{f'{LITERATURE_KEY}.signature' if written else 'sacrebleu'}.{s}": v["signature"]})
        if "chrf" in v:
            tags[f"chrf.{s}"] = f"{v['chrf']:.2f}"
        if LITERATURE_KEY in v:
            tags[f"{LITERATURE_KEY}.{s}"] = f"{v[LITERATURE_KEY]:.2f}"
    if dev:
        tags[f"bleu.dev.{dev[0]}"] = f"{dev[1].get('bleu', float('nan')):.2f}"
    return description, {k: v for k, v in tags.items() if v}


def _card_run(c: Any, run_id: str, card: dict[str, Any]) -> Any:
    """The run the card describes; ``card["updates"]`` filled for runs before ``train/updates`` was logged
    (the last step of the loss curve is the update count)."""
    run = c.get_run(run_id)
    if card.get("updates") is None and "train/updates" not in run.data.metrics:
        history = c.get_metric_history(run_id, "train/loss")
        card["updates"] = max((h.step for h in history), default=None)
    return run


def register_version(name: str, model_uri: str, run_id: str, identity: Mapping[str, str], **card: Any) -> str:
    """Register the logged model ``model_uri`` (of run ``run_id``) as a new version of ``name`` with its
    identity tags (``identity_tags``) and model card (``model_card``'s arguments in ``card``); returns
    the version. The tags go with the version's creation, the description (which names the version)
    right after. The card is best effort: one that cannot be made or written is a warning, and the
    version is registered all the same."""
    c = client()
    run = best_effort("model card", _card_run, c, run_id, card)
    made = run and best_effort("model card", model_card, name, "", run, **card)
    tags = {key: value[:5000] for key, value in made[1].items()} if made else {}
    tags.update(identity)
    with contextlib.redirect_stderr(io.StringIO()):   # MLflow's "Successfully registered" lines: ours say it
        version = str(mlflow.register_model(model_uri, name, tags=tags).version)
    if made:
        description, _ = model_card(name, version, run, **card)
        best_effort("model card", c.update_model_version, name, version, description=description)
    return version
